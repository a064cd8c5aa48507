// dist_tiny_train: a tiny classifier trained by the Trainer, for tests/distributed. Run alone with a
// batch of 2B, or under `mpirun -np 2` with B per process: it writes each rank's final
// parameters to <out>.rank<R>.txt so the test can compare them. The model is initialised from
// a different seed on each rank, so the ranks agree only if the optimizer broadcasts rank 0's
// values. --fail-rank/--fail-step/--fail-mode make one rank die (SIGKILL), throw, or receive
// SIGTERM mid-run.
#include "recipe_util.h"

#include <loom/data/loader.h>
#include <loom/dist.h>
#include <loom/lazy.h>
#include <loom/nn/functional.h>
#include <loom/nn/init.h>
#include <loom/nn/layers.h>
#include <loom/trainer.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>

namespace {

using namespace loom;
namespace F = nn::functional;
namespace po = boost::program_options;

struct Failure {
  int64_t rank = -1, step = 0;
  std::string mode;
};

class TinyTrainer : public Trainer {
 public:
  TinyTrainer(std::shared_ptr<nn::Sequential> net, std::shared_ptr<optim::Optimizer> opt, TrainerOptions o,
              Failure failure)
      : Trainer(net, std::move(opt), std::move(o)), net_(std::move(net)), failure_(std::move(failure)) {}

  Tensor train_step(const data::Batch& b) override {
    if (++steps_ == failure_.step && dist::rank() == failure_.rank) {
      if (failure_.mode == "kill") std::raise(SIGKILL);
      if (failure_.mode == "sigterm") {
        std::raise(SIGTERM);  // the Trainer finishes this step, then every rank stops
        return F::cross_entropy(net_->forward(b["input"]), b["target"]);
      }
      throw Error("injected failure at step " + std::to_string(steps_));
    }
    return F::cross_entropy(net_->forward(b["input"]), b["target"]);
  }

 private:
  std::shared_ptr<nn::Sequential> net_;
  Failure failure_;
  int64_t steps_ = 0;
};

int run(int argc, char** argv) {
  po::options_description o("dist_tiny_train options");
  // clang-format off
  o.add_options()
    ("help,h", "show this help")
    ("batch-size", po::value<int64_t>()->default_value(4), "samples per step and process")
    ("steps", po::value<int64_t>()->default_value(6), "optimizer steps")
    ("clip", po::value<double>()->default_value(0.0), "gradient-norm clipping (0: off)")
    ("out", po::value<std::string>()->default_value(""), "write parameters to <out>.rank<R>.txt")
    ("fail-rank", po::value<int64_t>()->default_value(-1), "the rank that fails")
    ("fail-step", po::value<int64_t>()->default_value(0), "the step at which it fails")
    ("fail-mode", po::value<std::string>()->default_value("throw"), "kill (SIGKILL itself), sigterm (SIGTERM itself) or throw (a loom::Error)");
  // clang-format on
  po::variables_map vm;
  if (!recipes::parse_options(argc, argv, o, vm, "usage: dist_tiny_train [options]")) return 0;
  recipes::set_threads(1);
  const int64_t batch = vm["batch-size"].as<int64_t>(), steps = vm["steps"].as<int64_t>();
  const int rank = dist::rank(), world = dist::world_size();

  nn::manual_seed(1 + 1000 * static_cast<uint64_t>(rank));
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(16, 4)});
  auto opt = std::make_shared<optim::SGD>(net->parameters(),
                                          optim::SGDOptions{.lr = 0.2, .momentum = 0.9, .weight_decay = 1e-3});

  // One epoch of exactly `steps` global batches: rank r's batch s holds positions
  // (s·B + j)·world + r of the shuffled order, so the ranks' batches together are the
  // single-process batch s of size B·world.
  std::map<std::string, data::FieldSpec> fields{{"input", {data::HostDType::Float32, {8}, -1, 1}},
                                                {"target", {data::HostDType::Int64, {}, 0, 4}}};
  auto set = std::make_shared<data::SyntheticDataset>(steps * batch * world, fields, 7);
  data::DeviceLoader loader(set, {.batch_size = batch, .shuffle = true, .seed = 3, .threads = 1, .prefetch = 2,
                                  .rank = rank, .world_size = world});

  Failure failure{vm["fail-rank"].as<int64_t>(), vm["fail-step"].as<int64_t>(), vm["fail-mode"].as<std::string>()};
  TinyTrainer trainer(net, opt,
                      {.epochs = 1, .max_steps = steps, .log_every = 0, .clip_grad_norm = vm["clip"].as<double>(),
                       .quiet = true},
                      failure);
  trainer.fit(loader);
  wait_device_ops();

  if (auto out = vm["out"].as<std::string>(); !out.empty()) {
    std::ofstream f(out + ".rank" + std::to_string(rank) + ".txt");
    for (const auto& [name, t] : net->named_parameters()) {
      auto values = t.to_vector<float>();
      for (std::size_t i = 0; i < values.size(); ++i) {
        char line[128];
        std::snprintf(line, sizeof line, "%s %zu %.9g\n", name.c_str(), i, static_cast<double>(values[i]));
        f << line;
      }
    }
    if (!f) throw Error("--out: cannot write " + out + ".rank" + std::to_string(rank) + ".txt");
  }
  if (trainer.interrupted())
    std::cout << "dist_tiny_train: rank " << rank << " stopped at step " << trainer.step() << "\n";
  if (rank == 0) std::cout << "dist_tiny_train: trained " << trainer.step() << " steps on " << world << " processes\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return loom::recipes::run_main("dist_tiny_train", run, argc, argv); }
