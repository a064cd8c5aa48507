#include <loom/autograd.h>
#include <loom/checkpoint.h>
#include <loom/dist.h>
#include <loom/lazy.h>
#include <loom/metrics.h>
#include <loom/profiler.h>
#include <loom/trainer.h>

#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <limits>
#include <unistd.h>

namespace loom {
namespace {

// Signals received during fit(): the first stops training after the step in progress (the
// checkpoint is written); a second ends the process at once. Only the async-signal-safe
// write() and _exit() run in the handler. The last good checkpoint is never at risk: a save
// writes "<path>.tmp" and renames it, and fit() removes a .tmp left behind by an exit.
std::atomic<int> g_signals{0};
std::atomic<bool> g_quiet{false};
static_assert(std::atomic<int>::is_always_lock_free);

void say(const char* text, std::size_t size) {
  if (g_quiet) return;
  ssize_t written = ::write(STDERR_FILENO, text, size);
  (void)written;  // nothing to do about a failed message in a signal handler
}

extern "C" void on_stop_signal(int) {
  if (g_signals.fetch_add(1) == 0) {
    static const char first[] = "\nsignal: stopping after this step and writing the checkpoint "
                                "(a second signal exits at once)\n";
    say(first, sizeof first - 1);
    return;
  }
  static const char second[] = "\nsecond signal: exiting now; the last checkpoint written is kept\n";
  say(second, sizeof second - 1);
  ::_exit(130);
}

// Installs SIGINT/SIGTERM handlers for the duration of fit() and restores the old ones.
class StopSignals {
 public:
  explicit StopSignals(bool quiet) {
    g_signals = 0;
    g_quiet = quiet;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  static bool stop_requested() { return g_signals > 0; }

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// Fails at the start, not after an epoch of training, when `path` cannot be written: a
// directory, a missing directory, a read-only place. Creates and removes a probe file beside
// it, as the real write will.
void check_writable(const std::string& option, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string what = option + " '" + path + "'";
  if (fs::is_directory(path, ec)) throw Error(what + ": is a directory, expected a file name");
  fs::path dir = fs::path(path).parent_path();
  if (!dir.empty() && !fs::is_directory(dir, ec))
    throw Error(what + ": the directory '" + dir.string() + "' does not exist");
  if (fs::exists(path, ec) && ::access(path.c_str(), W_OK) != 0)
    throw Error(what + ": cannot be written: " + std::strerror(errno));
  const std::string probe = path + ".probe" + std::to_string(::getpid());
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) throw Error(what + ": cannot create a file there: " + std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

// Whether two paths name one file: the same file if both exist (links included), else the
// same path once made absolute and normal. An empty path is no file.
bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  if (a.empty() || b.empty()) return false;
  std::error_code ec;
  if (fs::equivalent(a, b, ec)) return true;
  const auto ca = fs::weakly_canonical(a, ec);
  if (ec) return a == b;
  const auto cb = fs::weakly_canonical(b, ec);
  if (ec) return a == b;
  return ca == cb;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string format_duration(double s) {
  char buf[32];
  auto t = static_cast<long long>(s);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, t / 60 % 60);
  else std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  return buf;
}

}  // namespace

ExecutionMode parse_mode(const std::string& mode) {
  if (mode == "lazy") return ExecutionMode::Lazy;
  if (mode == "eager") return ExecutionMode::Eager;
  if (mode == "compiled") return ExecutionMode::Compiled;
  throw Error("--mode: expected lazy, eager or compiled, got '" + mode + "'");
}

Trainer::Trainer(std::shared_ptr<nn::Module> model, std::shared_ptr<optim::Optimizer> optimizer,
                 TrainerOptions options)
    : model_(std::move(model)), optimizer_(std::move(optimizer)), options_(std::move(options)) {
  if (!model_ || !optimizer_) throw Error("Trainer: expected a model and an optimizer");
  if (options_.epochs <= 0) throw Error("Trainer: expected epochs >= 1, got " + std::to_string(options_.epochs));
  if (options_.max_steps < 0 || options_.log_every < 0 || options_.eval_every < 0 || options_.checkpoint_every < 0)
    throw Error("Trainer: expected non-negative max_steps, log_every, eval_every and checkpoint_every");
  if (options_.resume && options_.checkpoint.empty())
    throw Error("Trainer: --resume needs a --checkpoint file");
}

Trainer::~Trainer() = default;

std::map<std::string, Tensor> Trainer::eval_step(const data::Batch&) { return {}; }

Tensor Trainer::real_rows(const data::Batch& batch, DType dtype) {
  const int64_t n = batch.size();
  const Device device = batch.tensors.empty() ? Device{} : batch.tensors.begin()->second.device();
  return lt(iota({n}, 0, DType::Int64, device), full({n}, static_cast<double>(batch.valid), DType::Int64, device))
      .to(dtype);
}

void Trainer::check_device(const data::DeviceLoader& loader, const char* which) const {
  const auto params = model_->parameters();
  if (params.empty()) return;
  const Device device = params.front().device();
  for (const auto& p : params)
    if (!(p.device() == device))
      throw Error("Trainer: the model's parameters are on more than one device (" + device_str(device) + " and " +
                  device_str(p.device()) + "); move the model with model->to(device)");
  if (!(loader.device() == device))
    throw Error(std::string("Trainer: the ") + which + " loader delivers batches on " + device_str(loader.device()) +
                ", the model is on " + device_str(device) + "; give the loader DeviceLoaderOptions{.device = " +
                device_str(device) + "}");
}

bool Trainer::logs() const { return !options_.quiet && dist::rank() == 0; }

std::vector<double> Trainer::losses() const {
  std::lock_guard lock(loss_mutex_);
  return losses_;
}

void Trainer::save_checkpoint(const std::string& path) const {
  // The ranks hold the same parameters (and optimizer state, which follows from them and the
  // averaged gradients); rank 0's copy is the checkpoint.
  if (dist::rank() != 0) return;
  Checkpoint ck;
  ck.model = model_->state_dict();
  ck.optimizer = optimizer_->state();
  ck.optimizer_steps = optimizer_->steps();
  ck.step = step_;
  ck.epoch = epoch_;
  ck.batch_in_epoch = batch_in_epoch_;
  ck.batches_per_epoch = batches_per_epoch_;
  ck.processes = dist::world_size();
  ck.seed = options_.seed;
  ck.lr = optimizer_->lr();
  ck.model_name = options_.model_name;
  ck.options = options_.run_options;
  loom::save_checkpoint(path, ck);
}

// A resumed run continues exactly only over the same batches: the checkpoint's run had this
// run's number of processes, epochs of `per_epoch` batches and data order (the seed).
void Trainer::check_resumable(int64_t per_epoch) const {
  const std::string where = "--resume: checkpoint '" + options_.checkpoint + "'";
  const std::string lost = ", so resuming would skip or repeat samples (start a new run instead)";
  if (loaded_processes_ > 0 && loaded_processes_ != dist::world_size())
    throw Error(where + " was written by a run over " + std::to_string(loaded_processes_) +
                " processes, this run has " + std::to_string(dist::world_size()) +
                ": each process's share of the samples differs" + lost);
  // A version 1 file does not say its epochs' length: its position must at least be one.
  const bool same = loaded_per_epoch_ > 0
                        ? loaded_per_epoch_ == per_epoch
                        : batch_in_epoch_ <= per_epoch && step_ == epoch_ * per_epoch + batch_in_epoch_;
  if (!same)
    throw Error(where + " was written by a run with " +
                (loaded_per_epoch_ > 0 ? std::to_string(loaded_per_epoch_) + " batches an epoch"
                                       : "another epoch length (step " + std::to_string(step_) + ", batch " +
                                             std::to_string(batch_in_epoch_) + " of epoch " +
                                             std::to_string(epoch_ + 1) + ")") +
                ", this run has " + std::to_string(per_epoch) + ": the batch size or the dataset changed" + lost);
  if (loaded_seed_ != options_.seed)
    throw Error(where + " was written by a run with seed " + std::to_string(loaded_seed_) + ", this run has seed " +
                std::to_string(options_.seed) + ": its data order differs" + lost);
}

void Trainer::load_checkpoint(const std::string& path) {
  auto ck = loom::load_checkpoint(path);
  if (ck.model_name != options_.model_name)
    throw Error("--resume: checkpoint '" + path + "' is of model '" + ck.model_name + "', this run trains '" +
                options_.model_name + "'");
  try {
    model_->load_state_dict(ck.model);
  } catch (const Error& e) {
    throw Error("--resume: checkpoint '" + path + "' does not fit this model: " + e.what());
  }
  optimizer_->load_state(ck.optimizer, ck.optimizer_steps);
  step_ = ck.step;
  epoch_ = ck.epoch;
  batch_in_epoch_ = ck.batch_in_epoch;
  loaded_seed_ = ck.seed;
  loaded_per_epoch_ = ck.batches_per_epoch;
  loaded_processes_ = ck.processes;
  // The schedule gives the LR of the step; without one, the LR the run had (set by hand).
  if (schedule_) schedule_->set_step(step_);
  else if (ck.lr) optimizer_->set_lr(*ck.lr);
  mark_step();
}

Tensor Trainer::run_step(const data::Batch& batch) {
  optimizer_->zero_grad();
  Tensor loss;
  {
    Autocast precision(options_.precision);
    loss = train_step(batch);
  }
  if (!loss.defined() || loss.numel() != 1)
    throw Error("Trainer: train_step must return a one-element loss, got shape " +
                (loss.defined() ? shape_str(loss.shape()) : std::string("(undefined)")));
  loss.backward();
  if (options_.clip_grad_norm > 0) {
    // Clip the averaged gradients, as one process training on the global batch would.
    optim::reduce_gradients(*optimizer_);
    optim::clip_grad_norm(optimizer_->params(), options_.clip_grad_norm);
    optimizer_->step();
  } else {
    optim::optimizer_step(*optimizer_, /*barrier=*/false);  // the loader's increment marks the step
  }
  return loss;
}

void Trainer::log_step(int64_t step, double loss, double lr) {
  std::lock_guard lock(loss_mutex_);
  if (diverged_) return;  // the steps queued after it: the error is already on its way
  if (!std::isfinite(loss)) {
    // Thrown on the device thread, rethrown by the host's next mark_step (a step or two on):
    // fit() ends with this error instead of training on, and no checkpoint is written from
    // the non-finite parameters that follow.
    diverged_ = true;
    throw Error("step " + std::to_string(step) + ": the training loss is " + fmt::format("{}", loss) +
                "; stopping. Look for NaN or Inf in the data, or lower the learning rate");
  }
  losses_.push_back(loss);
  interval_loss_ += loss;
  ++interval_steps_;
  if (!logs() || options_.log_every == 0 || step % options_.log_every != 0) return;
  double t = now_seconds();
  double rate = interval_steps_ * static_cast<double>(units_per_step_) / std::max(t - interval_start_, 1e-9);
  double eta = total_steps_ > step ? (total_steps_ - step) * (t - interval_start_) / interval_steps_ : 0;
  char line[256];
  std::snprintf(line, sizeof line, "step %lld/%lld  loss %.4f  lr %.3g  %.0f %s/s  eta %s",
                static_cast<long long>(step), static_cast<long long>(total_steps_), interval_loss_ / interval_steps_,
                lr, rate, options_.unit.c_str(), format_duration(eta).c_str());
  static const bool tty = isatty(fileno(stderr));
  if (tty) std::fprintf(stderr, "\r\033[K%s", line);  // one progress line, rewritten
  else spdlog::info("{}", line);
  interval_loss_ = 0;
  interval_steps_ = 0;
  interval_start_ = t;
}

std::map<std::string, double> Trainer::evaluate(data::DeviceLoader& eval) {
  check_device(eval, "evaluation");
  if (dist::is_distributed()) {
    // Buffers (batch-norm running statistics) follow each rank's own batches. Evaluate, and
    // so checkpoint, rank 0's, as PyTorch's DistributedDataParallel does.
    std::vector<Tensor> buffers;
    for (auto& [name, t] : model_->named_buffers()) buffers.push_back(t);
    dist::broadcast_parameters(buffers, 0);
  }
  model_->eval();
  std::map<std::string, Tensor> sums;
  int64_t count = 0;
  // The sums are updated in place, so that in compiled mode the evaluation step is captured
  // and replayed like the training step (the padded last batch is traced: its count of real
  // rows is a guard).
  auto accumulate = [&](const data::Batch& batch) {
    std::map<std::string, Tensor> values;
    {
      Autocast precision(options_.precision);
      values = eval_step(batch);
    }
    for (auto& [name, value] : values) {
      auto v = value.to(DType::Float64);
      auto it = sums.find(name);
      if (it == sums.end()) sums.emplace(name, v + 0.0);  // a tensor of our own, updated in place
      else it->second.assign(it->second + v);
    }
  };
  {
    NoGradGuard no_grad;
    auto compiled = compile(accumulate);
    for (auto& batch : eval) {
      if (options_.mode == ExecutionMode::Compiled) compiled(batch);
      else accumulate(batch);
      count += batch.valid;
    }
  }
  model_->train();
  // Each rank evaluated its shard (or all of the set): sums and counts add up over the ranks.
  std::vector<double> totals{static_cast<double>(count)};
  for (auto& [name, total] : sums) totals.push_back(total.item<double>());
  totals = dist::all_reduce(std::move(totals), dist::ReduceOp::Sum);
  std::map<std::string, double> out;
  std::size_t k = 1;
  for (auto& [name, total] : sums) out[name] = totals[k++] / std::max(totals[0], 1.0);
  return out;
}

void Trainer::fit(data::DeviceLoader& train, data::DeviceLoader* eval) {
  check_device(train, "training");
  if (eval) check_device(*eval, "evaluation");
  StopSignals signals(options_.quiet);
  interrupted_ = false;
  diverged_ = false;
  check_destinations();
  bool found = options_.resume && std::filesystem::exists(options_.checkpoint);
  if (options_.resume && dist::is_distributed()) {
    // Every rank reads the checkpoint that rank 0 wrote, so every rank must see the file.
    auto seen = static_cast<int64_t>(dist::all_reduce(found ? 1.0 : 0.0));
    if (seen != 0 && seen != dist::world_size())
      throw Error("--resume: checkpoint '" + options_.checkpoint + "' exists for " + std::to_string(seen) + " of " +
                  std::to_string(dist::world_size()) + " processes; put it on a filesystem every host sees");
  }
  if (found) {
    load_checkpoint(options_.checkpoint);
    if (logs())
      spdlog::info("resumed from {} at step {} (epoch {}, batch {})", options_.checkpoint, step_, epoch_ + 1,
                   batch_in_epoch_);
  } else if (options_.resume && logs()) {
    spdlog::info("--resume: no checkpoint at {} yet; starting from scratch", options_.checkpoint);
  }
  saved_at_ = found ? step_ : -1;
  int64_t per_epoch = train.batches_per_epoch();
  batches_per_epoch_ = per_epoch;
  if (per_epoch > 0 && options_.epochs > std::numeric_limits<int64_t>::max() / per_epoch)
    throw Error("Trainer: " + std::to_string(options_.epochs) + " epochs of " + std::to_string(per_epoch) +
                " batches are more steps than an int64 counts");
  total_steps_ = options_.epochs * per_epoch;
  if (options_.max_steps > 0) total_steps_ = std::min(total_steps_, options_.max_steps);
  // Only where it trains on: evaluating a checkpoint needs no particular batches.
  if (found && step_ < total_steps_) check_resumable(per_epoch);
  if (step_ >= total_steps_ && logs())
    spdlog::info("nothing left to train: the run is at step {} of its {} ({} epoch{} of {} batches{}); raise the "
                 "epochs or the max steps to train on",
                 step_, total_steps_, options_.epochs, options_.epochs == 1 ? "" : "s", per_epoch,
                 options_.max_steps > 0 ? fmt::format(", at most {} steps", options_.max_steps) : std::string());
  const int64_t first_step = step_;
  if (!options_.profile.empty()) profiler::start();
  units_per_step_ = 0;
  int64_t units_trained = 0;  // by this rank
  double eval_seconds = 0;
  fit_start_ = interval_start_ = now_seconds();
  model_->train();

  // Compiled mode traces the step inside compile(), which marks the step at its exit, and
  // replays it without tracing once it is stable (loom/compile.h).
  auto compiled = compile([this](const data::Batch& batch) { return run_step(batch); });
  int64_t evaluated_at = -1;
  auto run_eval = [&](int64_t epoch) {
    mark_step();
    wait_device_ops();  // the steps still queued are training time, not evaluation time
    double start = now_seconds();
    last_eval_ = evaluate(*eval);
    evaluated_at = step_;
    eval_seconds += now_seconds() - start;
    if (!logs()) return;
    if (isatty(fileno(stderr))) std::fprintf(stderr, "\n");
    std::string line;
    for (auto& [k, v] : last_eval_) line += fmt::format("  {} {:.4f}", k, v);
    spdlog::info("step {} (epoch {}) evaluation:{}", step_, epoch + 1, line);
  };
  bool done = step_ >= total_steps_;
  while (epoch_ < options_.epochs && !done) {
    // Resuming mid-epoch: batches are a pure function of (seed, epoch, index), so starting
    // the epoch at the first batch not trained on gives exactly the uninterrupted sequence
    // (the loader does not read the ones before).
    train.set_epoch(epoch_, batch_in_epoch_);
    int64_t b = batch_in_epoch_;
    for (auto& batch : train) {
      ++b;
      // The progress line's rate is global: the ranks step in lockstep on equal batches.
      units_per_step_ = batch.valid * options_.units_per_sample * dist::world_size();
      units_trained += batch.valid * options_.units_per_sample;
      profiler::Trace span("train_step");
      Tensor loss;
      switch (options_.mode) {
        case ExecutionMode::Lazy: loss = run_step(batch); break;
        case ExecutionMode::Compiled: loss = compiled(batch); break;
        case ExecutionMode::Eager: {
          EagerModeGuard eager(true);
          loss = run_step(batch);
          break;
        }
      }
      // Read the loss once it exists, on the device thread: no transfer in the middle of the
      // step. (Added after the call: a compiled step has marked its step already, so this
      // closure runs after the next barrier, the loader's, right after that step.)
      add_step_closure([this, loss, step = step_ + 1, lr = optimizer_->lr()] {
        log_step(step, loss.item<double>(), lr);
      });
      ++step_;
      if (schedule_) schedule_->step();  // the next step's LR: a new scalar, not a new graph
      batch_in_epoch_ = b;
      done = step_ >= total_steps_;
      // Not on an epoch's last batch: the epoch's end, right after, saves the position that
      // follows it (the next epoch's start), where this one would say "all batches done".
      if (options_.checkpoint_every > 0 && step_ % options_.checkpoint_every == 0 &&
          batch_in_epoch_ < per_epoch)
        save();
      if (eval && options_.eval_every > 0 && step_ % options_.eval_every == 0) run_eval(epoch_);
      // A signal may reach one rank only: all stop at the same step, or the others would wait
      // for its gradients for ever.
      bool stop = StopSignals::stop_requested();
      if (dist::is_distributed()) stop = dist::all_reduce(stop ? 1.0 : 0.0, dist::ReduceOp::Max) > 0;
      if (stop) interrupted_ = true;
      if (interrupted_ || done) break;
    }
    mark_step();
    if (batch_in_epoch_ < per_epoch) break;  // stopped inside the epoch
    // The epoch is complete: a checkpoint from here starts the next one. It is written before
    // the evaluation, so an evaluation that fails loses none of the epoch's training.
    const int64_t finished = epoch_++;
    batch_in_epoch_ = 0;
    save();
    if (eval && options_.eval_every == 0 && !interrupted_) run_eval(finished);  // a signal: stop now
    const double lr = optimizer_->lr();
    on_epoch_end(finished);
    // The hook set the LR the next epoch trains with (a decay on a plateau): saved again, so
    // that a resume from this epoch's end trains with it.
    if (optimizer_->lr() != lr && saved_at_ == step_) {
      saved_at_ = -1;
      save();
    }
    if (interrupted_) break;
  }
  // A signal during the last evaluation or after the last step still means "stop now".
  if (StopSignals::stop_requested()) interrupted_ = true;
  if (eval && evaluated_at != step_ && !interrupted_) run_eval(std::min(epoch_, options_.epochs - 1));
  wait_device_ops();
  if (interrupted_ || done) save();
  if (interrupted_ && logs())
    spdlog::warn("interrupted at step {}; {}", step_,
                 options_.checkpoint.empty() ? std::string("no --checkpoint was given, nothing saved")
                                             : "checkpoint written to " + options_.checkpoint + " (resume with --resume)");
  if (!options_.profile.empty()) {
    profiler::stop();
    // Under mpirun each rank writes its own trace: rank 0 to the path, rank N to the path with
    // ".rankN" before its extension (trace.json, trace.rank1.json, ...).
    std::filesystem::path trace(options_.profile);
    if (dist::rank() != 0)
      trace.replace_filename(trace.stem().string() + ".rank" + std::to_string(dist::rank()) +
                             trace.extension().string());
    profiler::save(trace.string());
    if (logs())
      spdlog::info("profile written to {}{}", options_.profile,
                   dist::world_size() > 1 ? " (the other ranks' beside it, as <name>.rankN<extension>)" : "");
  }
  // Global throughput: what all ranks trained on, over the slowest rank's training time.
  double seconds = now_seconds() - fit_start_;
  double units = dist::all_reduce(static_cast<double>(units_trained));
  double train_seconds = dist::all_reduce(seconds - eval_seconds, dist::ReduceOp::Max);
  if (logs()) log_summary(step_ - first_step, seconds, units / std::max(train_seconds, 1e-9));
}

void Trainer::save() {
  if (options_.checkpoint.empty() || saved_at_ == step_) return;
  mark_step();
  // The save reads every parameter anyway; waiting for the closures too makes a non-finite
  // loss the error reported, rather than the parameters it made non-finite.
  wait_device_ops();
  save_checkpoint(options_.checkpoint);
  saved_at_ = step_;
}

void Trainer::check_destinations() const {
  // No output may replace an input or another output: the file would be lost, or the run
  // would fail at its end (a checkpoint overwritten by the profile).
  const std::string temp = options_.checkpoint.empty() ? "" : checkpoint_temp_path(options_.checkpoint);
  for (const auto& input : options_.inputs) {
    const std::string what = "is a file the run reads; it would be overwritten";
    if (same_file(options_.checkpoint, input)) throw Error("--checkpoint '" + options_.checkpoint + "' " + what);
    if (same_file(temp, input))
      throw Error("--checkpoint '" + options_.checkpoint + "': its temporary file '" + temp + "' " + what);
    if (same_file(options_.profile, input)) throw Error("--profile '" + options_.profile + "' " + what);
  }
  if (same_file(options_.profile, options_.checkpoint))
    throw Error("--profile '" + options_.profile + "' is the checkpoint; give them two files");
  if (same_file(options_.profile, temp))
    throw Error("--profile '" + options_.profile + "' is the checkpoint's temporary file; give another name");
  if (!options_.profile.empty()) check_writable("--profile", options_.profile);
  if (options_.checkpoint.empty() || dist::rank() != 0) return;
  check_writable("--checkpoint", options_.checkpoint);
  // What a run killed while saving left behind (the checkpoint itself is whole).
  const auto stale = checkpoint_temp_path(options_.checkpoint);
  std::error_code ec;
  if (std::filesystem::remove(stale, ec) && logs())
    spdlog::info("removed {}, left by a run that stopped while saving", stale);
}

void Trainer::log_summary(int64_t steps, double seconds, double rate) const {
  if (isatty(fileno(stderr))) std::fprintf(stderr, "\n");
  const char* unit = steps == 1 ? "step" : "steps";
  if (steps == step_) spdlog::info("trained {} {} in {}", steps, unit, format_duration(seconds));
  else spdlog::info("trained {} {} in {} (the run is at step {})", steps, unit, format_duration(seconds), step_);
  // (rate 0: nothing was trained, as when a resume finds the run complete and only evaluates.)
  int world = dist::world_size();
  if (rate > 0 && world > 1)
    spdlog::info("throughput {:.1f} {}/s over {} processes ({:.1f} per process)", rate, options_.unit, world,
                 rate / world);
  else if (rate > 0)
    spdlog::info("throughput {:.1f} {}/s", rate, options_.unit);
  spdlog::info("compiles {} (cache hits {}, captured steps replayed {}), transfers from the device {}, data wait {:.1f}s",
               metrics::counter("UncachedCompile"), metrics::counter("CachedCompile"),
               metrics::counter("CaptureReplay"), metrics::counter("TransferFromDevice"),
               metrics::stat("LoaderWaitTime").total / 1e9);
}

}  // namespace loom
