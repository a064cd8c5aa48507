#include "runtime/cuda/cuda_backend.h"

#include "profiler/track.h"
#include "runtime/cuda/allocator.h"
#include "runtime/cuda/codegen.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_target.h"
#include "runtime/cuda/graph_replay.h"
#include "runtime/cuda/host_pool.h"
#include "runtime/cuda/library_ops.h"
#include "runtime/cuda/nvrtc.h"
#include "runtime/device_queue.h"
#include "runtime/donation.h"
#include "runtime/registry.h"

#include <loom/error.h>
#include <loom/lazy.h>
#include <loom/metrics.h>
#include <loom/profiler.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace loom::runtime::cuda {
namespace {

// A compiled program: its module, the kernel handle of every launch, and what a run needs.
// Runs of one executable may be in flight together, but only the launch thread touches the
// run state, and it finishes queueing one run before it starts the next.
class CudaExecutable final : public Executable {
 public:
  ir::Program program;
  ProgramCode code;
  cudaLibrary_t library = nullptr;
  std::vector<std::vector<cudaKernel_t>> kernels;  // per instruction, per launch
  int* error_word = nullptr;                       // the module's loom_error
  mutable std::vector<std::unique_ptr<LibraryOp>> library_ops;  // made at the first run
  // loom::are_deterministic_algorithms_enabled() when library_ops were made: the conv
  // gradients' algorithms depend on it (library_ops.cpp).
  mutable bool library_deterministic = false;
  mutable std::shared_ptr<Storage> arena;
  mutable std::vector<void*> data;                      // per slot
  mutable std::vector<std::shared_ptr<Storage>> owned;  // per slot
  mutable std::vector<uint8_t> donatable;
  mutable GraphReplay graph;  // launch thread only
  mutable bool ran = false;   // set after the first run (renew_exit_hook)

  ~CudaExecutable() override {
    graph.drop();  // before the kernels it launches are unloaded
    if (library) cudaLibraryUnload(library);
  }
};

// Pinned host words the programs copy their error word into, one per run in flight.
constexpr int kErrorSlots = 256;

// A run's kernel times, while the profiler runs (`on`: profiler::is_running(), read once per
// run, so that nothing is recorded while it is off). Timing events around each instruction's
// work on the compute stream, and an anchor that puts them on the profiler's clock.
struct RunTimes {
  bool on = false;
  cudaEvent_t anchor = nullptr;
  int64_t anchor_ns = 0;            // the profiler's clock when the anchor was queued
  std::vector<const char*> names;   // per timed instruction (ir::kernel_name)
  std::vector<cudaEvent_t> events;  // per timed instruction, before and after its work
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int index) : device_{device_type("cuda"), index}, index_(index) {
    set_device();
    check(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreate");
    allocator_ = std::make_unique<DeviceAllocator>(device_, compute_);
    check(cublasLtCreate(&ctx_.cublaslt), "cublasLtCreate");
    check(cudnnCreate(&ctx_.cudnn), "cudnnCreate");
    check(cudnnSetStream(ctx_.cudnn, compute_), "cudnnSetStream");
    ctx_.stream = compute_;
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
    arch_ = prop.major * 10 + prop.minor;
    check(cudaHostAlloc(reinterpret_cast<void**>(&error_words_), kErrorSlots * sizeof(int),
                        cudaHostAllocDefault),
          "cudaHostAlloc");
  }

  std::shared_ptr<Storage> alloc(std::size_t bytes) override { return allocator_->allocate(bytes); }
  // allocator_->allocate(bytes), a failure naming the instruction (allocate_for, backend.h;
  // in null for a program's arena).
  std::shared_ptr<Storage> allocate_named(const ir::Instr* in, std::size_t bytes) {
    return allocate_for(in, bytes, [this](std::size_t n) { return allocator_->allocate(n); });
  }
  std::shared_ptr<void> alloc_host(std::size_t bytes) override { return host_pool_->allocate(bytes); }
  void empty_cache() override {
    allocator_->empty_cache();
    host_pool_->empty_cache();
  }

  // On the copy stream, so that the copy overlaps the compute stream's kernels (a pageable
  // copy would wait for the whole device): a source inside one of alloc_host's page-locked
  // blocks in one transfer, any other through the pinned staging buffer, in pieces.
  void copy_in(const void* host, Storage& dst, std::size_t bytes) override {
    if (!bytes) return;
    set_device();
    if (host_pool_->contains(host, bytes)) {
      allocator_->wait_until_free(dst, copy_);
      check(cudaMemcpyAsync(dst.data(), host, bytes, cudaMemcpyHostToDevice, copy_),
            "cudaMemcpyAsync (to the device, from a host block)");
      check(cudaStreamSynchronize(copy_), "cudaStreamSynchronize (copy to the device)");
      metrics::increment("TransferToDevicePinned", device_);
      return;
    }
    std::lock_guard lock(staging_mutex_);
    allocator_->wait_until_free(dst, copy_);
    auto* src = static_cast<const char*>(host);
    for (std::size_t done = 0; done < bytes;) {
      const std::size_t n = std::min(bytes - done, kStagingBytes);
      char* stage = staging();
      std::memcpy(stage, src + done, n);
      check(cudaMemcpyAsync(static_cast<char*>(dst.data()) + done, stage, n,
                            cudaMemcpyHostToDevice, copy_),
            "cudaMemcpyAsync (to the device)");
      check(cudaStreamSynchronize(copy_), "cudaStreamSynchronize (copy to the device)");
      done += n;
    }
  }

  void copy_out(const Storage& src, void* host, std::size_t bytes) override {
    if (!bytes) return;
    set_device();
    std::lock_guard lock(staging_mutex_);
    auto* dst = static_cast<char*>(host);
    for (std::size_t done = 0; done < bytes;) {
      const std::size_t n = std::min(bytes - done, kStagingBytes);
      char* stage = staging();
      check(cudaMemcpyAsync(stage, static_cast<const char*>(src.data()) + done, n,
                            cudaMemcpyDeviceToHost, copy_),
            "cudaMemcpyAsync (from the device)");
      check(cudaStreamSynchronize(copy_), "cudaStreamSynchronize (copy from the device)");
      std::memcpy(dst + done, stage, n);
      done += n;
    }
  }

  // Between two CUDA devices (or within one); anything else goes through the host.
  bool copy(const Storage& src, Storage& dst, std::size_t bytes) override {
    if (src.device().type != device_.type) return false;
    if (!bytes) return true;
    set_device();
    allocator_->wait_until_free(dst, copy_);
    if (src.device().index == index_)
      check(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, copy_),
            "cudaMemcpyAsync (device to device)");
    else
      check(cudaMemcpyPeerAsync(dst.data(), index_, src.data(), src.device().index, bytes, copy_),
            "cudaMemcpyPeerAsync");
    check(cudaStreamSynchronize(copy_), "cudaStreamSynchronize (device copy)");
    return true;
  }

  const ir::Target& target() const override { return target_; }

  // Generates the program's CUDA C, compiles it (or finds it in the kernel cache) and loads
  // it, on the calling thread: a compile error reaches the caller of mark_step.
  std::shared_ptr<const Executable> compile(ir::Program program) override {
    set_device();
    auto exe = std::make_shared<CudaExecutable>();
    exe->code = generate_program(program);
    const auto start = std::chrono::steady_clock::now();
    auto cubin = nvrtc::compile(exe->code.source, arch_);
    metrics::record("CudaKernelCompileTime", std::chrono::duration<double, std::nano>(
                                                 std::chrono::steady_clock::now() - start).count());
    check(cudaLibraryLoadData(&exe->library, cubin->data(), nullptr, nullptr, 0, nullptr,
                              nullptr, 0),
          "cudaLibraryLoadData");
    for (const auto& instr : exe->code.instrs) {
      auto& ks = exe->kernels.emplace_back();
      for (const auto& l : instr.launches) {
        cudaKernel_t k = nullptr;
        check(cudaLibraryGetKernel(&k, exe->library, l.entry.c_str()),
              ("cudaLibraryGetKernel(" + l.entry + ")").c_str());
        ks.push_back(k);
      }
    }
    std::size_t word_bytes = 0;
    check(cudaLibraryGetGlobal(reinterpret_cast<void**>(&exe->error_word), &word_bytes,
                               exe->library, "loom_error"),
          "cudaLibraryGetGlobal(loom_error)");
    exe->library_ops.resize(program.instrs.size());
    exe->data.resize(program.num_slots());
    exe->owned.resize(program.num_slots());
    exe->program = std::move(program);
    return exe;
  }

  void execute(std::shared_ptr<const Executable> exe, BufferList inputs,
               BufferList outputs) override {
    launch_.enqueue([this, exe = std::move(exe), inputs = std::move(inputs),
                     outputs = std::move(outputs)]() mutable {
      set_device();
      const auto& e = static_cast<const CudaExecutable&>(*exe);
      std::string error;
      std::vector<std::shared_ptr<Completion>> input_ready;
      for (const auto& b : inputs) input_ready.push_back(b->ready);
      const int slot = next_error_slot_++ % kErrorSlots;
      cudaEvent_t done = event();
      RunTimes times;
      times.on = profiler::is_running();
      const auto start = std::chrono::steady_clock::now();
      try {
        profiler::Trace span("launch");
        run(e, inputs, outputs, slot, times);
        check(cudaEventRecord(done, compute_), "cudaEventRecord");
      } catch (const std::exception& ex) {
        error = ex.what();
      }
      // The first run made its library ops (cuBLASLt, cuDNN), which may have made their
      // libraries' statics: the exit hook goes after them.
      if (!e.ran) e.ran = true, renew_exit_hook();
      // This thread's time per run (binding, library calls, launches or one graph launch),
      // what loom_bench puts against a captured step's time; also while the profiler is
      // off, when runs go as CUDA graphs.
      metrics::record("LaunchThreadTime",
                      static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              std::chrono::steady_clock::now() - start)
                                              .count()));
      // The completion thread signals the outputs' completions and holds no buffer: a result
      // held there until the device finished would be held twice when the next step (queued
      // meanwhile) binds it as an input, and so could not be donated to that step's result
      // (each parameter's update would then take a new buffer at every step). Buffers freed
      // early are safe: the allocator reuses them in stream order.
      std::vector<std::shared_ptr<Completion>> output_ready;
      for (const auto& o : outputs) {
        const auto& r = o->ready;
        if (r && std::find(output_ready.begin(), output_ready.end(), r) == output_ready.end())
          output_ready.push_back(r);
      }
      inputs.clear();
      outputs.clear();
      done_.enqueue([this, exe = std::move(exe), output_ready = std::move(output_ready), done, slot,
                     error = std::move(error), input_ready = std::move(input_ready),
                     times = std::move(times)]() mutable {
        finish(static_cast<const CudaExecutable&>(*exe), output_ready, done, slot,
               std::move(error), input_ready, times);
      });
    });
  }

  void enqueue_callback(std::function<void()> fn) override {
    launch_.enqueue([this, fn = std::move(fn)]() mutable { done_.enqueue(std::move(fn)); });
  }

  void synchronize() override {
    launch_.wait_idle();
    done_.wait_idle();
  }

 private:
  static constexpr std::size_t kStagingBytes = std::size_t{32} << 20;

  static DeviceType device_type(const char* name) { return parse_device(name).type; }
  void set_device() const { check(cudaSetDevice(index_), "cudaSetDevice"); }

  // The pinned staging buffer (kStagingBytes; copies go through it in pieces), made at the
  // first copy. Called under staging_mutex_.
  char* staging() {
    if (!staging_)
      check(cudaHostAlloc(reinterpret_cast<void**>(&staging_), kStagingBytes, cudaHostAllocDefault),
            "cudaHostAlloc (staging)");
    return staging_;
  }

  // An event from the pool: without timing (cheaper to record), or with it, for the profiler.
  cudaEvent_t event(bool timed = false) {
    std::lock_guard lock(events_mutex_);
    auto& pool = timed ? timed_events_ : events_;
    if (!pool.empty()) {
      auto e = pool.back();
      pool.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, timed ? cudaEventDefault : cudaEventDisableTiming),
          "cudaEventCreate");
    return e;
  }

  // The profiler's anchor for a run: an event queued on a stream that runs nothing else, so
  // the GPU stamps it as soon as it sees it, and the profiler's clock read just after
  // cudaEventRecord returns, taken as the time of that stamp. The approximation: the GPU's
  // spans sit off the host's by the gap between the two (microseconds, either way), plus
  // cudaEventElapsedTime's resolution of about half a microsecond.
  void anchor(RunTimes& times) {
    if (!idle_)
      check(cudaStreamCreateWithFlags(&idle_, cudaStreamNonBlocking), "cudaStreamCreate (profiler)");
    times.anchor = event(/*timed=*/true);
    check(cudaEventRecord(times.anchor, idle_), "cudaEventRecord (profiler anchor)");
    times.anchor_ns = profiler::now_ns();
  }

  // A timing event on the compute stream, after the work queued so far.
  void mark(RunTimes& times) {
    times.events.push_back(event(/*timed=*/true));  // back to the pool in finish, recorded or not
    check(cudaEventRecord(times.events.back(), compute_), "cudaEventRecord (profiler)");
  }

  // Queues the run of `e` on the compute stream (the launch thread): binds every slot's
  // address, then launches its instructions one by one or, once its addresses have settled,
  // as one CUDA graph (graph_replay.h).
  void run(const CudaExecutable& e, const BufferList& inputs, const BufferList& outputs,
           int error_slot, RunTimes& times) {
    const auto& p = e.program;
    const auto bind_start = std::chrono::steady_clock::now();
    if (times.on) anchor(times);
    const auto n_in = static_cast<int>(p.inputs.size());
    if (p.arena_bytes > 0 && !e.arena) e.arena = allocate_named(nullptr, static_cast<std::size_t>(p.arena_bytes));
    auto* arena = e.arena ? static_cast<char*>(e.arena->data()) : nullptr;
    input_addresses_.clear();
    for (const auto& b : inputs) input_addresses_.push_back(b->storage ? b->storage->data() : nullptr);
    // Kernel by kernel while profiling, so that each kernel is timed.
    const bool gave_up_before = e.graph.plan.given_up();
    const bool graph = e.graph.plan.begin_run(input_addresses_) && graphs_enabled() && !times.on;
    // Its inputs' addresses kept changing: said as a failed capture is, below.
    if (!gave_up_before && e.graph.plan.given_up()) graph_given_up(e);
    auto fixed = [&](std::size_t slot, std::size_t bytes) {
      return e.graph.fixed(slot, bytes, [this](std::size_t n) { return allocator_->allocate(n); });
    };
    copies_in_.clear();
    copies_out_.clear();
    // The library ops were made under the other setting of use_deterministic_algorithms: they
    // are made again below, as the CPU's kernels read it as they run, and a graph holding
    // their kernels is captured again.
    const bool deterministic = are_deterministic_algorithms_enabled();
    if (deterministic != e.library_deterministic) {
      bool any = false;
      for (auto& op : e.library_ops) {
        any = any || op != nullptr;
        op.reset();
      }
      if (any) e.graph.plan.forget();
      e.library_deterministic = deterministic;
    }
    std::fill(e.data.begin(), e.data.end(), nullptr);
    for (auto& o : e.owned) o.reset();
    e.donatable.assign(static_cast<std::size_t>(n_in), 0);
    for (int i = 0; i < n_in; ++i) {
      const auto& b = inputs[static_cast<std::size_t>(i)];
      // Inputs computed on this device are ordered by the stream; a copied one is ready.
      e.donatable[i] = only_this_run_holds(b);
      e.owned[i] = b->storage;
      e.data[i] = b->storage ? b->storage->data() : nullptr;
      if (graph && e.data[i] && e.graph.plan.moving(static_cast<std::size_t>(i))) {
        // The graph reads a moving input from its fixed buffer; a result donated its own
        // buffer is written into a fixed one and copied there after the graph (below).
        const auto bytes = static_cast<std::size_t>(shape_numel(b->shape)) * dtype_size(b->dtype);
        void* f = fixed(static_cast<std::size_t>(i), bytes);
        copies_in_.push_back({f, e.data[i], bytes});
        e.data[i] = f;
      }
    }
    int donated = 0;
    for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i) {
      const auto& in = p.instrs[static_cast<std::size_t>(i)];
      const auto& code = e.code.instrs[static_cast<std::size_t>(i)];
      const int out_slot = n_in + i;
      if (code.runs == Runs::Nothing) {
        e.data[out_slot] = e.data[in.args[0]];
        e.owned[out_slot] = e.owned[in.args[0]];
        continue;
      }
      if (in.arena_offset >= 0) {
        e.data[out_slot] = arena + in.arena_offset;
      } else {
        const auto bytes = static_cast<std::size_t>(shape_numel(in.shape)) * dtype_size(in.dtype);
        e.owned[out_slot] = take_donor(in, bytes, e.donatable, e.owned);
        if (e.owned[out_slot]) {
          ++donated;
          e.data[out_slot] = e.owned[out_slot]->data();
          if (graph && donor_moves(e, i)) {  // through a fixed buffer into the donor's own
            void* f = fixed(static_cast<std::size_t>(out_slot), bytes);
            copies_out_.push_back({e.data[out_slot], f, bytes});
            e.data[out_slot] = f;
          }
        } else {
          e.owned[out_slot] = allocate_named(&in, bytes);
          e.data[out_slot] = e.owned[out_slot]->data();
          if (graph) {  // a new buffer at every run: the graph writes a fixed one, copied out
            void* f = fixed(static_cast<std::size_t>(out_slot), bytes);
            copies_out_.push_back({e.data[out_slot], f, bytes});
            e.data[out_slot] = f;
          }
        }
      }
      if (code.runs == Runs::Library) {
        auto& made = e.library_ops[static_cast<std::size_t>(i)];
        if (!made) {
          made = make_library_op(p, i, ctx_);
          metrics::increment("CudaLibraryOpMade", device_);
        }
        grow_workspace(made->workspace_bytes());
      }
    }
    // The launch thread's time by part (loom_bench --metrics): binding, then the graph's
    // launch (with any capture), against the copies around it.
    const auto bound = std::chrono::steady_clock::now();
    metrics::record("LaunchBindTime",
                    std::chrono::duration<double, std::nano>(bound - bind_start).count());
    metrics::record("GraphCopiesPerRun",
                    static_cast<double>(copies_in_.size() + copies_out_.size()));
    for (const auto& c : copies_in_)
      check(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, compute_),
            "cudaMemcpyAsync (into a graph's fixed input)");
    bool launched = false;
    if (graph) {
      graph_key_.assign(e.data.begin(), e.data.end());
      graph_key_.push_back(ctx_.workspace);
      const int64_t captures = e.graph.plan.captures();
      const auto graph_start = std::chrono::steady_clock::now();
      launched = e.graph.launch(graph_key_, compute_, capture_stream(),
                                [&](cudaStream_t stream) { launch_all(e, stream, nullptr); });
      metrics::record("GraphLaunchTime", std::chrono::duration<double, std::nano>(
                                             std::chrono::steady_clock::now() - graph_start)
                                             .count());
      if (e.graph.plan.captures() > captures) metrics::increment("CudaGraphCapture", device_);
      if (launched) metrics::increment("CudaGraphLaunch", device_);
      else graph_given_up(e);
    }
    if (!launched) launch_all(e, compute_, times.on ? &times : nullptr);
    for (const auto& c : copies_out_)
      check(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, compute_),
            "cudaMemcpyAsync (out of a graph's fixed result)");
    // The module's error word to this run's pinned slot, then cleared for the next run.
    check(cudaMemcpyAsync(&error_words_[error_slot], e.error_word, sizeof(int),
                          cudaMemcpyDeviceToHost, compute_),
          "cudaMemcpyAsync (error word)");
    check(cudaMemsetAsync(e.error_word, 0, sizeof(int), compute_), "cudaMemsetAsync");
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      const int slot = p.outputs[k];
      if (!e.owned[slot]) throw Error("cuda: a program output lives in the arena");
      outputs[k]->storage = e.owned[slot];
    }
    for (auto& o : e.owned) o.reset();
    metrics::increment("DonatedBuffer", device_, donated);
  }

  // Whether the donor that instruction i's result just took (take_donor: the input whose
  // storage e.owned now holds at i's slot too) is a moving input, which the graph reads from a
  // fixed buffer.
  static bool donor_moves(const CudaExecutable& e, int i) {
    const auto n_in = static_cast<int>(e.program.inputs.size());
    const auto* taken = e.owned[static_cast<std::size_t>(n_in + i)].get();
    for (int d : e.program.instrs[static_cast<std::size_t>(i)].donors)
      if (e.owned[static_cast<std::size_t>(d)].get() == taken)
        return e.graph.plan.moving(static_cast<std::size_t>(d));
    return false;
  }

  // `e` has just given up its CUDA graph (a capture failed, or its inputs' addresses kept
  // changing): counted, and said once per device on stderr with the reason.
  void graph_given_up(const CudaExecutable& e) {
    metrics::increment("CudaGraphGivenUp", device_);
    std::call_once(graph_warning_, [&] {
      std::fprintf(stderr, "loom: %s: a program runs kernel by kernel, without a CUDA graph: %s\n",
                   device_str(device_).c_str(), e.graph.plan.why_given_up().c_str());
    });
  }

  // Queues every instruction of the bound run `e` on `stream` (the compute stream, or the
  // capture stream while a graph is recorded), timing each one when `times` is given.
  void launch_all(const CudaExecutable& e, cudaStream_t stream, RunTimes* times) {
    const auto& p = e.program;
    const auto n_in = static_cast<int>(p.inputs.size());
    struct StreamScope {  // the library ops queue on ctx_.stream
      LibraryContext& ctx;
      cudaStream_t saved;
      ~StreamScope() { ctx.stream = saved; }
    } scope{ctx_, ctx_.stream};
    ctx_.stream = stream;
    std::vector<void*> params;
    std::vector<const void*> addresses;
    for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i) {
      const auto& in = p.instrs[static_cast<std::size_t>(i)];
      const auto& code = e.code.instrs[static_cast<std::size_t>(i)];
      if (code.runs == Runs::Nothing) continue;
      const int out_slot = n_in + i;
      addresses.assign(1, e.data[out_slot]);
      for (int a : in.args) addresses.push_back(e.data[a]);
      LibraryOp* op = code.runs == Runs::Library ? e.library_ops[static_cast<std::size_t>(i)].get() : nullptr;
      params.clear();
      for (auto& a : addresses) params.push_back(&a);
      // Timed from just before the instruction's first call on the stream to just after its last.
      if (times) {
        times->names.push_back(ir::kernel_name(in));
        mark(*times);
      }
      if (op) op->run(ctx_, std::span(addresses).subspan(1), e.data[out_slot]);
      for (std::size_t l = 0; l < code.launches.size(); ++l) {
        const auto& launch = code.launches[l];
        check(cudaLaunchKernel(reinterpret_cast<const void*>(e.kernels[static_cast<std::size_t>(i)][l]),
                               dim3(static_cast<unsigned>(launch.blocks)),
                               dim3(static_cast<unsigned>(launch.threads)), params.data(),
                               static_cast<std::size_t>(launch.shared_bytes), stream),
              ("cudaLaunchKernel(" + launch.entry + ")").c_str());
      }
      if (times) mark(*times);
    }
  }

  // The stream graphs are recorded on: no other thread queues work there (graph_replay.h).
  cudaStream_t capture_stream() {
    if (!capture_)
      check(cudaStreamCreateWithFlags(&capture_, cudaStreamNonBlocking), "cudaStreamCreate (graph capture)");
    return capture_;
  }

  void grow_workspace(std::size_t bytes) {
    if (bytes <= ctx_.workspace_bytes) return;
    // The old workspace goes back to the pool; stream order keeps its last user safe.
    workspace_ = allocator_->allocate(bytes);
    ctx_.workspace = workspace_->data();
    ctx_.workspace_bytes = workspace_->bytes();
  }

  // On the completion thread, once the run's work is done: one span per timed instruction on
  // the device's stream track ("cuda:0 stream"), placed on the profiler's clock by the anchor.
  void add_kernel_spans(const RunTimes& times) {
    check(cudaEventSynchronize(times.anchor), "cudaEventSynchronize (profiler anchor)");
    const int row = profiler::track(device_str(device_) + " stream");
    auto at = [&](cudaEvent_t ev) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, times.anchor, ev), "cudaEventElapsedTime");
      return times.anchor_ns + static_cast<int64_t>(static_cast<double>(ms) * 1e6);
    };
    for (std::size_t k = 0; k < times.names.size(); ++k) {
      // The stream runs one instruction after another, but each run has its own anchor, off by
      // microseconds: a span starts no earlier than the track's last one ended, so the track's
      // spans never overlap.
      const int64_t start = std::max(at(times.events[2 * k]), last_kernel_end_ns_);
      const int64_t end = std::max(at(times.events[2 * k + 1]), start);
      profiler::add_span(row, times.names[k], start, end);
      last_kernel_end_ns_ = end;
    }
  }

  // On the completion thread: waits for the program's kernels, then signals its outputs.
  void finish(const CudaExecutable& e, const std::vector<std::shared_ptr<Completion>>& output_ready,
              cudaEvent_t done, int slot, std::string error,
              const std::vector<std::shared_ptr<Completion>>& input_ready, const RunTimes& times) {
    set_device();
    if (error.empty()) {
      profiler::Trace span("execute");
      const auto status = cudaEventSynchronize(done);
      if (status != cudaSuccess) {
        cudaGetLastError();
        error = std::string("cuda: the step failed on the device: ") + cudaGetErrorString(status);
      } else if (const int word = error_words_[slot]; word != 0) {
        const auto& in = e.program.instrs[static_cast<std::size_t>(word - 1)];
        error = std::string(ir::op_name(in.op)) + " (instruction " + std::to_string(word - 1) +
                " of the program, on " + device_str(device_) + "): an index out of range";
      } else if (times.on) {
        try {
          add_kernel_spans(times);
        } catch (const std::exception& ex) {
          error = ex.what();
        }
      }
    }
    for (const auto& r : input_ready)
      if (error.empty() && r)
        if (auto failed = r->wait(); !failed.empty())
          error = input_failed(failed);
    {
      std::lock_guard lock(events_mutex_);
      events_.push_back(done);
      if (times.anchor) timed_events_.push_back(times.anchor);
      timed_events_.insert(timed_events_.end(), times.events.begin(), times.events.end());
    }
    metrics::increment("ExecuteProgram", device_);
    for (const auto& c : output_ready) {
      if (error.empty()) c->set_done();
      else c->set_failed(error);
    }
  }

  Device device_;
  int index_;
  int arch_ = 0;
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  std::unique_ptr<DeviceAllocator> allocator_;
  std::shared_ptr<HostPool> host_pool_ = std::make_shared<HostPool>(index_);
  LibraryContext ctx_;
  std::shared_ptr<Storage> workspace_;
  std::mutex staging_mutex_;
  char* staging_ = nullptr;
  std::mutex events_mutex_;
  std::vector<cudaEvent_t> events_;
  std::vector<cudaEvent_t> timed_events_;  // the profiler's
  cudaStream_t idle_ = nullptr;             // the profiler's anchors only (launch thread)
  int64_t last_kernel_end_ns_ = 0;          // the stream track's last span (completion thread)
  int* error_words_ = nullptr;
  // Graph replay (graph_replay.h), launch thread only: the capture stream, and per run the
  // input addresses, the copies through fixed buffers and the graph's key.
  struct DeviceCopy {
    void* dst;
    const void* src;
    std::size_t bytes;
  };
  cudaStream_t capture_ = nullptr;
  std::vector<const void*> input_addresses_, graph_key_;
  std::vector<DeviceCopy> copies_in_, copies_out_;
  std::once_flag graph_warning_;
  int next_error_slot_ = 0;
  const ir::Target target_ = cuda_target();
  // Declared last: destroyed first, so their threads stop before the state they use goes.
  DeviceQueue done_;
  DeviceQueue launch_;
};

}  // namespace

int device_count(std::string* why_none) {
  int n = 0;
  const auto status = cudaGetDeviceCount(&n);
  if (status == cudaSuccess && n > 0) return n;
  cudaGetLastError();
  if (why_none) {
    if (status == cudaSuccess || status == cudaErrorNoDevice)
      *why_none = "no CUDA GPU found";
    else if (status == cudaErrorInsufficientDriver)
      *why_none = "no NVIDIA driver found (libcuda.so), or one older than this CUDA runtime needs";
    else
      *why_none = std::string("the CUDA runtime reports: ") + cudaGetErrorString(status);
  }
  return 0;
}

std::unique_ptr<Backend> make_cuda_backend(int index) { return std::make_unique<CudaBackend>(index); }

}  // namespace loom::runtime::cuda
