// Trainer: the training loop, written once. Subclass it, say how a batch becomes a loss (and,
// optionally, evaluation metrics), and fit() does the rest: the DeviceLoader loop, lazy /
// compiled / eager execution, backward, gradient clipping, the optimizer and its LR schedule,
// periodic evaluation, logging through step closures (printing the loss never stalls the
// step), checkpoints (atomic, resumable exactly) and a metrics summary at the end.
//
//   namespace F = loom::nn::functional;
//   class MnistTrainer : public loom::Trainer {
//    public:
//     MnistTrainer(std::shared_ptr<loom::nn::Sequential> net, loom::TrainerOptions options)
//         : loom::Trainer(net, std::make_shared<loom::optim::SGD>(
//                                  net->parameters(), loom::optim::SGDOptions{.lr = 0.1, .momentum = 0.9}),
//                         std::move(options)),
//           net_(std::move(net)) {}
//     loom::Tensor train_step(const loom::data::Batch& b) override {
//       return F::cross_entropy(net_->forward(b["input"]), b["target"]);
//     }
//     std::map<std::string, loom::Tensor> eval_step(const loom::data::Batch& b) override {
//       auto hit = loom::eq(loom::argmax(net_->forward(b["input"]), 1), b["target"]).to(loom::DType::Float32);
//       return {{"accuracy", loom::sum(hit * real_rows(b, loom::DType::Float32))}};  // padding not counted
//     }
//     std::shared_ptr<loom::nn::Sequential> net_;
//   };
//   MnistTrainer trainer(net, {.epochs = 5, .checkpoint = "run.ckpt.h5"});
//   trainer.fit(train_loader, &test_loader);
//
// SIGINT/SIGTERM during fit() finish the current step (the host is at most
// max_steps_in_flight() steps ahead of the device, so that is soon), write the checkpoint
// (when a path is set) and return with interrupted() true; fit() with resume = true then
// continues exactly where it stopped: the same batches, the same losses as a run that never
// stopped. A second signal ends the process at once (exit code 130), leaving the last
// checkpoint written as it was.
//
// A NaN or infinite training loss ends fit() with a loom::Error naming the step, a step or
// two after it (the loss is read where the progress line reads it, without a sync), and a
// checkpoint is never written from non-finite values. fit() checks at its start that the
// checkpoint and profile paths can be written, and removes a "<checkpoint>.tmp" that a
// killed run left. The epoch-end checkpoint is written before the epoch-end evaluation.
//
// Devices: put the model where it trains (model->to(loom::parse_device("cuda:0"))) and give
// the loaders the same DeviceLoaderOptions::device; fit() and evaluate() check that they agree
// and name what to change when they do not. Checkpoints are read to the host and moved to the
// parameters' device, so a run saved on one device resumes on another.
//
// Under mpirun (loom/dist.h) fit() is data-parallel: give the training loader this rank's
// shard (DeviceLoaderOptions rank / world_size); gradients are averaged over the ranks before
// clipping and the update; rank 0 logs and writes checkpoints, and every rank resumes from
// them; a signal to any rank stops all of them at the same step; throughput is global.
#pragma once

#include <loom/autocast.h>
#include <loom/data/loader.h>
#include <loom/nn/module.h>
#include <loom/optim.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace loom {

enum class ExecutionMode { Lazy, Eager, Compiled };
// "lazy", "eager", "compiled"; throws loom::Error naming the valid modes otherwise.
ExecutionMode parse_mode(const std::string& mode);

struct TrainerOptions {
  int64_t epochs = 1;
  int64_t max_steps = 0;          // stop after this many optimizer steps in all (0: no limit)
  int64_t log_every = 50;         // steps between log lines
  int64_t eval_every = 0;         // steps between evaluations (0: at the end of each epoch)
  std::string checkpoint;         // checkpoint file ("" : none)
  int64_t checkpoint_every = 0;   // steps between extra checkpoints (0: none); one is always
                                  // written at each epoch's end and at the end of the run
  bool resume = false;            // continue from `checkpoint` if it exists (to train on: the
                                  // same processes, batches per epoch and seed; to evaluate:
                                  // none of them)
  ExecutionMode mode = ExecutionMode::Lazy;
  // bf16: train_step and eval_step run inside an Autocast scope (loom/autocast.h): matmuls and
  // convolutions in bfloat16 (and the activations a model stores with autocast_round), the
  // rest, the weights and the checkpoints in float32.
  Precision precision = Precision::Float32;
  double clip_grad_norm = 0;      // clip gradients to this global norm (0: off)
  std::string profile;            // write a Chrome trace of the run here ("" : off); under
                                  // mpirun rank N > 0 writes <stem>.rankN<extension> beside it
  std::vector<std::string> inputs;  // files the run reads (its data): fit() refuses a
                                  // checkpoint or profile path that is one of them, and a
                                  // profile that is the checkpoint (or its "<path>.tmp")
  std::string model_name;         // stored in checkpoints; a resume must match it
  std::string run_options;        // stored in checkpoints (the command line, say)
  int64_t seed = 0;               // stored in checkpoints; a resume that trains must match it
  std::string unit = "samples";   // what the throughput counts ("samples", "tokens", ...)
  int64_t units_per_sample = 1;   // e.g. the sequence length for tokens/s
  bool quiet = false;             // no log output (tests)
};

class Trainer {
 public:
  Trainer(std::shared_ptr<nn::Module> model, std::shared_ptr<optim::Optimizer> optimizer,
          TrainerOptions options);
  virtual ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  void set_schedule(std::shared_ptr<optim::Schedule> schedule) { schedule_ = std::move(schedule); }

  // Trains until the run has done options.epochs epochs (or max_steps steps in all, counted
  // from the run's start: a resumed run, or a second fit(), trains only what is left, and
  // says so when nothing is); evaluates on `eval` if given.
  void fit(data::DeviceLoader& train, data::DeviceLoader* eval = nullptr);
  // Sums of eval_step() over the loader, divided by the number of real (unpadded) samples.
  // Under mpirun the sums and counts add up over the ranks, so give each rank its part of the
  // set (recipes' eval_shard) or all of it; every rank evaluates rank 0's buffers.
  std::map<std::string, double> evaluate(data::DeviceLoader& eval);

  // Every training step's loss so far, in order (complete once the device has caught up:
  // after fit() returns).
  std::vector<double> losses() const;
  int64_t step() const { return step_; }
  bool interrupted() const { return interrupted_; }
  const std::map<std::string, double>& last_eval() const { return last_eval_; }

  // Saves (on rank 0 only; the other ranks return) / restores (every rank) model, optimizer
  // and position (used by fit; public for tools).
  void save_checkpoint(const std::string& path) const;
  void load_checkpoint(const std::string& path);

 protected:
  // The loss of one batch (forward only: fit() runs backward and the optimizer). Runs inside
  // the traced (or compiled, or eager) step, so keep host work and reads out of it.
  virtual Tensor train_step(const data::Batch& batch) = 0;
  // Per-batch sums of metrics over the batch's real rows (batch.valid of batch.size()), e.g.
  // {"loss": sum of losses, "accuracy": number correct}. The default returns none.
  virtual std::map<std::string, Tensor> eval_step(const data::Batch& batch);
  // After each epoch's checkpoint and evaluation (last_eval() holds it). An LR set here
  // (optimizer().set_lr, without a schedule) is saved in the checkpoint and restored by a resume.
  virtual void on_epoch_end(int64_t /*epoch*/) {}
  // 1 for the batch's real rows, 0 for the padding of a last batch ([batch.size()] of
  // `dtype`); the count of real rows is device data, so the last batch does not recompile.
  static Tensor real_rows(const data::Batch& batch, DType dtype);

  nn::Module& model() { return *model_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  const TrainerOptions& options() const { return options_; }

 private:
  // zero_grad, train_step, backward, clipping, the optimizer; returns the loss.
  Tensor run_step(const data::Batch& batch);
  // Writes the checkpoint (when a path is set) unless this step's is already written.
  void save();
  // After load_checkpoint: a loom::Error unless the checkpoint's run had this run's number of
  // processes, `per_epoch` batches an epoch and seed (so that this run continues exactly).
  void check_resumable(int64_t per_epoch) const;
  // --checkpoint and --profile can be written; removes a stale "<checkpoint>.tmp".
  void check_destinations() const;
  // The parameters share one device, and `loader` ("training", "evaluation") delivers its
  // batches there; a loom::Error saying what to change otherwise.
  void check_device(const data::DeviceLoader& loader, const char* which) const;
  void log_step(int64_t step, double loss, double lr);
  // `steps`: trained by this fit() (step() less where it started).
  void log_summary(int64_t steps, double seconds, double rate) const;
  // Log lines come from rank 0 only, and not at all when quiet.
  bool logs() const;

  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<optim::Schedule> schedule_;
  TrainerOptions options_;
  int64_t step_ = 0;
  int64_t epoch_ = 0;
  int64_t batch_in_epoch_ = 0;
  bool interrupted_ = false;
  int64_t saved_at_ = -1;  // the step of the last checkpoint written or loaded
  int64_t loaded_seed_ = 0;  // the seed of the run that wrote the checkpoint loaded
  int64_t loaded_per_epoch_ = 0;  // and its batches per epoch (0: unknown)
  int64_t loaded_processes_ = 0;  // and its number of processes (0: unknown)
  int64_t batches_per_epoch_ = 0;  // this run's, once fit() knows them
  std::map<std::string, double> last_eval_;

  mutable std::mutex loss_mutex_;  // losses_ is filled by step closures on the device thread
  std::vector<double> losses_;
  bool diverged_ = false;  // a non-finite loss was seen
  double interval_loss_ = 0;
  int64_t interval_steps_ = 0;
  double interval_start_ = 0;
  double fit_start_ = 0;
  int64_t total_steps_ = 0;
  int64_t units_per_step_ = 0;
};

}  // namespace loom
