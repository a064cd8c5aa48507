#include "recipe_util.h"

#include <loom/dist.h>
#include <loom/openmp.h>

#include <spdlog/spdlog.h>

#include <tbb/global_control.h>

#include <cmath>
#include <iostream>

namespace loom::recipes {

bool parse_options(int argc, char** argv, const po::options_description& options, po::variables_map& vm,
                   const std::string& usage) {
  try {
    po::store(po::parse_command_line(argc, argv, options), vm);
  } catch (const po::error& e) {
    throw Error(std::string(e.what()) + " (see --help)");
  }
  if (vm.count("help")) {
    if (dist::rank() == 0) std::cout << usage << "\n\n" << options << '\n';
    return false;
  }
  try {
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error(std::string(e.what()) + " (see --help)");
  }
  return true;
}

std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    if (i) s += ' ';
    s += argv[i];
  }
  return s;
}

void require_positive(const char* option, double value, bool allow_zero) {
  if (!std::isfinite(value))
    throw Error(fmt::format("--{}: expected a finite value, got {}", option, value));
  if (value > 0 || (allow_zero && value == 0)) return;
  throw Error(fmt::format("--{}: expected a {} value, got {}", option, allow_zero ? "non-negative" : "positive", value));
}

void require_range(const char* option, double value, double low, double high) {
  if (std::isfinite(value) && value >= low && value < high) return;
  throw Error(fmt::format("--{}: expected a value in [{}, {}), got {}", option, low, high, value));
}

void set_threads(int threads) {
  if (threads < 0) throw Error("--threads: expected 0 (all cores) or a positive count, got " + std::to_string(threads));
  if (threads == 0) return;
  static std::unique_ptr<tbb::global_control> control;
  control = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, threads);
}

std::shared_ptr<optim::Schedule> make_schedule(const std::string& name, optim::Optimizer& opt, double lr,
                                               int64_t warmup, int64_t total_steps) {
  if (name == "cosine")
    return std::make_shared<optim::CosineSchedule>(
        opt, optim::CosineOptions{.base_lr = lr, .warmup_steps = std::min(warmup, total_steps - 1),
                                  .total_steps = std::max<int64_t>(total_steps, 1)});
  if (name == "step")
    return std::make_shared<optim::StepSchedule>(
        opt, optim::StepOptions{.base_lr = lr, .step_size = std::max<int64_t>(total_steps / 3, 1), .gamma = 0.1,
                                .warmup_steps = std::min(warmup, total_steps)});
  if (name == "constant")
    return std::make_shared<optim::WarmupSchedule>(
        opt, optim::WarmupOptions{.base_lr = lr, .warmup_steps = std::max<int64_t>(warmup, 1)});
  throw Error("--schedule: expected cosine, step or constant, got '" + name + "'");
}

void add_run_options(po::options_description& o, RunDefaults d) {
  // clang-format off
  o.add_options()
    ("device", po::value<std::string>()->default_value("cpu"), "where to train: cpu, cuda or cuda:N (under mpirun, cuda without an index is cuda:<local rank>)")
    ("mode", po::value<std::string>()->default_value("lazy"), "execution: lazy (mark_step per batch), compiled (compile(step)) or eager")
    ("precision", po::value<std::string>()->default_value("fp32"), "fp32, or bf16: matmuls and convolutions in bfloat16 (autocast), weights, optimizer state and checkpoints in float32")
    ("threads", po::value<int>()->default_value(0), "intra-op threads (0: all cores)")
    ("loader-threads", po::value<int>()->default_value(d.loader_threads), "data loader worker threads")
    ("prefetch", po::value<int>()->default_value(4), "batches prepared ahead of the device")
    ("eval-every", po::value<int64_t>()->default_value(d.eval_every), "steps between evaluations (0: after each epoch)")
    ("log-every", po::value<int64_t>()->default_value(50), "steps between log lines")
    ("checkpoint", po::value<std::string>()->default_value(""), "checkpoint file, written after each epoch, on --checkpoint-every, at the end and on SIGINT/SIGTERM")
    ("checkpoint-every", po::value<int64_t>()->default_value(d.checkpoint_every), "steps between checkpoints (0: after each epoch only)")
    ("resume", po::bool_switch(), "continue from --checkpoint if it exists")
    ("seed", po::value<int64_t>()->default_value(0), "seed of initialisation, data order, augmentation and sampling")
    ("synthetic", po::bool_switch(), "train on fake data of the usual shape (benchmarking; no --data needed)")
    ("profile", po::value<std::string>()->default_value(""), "write a Chrome trace of the run to this file");
  // clang-format on
}

TrainerOptions run_options(const po::variables_map& vm, int argc, char** argv) {
  require_positive("loader-threads", vm["loader-threads"].as<int>());
  require_positive("prefetch", vm["prefetch"].as<int>());
  for (const char* k : {"eval-every", "log-every", "checkpoint-every"})
    require_positive(k, static_cast<double>(vm[k].as<int64_t>()), true);
  set_threads(vm["threads"].as<int>());
  TrainerOptions t;
  t.mode = parse_mode(vm["mode"].as<std::string>());
  try {
    t.precision = parse_precision(vm["precision"].as<std::string>());
  } catch (const Error& e) {
    throw Error(std::string("--precision: ") + e.what());
  }
  t.log_every = vm["log-every"].as<int64_t>();
  t.eval_every = vm["eval-every"].as<int64_t>();
  t.checkpoint = vm["checkpoint"].as<std::string>();
  t.checkpoint_every = vm["checkpoint-every"].as<int64_t>();
  if (t.checkpoint_every > 0 && t.checkpoint.empty() && !vm["checkpoint-every"].defaulted())
    throw Error("--checkpoint-every: needs --checkpoint FILE to write the checkpoints to");
  if (vm["synthetic"].as<bool>() && !vm["data"].defaulted())
    throw Error("--synthetic trains on generated data and reads no --data; give one of the two");
  t.resume = vm["resume"].as<bool>();
  t.profile = vm["profile"].as<std::string>();
  t.seed = vm["seed"].as<int64_t>();
  t.run_options = command_line(argc, argv);
  return t;
}

Device run_device(const po::variables_map& vm) {
  const auto text = vm["device"].as<std::string>();
  try {
    Device d = parse_device(text);
    // One GPU per process on a host: mpirun's ranks on one host take its devices in turn.
    if (text.find(':') == std::string::npos && dist::is_distributed() && !(d == Device{}))
      if (const int count = device_count(d.type); count > 0) d.index = dist::local_rank() % count;
    (void)from_vector<float>({0.0f}, {1}, d);  // the device starts here, or says why it cannot
    return d;
  } catch (const Error& e) {
    std::string_view why = e.what();
    if (why.starts_with("device: ")) why.remove_prefix(8);  // the option names it already
    throw Error("--device: " + std::string(why));
  }
}

namespace {

class EvalShard final : public data::Sampler {
 public:
  EvalShard(int64_t n, int64_t rank, int64_t world) : n_(n), rank_(rank), world_(world) {}
  std::vector<int64_t> indices(int64_t) const override {
    std::vector<int64_t> out;
    for (int64_t i = rank_; i < n_; i += world_) out.push_back(i);
    return out;
  }
  int64_t size() const override { return n_ > rank_ ? (n_ - rank_ + world_ - 1) / world_ : 0; }

 private:
  int64_t n_, rank_, world_;
};

}  // namespace

std::shared_ptr<const data::Sampler> eval_shard(int64_t n) {
  if (!dist::is_distributed()) return nullptr;
  if (n < dist::world_size())
    throw Error("evaluation: " + std::to_string(n) + " samples cannot be shared by " +
                std::to_string(dist::world_size()) + " processes (each needs at least one)");
  return std::make_shared<EvalShard>(n, dist::rank(), dist::world_size());
}

int run_main(const char* program, int (*body)(int, char**), int argc, char** argv) {
  openmp_passive_or_reexec(argc, argv);  // before MPI or any thread starts
  try {
    dist::init();
  } catch (const std::exception& e) {  // MPI did not start: there is no job to abort
    std::cerr << program << ": error: " << e.what() << '\n';
    return 1;
  }
  if (dist::rank() != 0) spdlog::set_level(spdlog::level::warn);
  try {
    return body(argc, argv);
  } catch (const std::exception& e) {
    std::string line = std::string(program) + ": error: " + e.what();
    if (dist::is_distributed()) dist::abort(line);
    std::cerr << line << '\n';
    return 1;
  }
}

}  // namespace loom::recipes
