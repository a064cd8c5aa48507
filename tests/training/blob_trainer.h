// The Trainer tests' fixture: a tiny learnable dataset, an MLP and a Trainer subclass that
// can be disturbed (a signal, a NaN, a failing evaluation) at a chosen step.
#pragma once

#include <loom/checkpoint.h>
#include <loom/data/dataset.h>
#include <loom/data/loader.h>
#include <loom/nn/functional.h>
#include <loom/nn/init.h>
#include <loom/nn/layers.h>
#include <loom/trainer.h>

#include <unistd.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace loom::training_test {

namespace F = nn::functional;

// Two noisy blobs in 4-D, labels 0/1: learnable in a few steps.
inline std::shared_ptr<data::InMemoryDataset> blobs(int64_t n) {
  std::vector<float> x(n * 4);
  std::vector<int64_t> y(n);
  for (int64_t i = 0; i < n; ++i) {
    y[i] = i % 2;
    for (int64_t k = 0; k < 4; ++k)
      x[i * 4 + k] = (y[i] ? 1.0f : -1.0f) + 0.8f * static_cast<float>(std::sin(1.7 * i + 2.3 * k));
  }
  return std::make_shared<data::InMemoryDataset>(std::map<std::string, data::HostArray>{
      {"input", data::HostArray::from_vector(x, {n, 4})}, {"target", data::HostArray::from_vector(y, {n})}});
}

class Mlp : public nn::Module {
 public:
  Mlp() {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 16));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 2));
  }
  Tensor forward(const Tensor& x) override { return fc2->forward(relu(fc1->forward(x))); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

// The README's way: subclass, say how a batch becomes a loss and what to measure.
class BlobTrainer : public Trainer {
 public:
  BlobTrainer(std::shared_ptr<Mlp> net, TrainerOptions o, int64_t interrupt_at = 0)
      : Trainer(net, std::make_shared<optim::SGD>(net->parameters(), optim::SGDOptions{.lr = 0.2, .momentum = 0.9}),
                std::move(o)),
        net_(std::move(net)),
        interrupt_at_(interrupt_at) {}

  Tensor train_step(const data::Batch& b) override {
    // Host state the step depends on: counted at every call, replays of a compiled step
    // included, and guarded, so that a compiled step is traced again where the test disturbs it.
    every_call([this] { ++calls_; });
    guard_on("a disturbed step", [this] { return calls_ == interrupt_at_ || calls_ == poison_at; });
    if (interrupt_at_ && calls_ == interrupt_at_) std::raise(stop_signal);  // as if Ctrl-C (or kill)
    if (watch_checkpoint) {  // lazy mode only: a replayed compiled step would not come here
      // The checkpoint on disk as this step starts (-1: none yet).
      checkpoint_seen.push_back(std::filesystem::exists(options().checkpoint)
                                    ? loom::load_checkpoint(options().checkpoint).step : -1);
    }
    auto loss = F::cross_entropy(net_->forward(b["input"]), b["target"]);
    return calls_ == poison_at ? loss * std::nan("") : loss;  // as a NaN in the data would
  }
  std::map<std::string, Tensor> eval_step(const data::Batch& b) override {
    if (fail_eval) throw Error("evaluation failed");
    if (eval_batches_at.empty() || eval_batches_at.back().first != step()) eval_batches_at.push_back({step(), 0});
    ++eval_batches_at.back().second;
    auto correct = eq(argmax(net_->forward(b["input"]), 1), b["target"]).to(DType::Float32);
    if (!mask_padding) return {{"accuracy", sum(correct)}};
    // As the README says to: the padding of a last batch counted in neither sum.
    const Tensor real = real_rows(b, DType::Float32);
    return {{"accuracy", sum(correct * real)}, {"rows", sum(real)}};
  }

  int64_t poison_at = 0;   // the step whose loss is NaN (0: none)
  bool fail_eval = false;  // eval_step throws
  int stop_signal = SIGINT;       // what interrupt_at raises
  bool mask_padding = false;      // eval_step weighs rows by real_rows()
  bool watch_checkpoint = false;  // record checkpoint_seen
  std::vector<int64_t> checkpoint_seen;                        // per step, the step on disk
  std::vector<std::pair<int64_t, int64_t>> eval_batches_at;   // (step, batches) per evaluation

 private:
  std::shared_ptr<Mlp> net_;
  int64_t interrupt_at_;
  int64_t calls_ = 0;
};

inline data::DeviceLoader loader(int64_t n = 64, Device device = {}) {
  return data::DeviceLoader(blobs(n), {.batch_size = 8, .shuffle = true, .seed = 3, .threads = 2, .device = device});
}

inline std::shared_ptr<Mlp> fresh_model(uint64_t seed = 7) {
  nn::manual_seed(seed);
  return std::make_shared<Mlp>();
}

inline TrainerOptions quiet(TrainerOptions o) {
  o.quiet = true;
  return o;
}

inline std::string temp_checkpoint(const char* name) {
  auto p = std::filesystem::temp_directory_path() / (std::string(name) + std::to_string(::getpid()) + ".h5");
  std::filesystem::remove(p);
  return p;
}

}  // namespace loom::training_test
