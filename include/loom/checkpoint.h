// Checkpoints: a model's state_dict, the optimizer's state and the training position, in one
// HDF5 file. Written to "<path>.tmp", flushed to the disk and renamed over the last one (the
// directory flushed after), so a crash or a power cut never leaves a broken checkpoint.
//
//   loom::Checkpoint ck;
//   ck.model = model->state_dict();
//   ck.optimizer = opt.state();
//   ck.step = 1000;
//   loom::save_checkpoint("run.ckpt.h5", ck);
//   auto back = loom::load_checkpoint("run.ckpt.h5");   // tensors on cpu:0
//   model->load_state_dict(back.model);                 // copied to the parameters' device
//
// Layout: every tensor is an HDF5 dataset (`model/<key>`, `optimizer/<key>`); `meta/counters`
// holds [format version, step, epoch, batch_in_epoch, seed, optimizer_steps,
// batches_per_epoch, processes] as int64 (version 3; version 2 and version 1, without the
// last two, still load), `meta/lr` the optimizer's learning rate as float64[1] (version 3),
// and `meta/index`, `meta/model_name`, `meta/options` are text stored as uint8; `h5dump`
// shows it all.
#pragma once

#include <loom/tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom {

struct Checkpoint {
  std::vector<std::pair<std::string, Tensor>> model;      // state_dict
  std::vector<std::pair<std::string, Tensor>> optimizer;  // Optimizer::state()
  int64_t optimizer_steps = 0;
  int64_t step = 0;            // optimizer steps taken
  int64_t epoch = 0;           // the epoch in progress
  int64_t batch_in_epoch = 0;  // batches of that epoch already trained on
  int64_t batches_per_epoch = 0;  // the run's epoch length (0: unknown, a version 1 file)
  int64_t processes = 0;          // the run's MPI world size (0: unknown, a version 1 file)
  int64_t seed = 0;
  std::optional<double> lr;    // the optimizer's learning rate (none: a version 1 or 2 file)
  std::string model_name;      // e.g. "resnet20": a resume checks it
  std::string options;         // the run's options, as text
};

// Throws loom::Error, keeping the file already at `path` and removing the partial one, when
// a tensor holds NaN or Inf (a diverged run), a name is empty or holds a space, a control
// character or '/', or the file cannot be written (a full disk).
void save_checkpoint(const std::string& path, const Checkpoint& checkpoint);
// Where save_checkpoint writes before the rename ("<path>.tmp").
std::string checkpoint_temp_path(const std::string& path);
// Throws loom::Error naming the file for a missing, truncated or foreign file, an index that
// does not describe its tensors (shape, duplicates) and a NaN or infinite value in one.
Checkpoint load_checkpoint(const std::string& path);

}  // namespace loom
