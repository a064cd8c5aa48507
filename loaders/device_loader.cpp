// DeviceLoader: an epoch is run by tbb::parallel_pipeline on a background thread, inside a
// task_arena of the configured thread count, feeding a bounded queue that the consumer's
// iterator pops; the pipeline stops while that queue is full (produce()).
//
//   indices (serial_in_order) → read + transform + collate (parallel) → to device
//   (serial_in_order) → BoundedQueue → Iterator
//
// Collation writes each field straight into host memory of the loader's device
// (loom::alloc_host: page-locked blocks on a GPU), and the transfer copies from there, so the
// bytes are copied once on the host and once to the device, the latter in one transfer on a
// GPU's copy stream. A batch's blocks go back to the device when its transfer is done, so at
// most `prefetch` batches hold blocks, and a GPU's pool hands the same blocks out again.
//
// Order: the serial_in_order stages see batches in the order the first stage made them, and a
// batch's content depends only on (dataset, seed, epoch, its indices), so output never depends
// on the thread count. Errors travel inside the token to the last stage, which delivers every
// earlier batch first, then the error, then stops the input stage.
#include "bounded_queue.h"
#include "collate.h"

#include <loom/data/loader.h>
#include <loom/lazy.h>
#include <loom/metrics.h>
#include <loom/profiler.h>

#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_pipeline.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <optional>
#include <thread>
#include <utility>
#include <variant>

namespace loom::data {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The message of the exception being handled.
std::string current_what() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

// The exception being handled, as a loom::Error prefixed with `where`, the original nested.
std::exception_ptr wrap_current(const std::string& where) {
  const std::string what = current_what();
  try {
    std::throw_with_nested(Error(where + ": " + what));
  } catch (...) {
    return std::current_exception();
  }
}

std::exception_ptr wrap(std::exception_ptr error, const std::string& where) {
  try {
    std::rethrow_exception(error);
  } catch (...) {
    return wrap_current(where);
  }
}

std::string index_list(const std::vector<int64_t>& indices) {
  std::string s;
  for (std::size_t i = 0; i < indices.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(indices[i]);
  if (indices.size() > 8) s += ", ... (" + std::to_string(indices.size()) + " samples)";
  return s;
}

// One field of a collated batch, in host memory of the loader's device.
struct HostField {
  std::string name;
  HostDType dtype;
  Shape shape;                   // the batch dimension first
  std::shared_ptr<void> memory;  // from loom::alloc_host; null when the field has no elements

  std::string str() const { return host_dtype_name(dtype) + shape_str(shape); }
};

// One batch travelling through the pipeline.
struct Work {
  int64_t number = 0;
  std::vector<int64_t> indices;
  int64_t valid = 0;
  std::vector<HostField> fields;  // collated, in name order
  std::exception_ptr error;
};
using Item = std::variant<Batch, std::exception_ptr>;

// Whether this thread has its name in profiles ("loader", or "loader worker").
thread_local bool named_for_profiler = false;

// One epoch in progress.
struct Run {
  int64_t epoch;
  uint64_t id;
  std::vector<std::vector<int64_t>> batches;
  // The batches in flight, owned here: a cancelled parallel_pipeline drops its tokens without
  // destroying them, so tokens are plain pointers into this (slot k: batch k, made by the input
  // stage, freed by the last stage or with the Run).
  std::vector<std::unique_ptr<Work>> works;
  int64_t valid_last;  // rows of the last batch that are not padding
  std::size_t first = 0;  // the first batch made (resuming inside an epoch)
  detail::BoundedQueue<Item> queue;
  tbb::task_group_context context{tbb::task_group_context::isolated};
  std::atomic<bool> stop{false};
  std::thread thread;
  Clock::time_point start = Clock::now();
  bool accounted = false;  // iterate time added to the stats

  Run(int64_t epoch, uint64_t id, std::vector<std::vector<int64_t>> batches, int64_t valid_last, int prefetch)
      : epoch(epoch), id(id), batches(std::move(batches)), works(this->batches.size()), valid_last(valid_last),
        queue(static_cast<std::size_t>(prefetch)) {}

  // Stops the pipeline at once and joins its thread; queued batches are dropped.
  void cancel() {
    stop = true;
    context.cancel_group_execution();
    queue.cancel();
    if (thread.joinable()) thread.join();
  }
  ~Run() { cancel(); }
};

}  // namespace

const Tensor& Batch::operator[](const std::string& field) const {
  auto it = tensors.find(field);
  if (it == tensors.end()) {
    std::string names;
    for (const auto& [name, t] : tensors) names += (names.empty() ? "" : ", ") + name;
    throw Error("Batch: no field '" + field + "' (fields: " + (names.empty() ? "none" : names) + ")");
  }
  return it->second;
}

struct DeviceLoader::Iterator::State {
  std::shared_ptr<Dataset> dataset;
  DeviceLoaderOptions options;
  std::vector<Transform> transforms;
  std::shared_ptr<const Sampler> sampler;
  int threads = 1;
  std::unique_ptr<tbb::task_arena> arena;
  int64_t next_epoch = 0;
  int64_t next_first_batch = 0;  // set_epoch(e, k): the next run's first batch
  uint64_t next_run = 1;
  std::unique_ptr<Run> run;
  LoaderStats stats;

  ~State() { end_run(); }

  void end_run() {
    if (!run) return;
    run->cancel();
    account(*run);
    run.reset();
  }

  void account(Run& r) {
    if (r.accounted) return;
    r.accounted = true;
    stats.iterate_seconds += seconds_since(r.start);
  }

  void start_run();
  void produce(Run& r);
  void prepare(Run& r, Work& w) const;
  void deliver(Run& r, Work& w) const;
  // Pops the next batch of run `id`; nullptr at its end. Rethrows a worker's error.
  std::unique_ptr<Batch> next(uint64_t id);
};

void DeviceLoader::Iterator::State::start_run() {
  end_run();
  const int64_t epoch = next_epoch;
  dataset->set_epoch(epoch);
  auto order = sampler->indices(epoch);
  // A custom sampler's indices are checked here, once an epoch, so that no dataset's get() is
  // ever asked for a sample it does not have.
  const int64_t size = dataset->size();
  for (int64_t i : order)
    if (i < 0 || i >= size)
      throw Error("DeviceLoader: the sampler gave index " + std::to_string(i) + " for a dataset of " +
                  std::to_string(size) + " samples (" + dataset->source() + ")");
  auto batches = make_batches(order, options.batch_size, options.last_batch);
  const auto n = static_cast<int64_t>(order.size());
  const int64_t rem = n % options.batch_size;
  const int64_t valid_last = rem == 0 || options.last_batch != LastBatch::Pad ? -1 : rem;
  ++next_epoch;  // only once the epoch can start: a sampler's error leaves it to retry
  run = std::make_unique<Run>(epoch, next_run++, std::move(batches), valid_last, options.prefetch);
  run->first = static_cast<std::size_t>(std::min<int64_t>(std::exchange(next_first_batch, 0),
                                                          static_cast<int64_t>(run->batches.size())));
  Run* r = run.get();
  r->thread = std::thread([this, r] {
    profiler::set_thread_name("loader");
    named_for_profiler = true;
    produce(*r);
  });
}

// No stage ever waits for the consumer: a TBB worker blocked in a full queue's push is a
// worker that the step's kernels (on the same cores, from TBB's one pool) run without, for as
// long as the training step takes. So the input stage issues a batch only while the queue
// has room for it beside the batches in flight, and otherwise ends the pipeline; the loader's
// own thread then waits for room (outside the arena) and starts it again. With a consumer
// that is behind, each batch it takes starts a pipeline of one.
void DeviceLoader::Iterator::State::produce(Run& r) {
  std::size_t next = r.first;
  std::atomic<std::size_t> in_flight{0};  // issued and not yet in the queue
  try {
    while (!r.stop && next < r.batches.size() && r.queue.wait_for_room()) {
      arena->execute([&] {
        tbb::parallel_pipeline(
            static_cast<std::size_t>(options.prefetch),
            tbb::make_filter<void, Work*>(
                tbb::filter_mode::serial_in_order,
                [&](tbb::flow_control& fc) -> Work* {
                  if (r.stop || next == r.batches.size() || in_flight + r.queue.size() >= r.queue.capacity()) {
                    fc.stop();
                    return nullptr;
                  }
                  ++in_flight;
                  auto& w = r.works[next];
                  w = std::make_unique<Work>();
                  w->number = static_cast<int64_t>(next);
                  w->indices = std::move(r.batches[next]);
                  const bool last = next + 1 == r.batches.size();
                  w->valid = last && r.valid_last >= 0 ? r.valid_last : static_cast<int64_t>(w->indices.size());
                  ++next;
                  return w.get();
                }) &
                tbb::make_filter<Work*, Work*>(tbb::filter_mode::parallel,
                                               [&](Work* w) {
                                                 if (!r.stop) prepare(r, *w);
                                                 return w;
                                               }) &
                tbb::make_filter<Work*, void>(tbb::filter_mode::serial_in_order,
                                              [&](Work* w) {
                                                deliver(r, *w);
                                                r.works[static_cast<std::size_t>(w->number)].reset();
                                                --in_flight;  // after the push, so the room is never overstated
                                              }),
            r.context);
      });
    }
  } catch (...) {
    // Stage bodies catch their own errors; this is the pipeline itself failing.
    if (!r.stop) r.queue.push(wrap_current("DeviceLoader: epoch " + std::to_string(r.epoch)));
  }
  r.queue.finish();
}

void DeviceLoader::Iterator::State::prepare(Run& r, Work& w) const {
  if (!named_for_profiler) {  // a TBB worker that joined this arena
    profiler::set_thread_name("loader worker");
    named_for_profiler = true;
  }
  const auto start = Clock::now();
  const std::string where = "epoch " + std::to_string(r.epoch) + ", batch " + std::to_string(w.number);
  std::vector<Example> examples;
  try {
    profiler::Trace span("loader_read");
    examples = dataset->get_batch(w.indices);
    if (examples.size() != w.indices.size())
      throw Error("get_batch returned " + std::to_string(examples.size()) + " examples for " +
                  std::to_string(w.indices.size()) + " indices");
  } catch (...) {
    w.error = wrap_current("DeviceLoader: reading samples " + index_list(w.indices) + " of '" +
                           dataset->source() + "' (" + where + ")");
    return;
  }
  if (!transforms.empty()) {
    profiler::Trace span("loader_transform");
    std::vector<std::exception_ptr> errors(examples.size());
    tbb::parallel_for(std::size_t{0}, examples.size(), [&](std::size_t i) {
      try {
        const SampleContext ctx{options.seed, r.epoch, w.indices[i]};
        for (const auto& t : transforms) t(examples[i], ctx);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
    for (std::size_t i = 0; i < errors.size(); ++i)
      if (errors[i]) {
        w.error = wrap(errors[i], "DeviceLoader: sample " + std::to_string(w.indices[i]) + " of '" +
                                      dataset->source() + "' (" + where + "): transform failed");
        return;
      }
  }
  try {
    profiler::Trace span("loader_collate");
    detail::collate_into(examples, [&](const std::string& name, HostDType dtype, const Shape& shape,
                                       std::size_t bytes) {
      auto memory = bytes > 0 ? alloc_host(bytes, options.device) : nullptr;
      auto* data = static_cast<unsigned char*>(memory.get());
      w.fields.push_back(HostField{name, dtype, shape, std::move(memory)});
      return data;
    }, w.indices);
    for (const auto& f : w.fields)
      if (!device_dtype(f.dtype))
        throw Error("field '" + f.name + "' is " + f.str() +
                    ", which loom tensors do not hold; convert it with to_float(\"" + f.name +
                    "\") or cast(\"" + f.name + "\", HostDType::Int64)");
  } catch (...) {
    w.error = wrap_current("DeviceLoader: samples " + index_list(w.indices) + " of '" + dataset->source() +
                           "' (" + where + ")");
    return;
  }
  metrics::record("LoaderPrepareTime", std::chrono::duration<double, std::nano>(Clock::now() - start).count());
}

void DeviceLoader::Iterator::State::deliver(Run& r, Work& w) const {
  if (r.stop) return;
  if (w.error) {
    r.stop = true;  // the input stage makes nothing more; in-flight batches are dropped here
    r.queue.push(w.error);
    return;
  }
  Batch b;
  try {
    profiler::Trace span("loader_transfer");
    for (const auto& f : w.fields) {
      if (shape_numel(f.shape) == 0)
        throw Error("field '" + f.name + "' is empty (" + f.str() + "); loom tensors need positive sizes");
      b.tensors.emplace(f.name, from_host(f.memory.get(), *device_dtype(f.dtype), f.shape, options.device));
    }
  } catch (...) {
    r.stop = true;
    r.queue.push(wrap_current("DeviceLoader: transferring samples " + index_list(w.indices) + " of '" +
                              dataset->source() + "' (epoch " + std::to_string(r.epoch) + ", batch " +
                              std::to_string(w.number) + ")"));
    return;
  }
  b.indices = std::move(w.indices);
  b.valid = w.valid;
  b.index = w.number;
  b.epoch = r.epoch;
  w.fields.clear();  // the copies are done: the blocks go back before the batch is queued
  if (!r.queue.push(std::move(b))) r.stop = true;
}

std::unique_ptr<Batch> DeviceLoader::Iterator::State::next(uint64_t id) {
  if (!run || run->id != id) return nullptr;  // a newer begin() ended this iteration
  const auto start = Clock::now();
  std::optional<Item> item;
  {
    profiler::Trace span("loader_wait");
    item = run->queue.pop();
  }
  const double waited = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
  metrics::record("LoaderWaitTime", waited);
  stats.wait_seconds += waited * 1e-9;
  if (!item) {
    if (run->thread.joinable()) run->thread.join();
    account(*run);
    return nullptr;
  }
  if (auto* error = std::get_if<std::exception_ptr>(&*item)) {
    std::exception_ptr e = *error;
    end_run();
    std::rethrow_exception(e);
  }
  auto batch = std::make_unique<Batch>(std::move(std::get<Batch>(*item)));
  metrics::increment("LoaderBatches");
  metrics::increment("LoaderSamples", batch->size());
  ++stats.batches;
  stats.samples += batch->size();
  return batch;
}

DeviceLoader::Iterator::Iterator(State* state, uint64_t run, std::source_location site)
    : state_(state), run_(run), site_(site) {}

DeviceLoader::Iterator::~Iterator() {
  if (state_ && state_->run && state_->run->id == run_) state_->end_run();
}

DeviceLoader::Iterator::Iterator(Iterator&& other) noexcept
    : state_(std::exchange(other.state_, nullptr)), run_(other.run_), batch_(std::move(other.batch_)),
      site_(other.site_) {}

DeviceLoader::Iterator& DeviceLoader::Iterator::operator=(Iterator&& other) noexcept {
  if (this != &other) {
    if (state_ && state_->run && state_->run->id == run_) state_->end_run();
    state_ = std::exchange(other.state_, nullptr);
    run_ = other.run_;
    batch_ = std::move(other.batch_);
    site_ = other.site_;
  }
  return *this;
}

DeviceLoader::Iterator& DeviceLoader::Iterator::operator++() {
  if (!batch_ || !state_) return *this;
  if (state_->options.mark_step) mark_step(site_);
  batch_.reset();
  batch_ = state_->next(run_);
  return *this;
}

DeviceLoader::DeviceLoader(std::shared_ptr<Dataset> dataset, DeviceLoaderOptions options,
                           std::vector<Transform> transforms)
    : state_(std::make_unique<Iterator::State>()) {
  auto& st = *state_;
  if (!dataset) throw Error("DeviceLoader: expected a dataset, got nullptr");
  const std::string who = "DeviceLoader ('" + dataset->source() + "')";
  if (options.batch_size < 1) throw Error(who + ": expected batch_size >= 1, got " + std::to_string(options.batch_size));
  if (options.threads < 0) throw Error(who + ": expected threads >= 0, got " + std::to_string(options.threads));
  if (options.prefetch < 1) throw Error(who + ": expected prefetch >= 1, got " + std::to_string(options.prefetch));
  for (const auto& t : transforms)
    if (!t) throw Error(who + ": got an empty transform");
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size)
    throw Error(who + ": expected 0 <= rank < world_size, got rank " + std::to_string(options.rank) +
                " of world_size " + std::to_string(options.world_size));
  st.sampler = options.sampler;
  if (!st.sampler) {
    const int64_t n = dataset->size();
    if (options.world_size > 1 || options.rank != 0)
      st.sampler = std::make_shared<DistributedSampler>(
          n, options.rank, options.world_size,
          DistributedSamplerOptions{.shuffle = options.shuffle, .seed = options.seed, .drop_last = false});
    else if (options.shuffle)
      st.sampler = std::make_shared<RandomSampler>(n, options.seed);
    else
      st.sampler = std::make_shared<SequentialSampler>(n);
  }
  // More threads than cores only oversubscribes (and TBB refuses the extra workers anyway).
  const int cores = tbb::info::default_concurrency();
  st.threads = options.threads > 0 ? std::min(options.threads, cores) : cores;
  st.arena = std::make_unique<tbb::task_arena>(st.threads);
  st.dataset = std::move(dataset);
  st.options = std::move(options);
  st.transforms = std::move(transforms);
  if (batches_per_epoch() == 0)
    throw Error(who + ": " + std::to_string(st.sampler->size()) + " samples per epoch make no batch of " +
                std::to_string(st.options.batch_size) + " with " + last_batch_name(st.options.last_batch));
}

DeviceLoader::~DeviceLoader() = default;
DeviceLoader::DeviceLoader(DeviceLoader&&) noexcept = default;
DeviceLoader& DeviceLoader::operator=(DeviceLoader&&) noexcept = default;

DeviceLoader::Iterator DeviceLoader::begin(std::source_location site) {
  state_->start_run();
  Iterator it(state_.get(), state_->run->id, site);
  it.batch_ = state_->next(it.run_);
  return it;
}

int64_t DeviceLoader::epoch() const { return state_->next_epoch; }

void DeviceLoader::set_epoch(int64_t epoch) {
  if (epoch < 0) throw Error("DeviceLoader::set_epoch: expected epoch >= 0, got " + std::to_string(epoch));
  state_->next_epoch = epoch;
  state_->next_first_batch = 0;
}

void DeviceLoader::set_epoch(int64_t epoch, int64_t first_batch) {
  if (first_batch < 0)
    throw Error("DeviceLoader::set_epoch: expected a first batch >= 0, got " + std::to_string(first_batch));
  if (first_batch > batches_per_epoch())
    throw Error("DeviceLoader::set_epoch: batch " + std::to_string(first_batch) + " is past the epoch's " +
                std::to_string(batches_per_epoch()) + " batches");
  set_epoch(epoch);
  state_->next_first_batch = first_batch;
}

int64_t DeviceLoader::batches_per_epoch() const {
  const int64_t n = state_->sampler->size();
  const int64_t b = state_->options.batch_size;
  return state_->options.last_batch == LastBatch::Drop ? n / b : (n + b - 1) / b;
}

const Dataset& DeviceLoader::dataset() const { return *state_->dataset; }

Device DeviceLoader::device() const { return state_->options.device; }

LoaderStats DeviceLoader::stats() const {
  LoaderStats s = state_->stats;
  if (state_->run && !state_->run->accounted) s.iterate_seconds += seconds_since(state_->run->start);
  return s;
}

void DeviceLoader::reset_stats() {
  state_->stats = {};
  // A pass in progress counts from now; a finished one (accounted) no longer counts at all.
  if (state_->run && !state_->run->accounted) state_->run->start = Clock::now();
}

}  // namespace loom::data
