// The Trainer: subclassing as the README shows, lazy/compiled/eager agreement, and exact
// resumption after an interruption (SIGINT) or a max-steps stop.
#include "test_util.h"
#include "training/blob_trainer.h"

#include <loom/data/dataset.h>
#include <loom/checkpoint.h>
#include <loom/data/loader.h>
#include <loom/nn/functional.h>
#include <loom/nn/init.h>
#include <loom/metrics.h>
#include <loom/nn/layers.h>
#include <loom/trainer.h>

#include <csignal>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>

namespace loom {
namespace {

using namespace training_test;

TEST(Trainer, ASubclassTrainsATinyModelOnAnInMemoryDataset) {
  auto train = loader();
  auto test = data::DeviceLoader(blobs(32), {.batch_size = 8});
  BlobTrainer t(fresh_model(), quiet({.epochs = 3}));
  t.fit(train, &test);
  auto losses = t.losses();
  ASSERT_EQ(losses.size(), 24u);  // 3 epochs of 8 batches
  EXPECT_EQ(t.step(), 24);
  EXPECT_LT(losses.back(), 0.5 * losses.front());
  EXPECT_GE(t.last_eval().at("accuracy"), 0.9);
}

std::vector<double> run_mode(ExecutionMode mode) {
  auto train = loader();
  BlobTrainer t(fresh_model(), quiet({.epochs = 1, .max_steps = 5, .mode = mode}));
  t.fit(train);
  return t.losses();
}

TEST(Trainer, LazyCompiledAndEagerGiveTheSameLosses) {
  auto lazy = run_mode(ExecutionMode::Lazy);
  ASSERT_EQ(lazy.size(), 5u);
  EXPECT_EQ(run_mode(ExecutionMode::Compiled), lazy);
  EXPECT_EQ(run_mode(ExecutionMode::Eager), lazy);
}

// --precision bf16: the Linear layers' matmuls run in bfloat16 (rounded, so the losses differ
// from fp32's), the model still learns, the weights and the checkpoint stay float32, and the
// three execution modes agree exactly (a captured step replays under its precision).
TEST(Trainer, Bf16PrecisionTrainsWithFloat32WeightsAndAgreesAcrossModes) {
  auto losses_in = [](ExecutionMode mode, Precision precision, const std::string& checkpoint = {}) {
    auto train = loader();
    auto test = data::DeviceLoader(blobs(32), {.batch_size = 8});
    auto net = fresh_model();
    BlobTrainer t(net, quiet({.epochs = 3, .checkpoint = checkpoint, .mode = mode, .precision = precision}));
    t.fit(train, &test);
    for (const auto& p : net->parameters()) EXPECT_EQ(p.dtype(), DType::Float32);
    EXPECT_GE(t.last_eval().at("accuracy"), 0.9);
    return t.losses();
  };
  const std::string ck = temp_checkpoint("bf16_trainer");
  const auto bf16 = losses_in(ExecutionMode::Lazy, Precision::BFloat16, ck);
  const auto fp32 = losses_in(ExecutionMode::Lazy, Precision::Float32);
  ASSERT_EQ(bf16.size(), fp32.size());
  EXPECT_NE(bf16, fp32) << "bf16 rounds: some loss must differ";
  EXPECT_LT(bf16.back(), 0.5 * bf16.front());
  for (std::size_t i = 0; i < 8; ++i) EXPECT_NEAR(bf16[i], fp32[i], 0.02 * fp32[i] + 1e-3) << "step " << i;
  EXPECT_EQ(losses_in(ExecutionMode::Compiled, Precision::BFloat16), bf16);
  EXPECT_EQ(losses_in(ExecutionMode::Eager, Precision::BFloat16), bf16);
  const auto saved = loom::load_checkpoint(ck);
  ASSERT_FALSE(saved.model.empty());
  for (const auto& [name, t] : saved.model) EXPECT_EQ(t.dtype(), DType::Float32) << name;
  std::filesystem::remove(ck);
}

TEST(Trainer, ResumingAfterSigintGivesTheUninterruptedLosses) {
  std::vector<double> whole;
  {
    auto train = loader();
    BlobTrainer t(fresh_model(), quiet({.epochs = 2}));
    t.fit(train);
    whole = t.losses();
    ASSERT_EQ(whole.size(), 16u);
  }
  auto ck = temp_checkpoint("loom_sigint_");
  std::vector<double> first, rest;
  {
    auto train = loader();
    BlobTrainer t(fresh_model(), quiet({.epochs = 2, .checkpoint = ck}), /*interrupt_at=*/11);
    t.fit(train);  // SIGINT during step 11 (epoch 2, batch 3): finish it, checkpoint, stop
    EXPECT_TRUE(t.interrupted());
    first = t.losses();
  }
  ASSERT_EQ(first.size(), 11u);
  ASSERT_TRUE(std::filesystem::exists(ck));
  {
    auto train = loader();
    BlobTrainer t(fresh_model(/*a different init, overwritten by the checkpoint*/ 99),
                  quiet({.epochs = 2, .checkpoint = ck, .resume = true}));
    t.fit(train);
    EXPECT_FALSE(t.interrupted());
    rest = t.losses();
  }
  first.insert(first.end(), rest.begin(), rest.end());
  ASSERT_EQ(first.size(), whole.size());
  for (std::size_t i = 0; i < whole.size(); ++i) EXPECT_DOUBLE_EQ(first[i], whole[i]) << "step " << i + 1;
  std::filesystem::remove(ck);
}

// Two epochs uninterrupted (lazy), against a run stopped by max_steps after `stop_at` steps
// and resumed from its checkpoint, both parts in `mode` (the resumed part evaluating on `eval`
// when given): the losses must be the same, bit for bit.
void expect_resume_exact(ExecutionMode mode, int64_t stop_at, data::DeviceLoader* eval = nullptr) {
  auto ck = temp_checkpoint("loom_maxsteps_");
  std::vector<double> whole, a, b;
  {
    auto train = loader();
    BlobTrainer t(fresh_model(), quiet({.epochs = 2}));
    t.fit(train);
    whole = t.losses();
  }
  {
    auto train = loader();
    BlobTrainer t(fresh_model(), quiet({.epochs = 2, .max_steps = stop_at, .checkpoint = ck, .mode = mode}));
    t.fit(train);
    a = t.losses();
  }
  {
    auto train = loader();
    BlobTrainer t(fresh_model(), quiet({.epochs = 2, .checkpoint = ck, .resume = true, .mode = mode}));
    t.fit(train, eval);
    b = t.losses();
    // The batches before the stop were neither read nor delivered again.
    EXPECT_EQ(train.stats().batches, static_cast<int64_t>(b.size()));
    if (eval) {
      EXPECT_GE(t.last_eval().at("accuracy"), 0.5);
    }
  }
  a.insert(a.end(), b.begin(), b.end());
  ASSERT_EQ(a.size(), whole.size());
  for (std::size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(a[i], whole[i]) << "step " << i + 1;
  std::filesystem::remove(ck);
}

TEST(Trainer, ResumingAfterAMaxStepsStopContinuesExactly) { expect_resume_exact(ExecutionMode::Lazy, 5); }

TEST(Trainer, ResumingInCompiledModeContinuesExactlyWithACapturedStep) {
  // 5 batches, the last padded
  auto eval = data::DeviceLoader(blobs(36), {.batch_size = 8, .last_batch = data::LastBatch::Pad});
  metrics::reset();
  expect_resume_exact(ExecutionMode::Compiled, 6, &eval);
  // Before the stop, 6 steps: the first creates the momentum (so it is not captured), the next
  // two trace the same step, 3 replay. After the resume, 10 steps: 2 traced, 8 replayed. Each
  // of the two evaluations (5 batches): the first creates the sums, two trace, one replays,
  // and the padded last batch fails a guard (its count of real rows) and is traced.
  EXPECT_EQ(metrics::counter("CaptureReplay"), 3 + 8 + 2 * 1);
  EXPECT_EQ(metrics::counter("GuardFailArgument"), 2);
}

// A learning rate set by hand (no schedule) is part of the checkpoint: a run that halves it at
// each epoch's end resumes with the halved one, so the resumed losses are the uninterrupted ones.
TEST(Trainer, AHandSetLearningRateSurvivesAResume) {
  struct Halving : BlobTrainer {
    using BlobTrainer::BlobTrainer;
    void on_epoch_end(int64_t) override { optimizer().set_lr(optimizer().lr() / 2); }
  };
  auto ck = temp_checkpoint("loom_halving_");
  std::vector<double> whole;
  {
    auto train = loader();
    Halving t(fresh_model(), quiet({.epochs = 3}));
    t.fit(train);
    whole = t.losses();
  }
  for (int64_t stop_at : {8, 11}) {  // at the first epoch's end (8 batches an epoch), inside the second
    std::vector<double> a, b;
    {
      auto train = loader();
      Halving t(fresh_model(), quiet({.epochs = 3, .max_steps = stop_at, .checkpoint = ck}));
      t.fit(train);
      a = t.losses();
    }
    EXPECT_EQ(load_checkpoint(ck).lr, 0.1) << "stopped at " << stop_at;  // halved once
    {
      auto train = loader();
      Halving t(fresh_model(), quiet({.epochs = 3, .checkpoint = ck, .resume = true}));
      t.fit(train);
      b = t.losses();
    }
    a.insert(a.end(), b.begin(), b.end());
    ASSERT_EQ(a.size(), whole.size());
    for (std::size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(a[i], whole[i]) << "step " << i + 1 << ", stopped at " << stop_at;
    EXPECT_EQ(load_checkpoint(ck).lr, 0.025);  // halved at the three epochs' ends
  }
  std::filesystem::remove(ck);
}

TEST(Trainer, ACheckpointOfAnotherModelIsAClearError) {
  auto ck = temp_checkpoint("loom_other_");
  {
    auto train = loader();
    BlobTrainer t(fresh_model(), quiet({.epochs = 1, .max_steps = 2, .checkpoint = ck, .model_name = "mlp"}));
    t.fit(train);
  }
  auto train = loader();
  BlobTrainer t(fresh_model(), quiet({.epochs = 1, .checkpoint = ck, .resume = true, .model_name = "resnet20"}));
  auto msg = test::error_of([&] { t.fit(train); });
  EXPECT_NE(msg.find("is of model 'mlp'"), std::string::npos) << msg;
  std::filesystem::remove(ck);
}

// A resume continues exactly or not at all: other batches per epoch (the batch size, the
// dataset or the processes changed) or another seed (another data order) would skip or repeat
// samples of the epoch in progress.
TEST(Trainer, ResumingOverOtherBatchesIsAClearError) {
  auto ck = temp_checkpoint("loom_batches_");
  {
    auto train = loader();  // 64 samples, 8 a batch
    BlobTrainer t(fresh_model(), quiet({.epochs = 2, .max_steps = 5, .checkpoint = ck}));
    t.fit(train);
  }
  ASSERT_EQ(load_checkpoint(ck).batches_per_epoch, 8);
  {
    auto train = data::DeviceLoader(blobs(64), {.batch_size = 4, .shuffle = true, .seed = 3});
    BlobTrainer t(fresh_model(), quiet({.epochs = 2, .checkpoint = ck, .resume = true}));
    const auto msg = test::error_of([&] { t.fit(train); });
    EXPECT_NE(msg.find("with 8 batches an epoch, this run has 16"), std::string::npos) << msg;
  }
  {
    auto train = loader();
    BlobTrainer t(fresh_model(), quiet({.epochs = 2, .checkpoint = ck, .resume = true, .seed = 5}));
    const auto msg = test::error_of([&] { t.fit(train); });
    EXPECT_NE(msg.find("written by a run with seed 0, this run has seed 5"), std::string::npos) << msg;
  }
  {
    // Nothing left to train (max_steps reached): evaluating it needs no particular batches.
    auto train = data::DeviceLoader(blobs(64), {.batch_size = 4, .shuffle = true, .seed = 3});
    BlobTrainer t(fresh_model(), quiet({.epochs = 2, .max_steps = 5, .checkpoint = ck, .resume = true}));
    EXPECT_NO_THROW(t.fit(train));
  }
  std::filesystem::remove(ck);
}

// A checkpoint due on an epoch's last batch is the epoch end's: the next epoch's start.
TEST(Trainer, ACheckpointOnAnEpochsLastBatchRecordsTheNextEpoch) {
  auto ck = temp_checkpoint("loom_epoch_end_");
  // (step, epoch, batch in epoch) of the checkpoint a run of `steps` leaves, one due every 4
  // steps, 8 batches an epoch.
  auto position_after = [&](int64_t steps) {
    auto train = loader();
    BlobTrainer t(fresh_model(), quiet({.epochs = 2, .max_steps = steps, .checkpoint = ck, .checkpoint_every = 4}));
    t.fit(train);
    const auto c = load_checkpoint(ck);
    return std::vector<int64_t>{c.step, c.epoch, c.batch_in_epoch};
  };
  EXPECT_EQ(position_after(8), (std::vector<int64_t>{8, 1, 0}));  // 8 is the first epoch's last
  EXPECT_EQ(position_after(12), (std::vector<int64_t>{12, 1, 4}));  // mid-epoch
  std::filesystem::remove(ck);
}

TEST(Trainer, ANonFiniteLossStopsNamingTheStepAndKeepsTheLastGoodCheckpoint) {
  auto ck = temp_checkpoint("loom_nan_");
  {
    auto train = loader();
    BlobTrainer t(fresh_model(), quiet({.epochs = 1, .checkpoint = ck}));
    t.fit(train);
  }
  ASSERT_EQ(load_checkpoint(ck).step, 8);
  std::filesystem::copy_file(ck, ck + ".good", std::filesystem::copy_options::overwrite_existing);
  for (auto mode : {ExecutionMode::Lazy, ExecutionMode::Compiled, ExecutionMode::Eager}) {
    std::filesystem::copy_file(ck + ".good", ck, std::filesystem::copy_options::overwrite_existing);
    auto train = loader();
    BlobTrainer t(fresh_model(), quiet({.epochs = 3, .checkpoint = ck, .checkpoint_every = 1, .resume = true,
                                        .mode = mode}));
    t.poison_at = 3;  // step 11 of the run
    auto msg = test::error_of([&] { t.fit(train); });
    EXPECT_NE(msg.find("step 11: the training loss is nan; stopping"), std::string::npos) << msg;
    // Steps 9 and 10 were finite and saved; nothing after them.
    auto kept = load_checkpoint(ck);
    EXPECT_EQ(kept.step, 10);
    for (auto& [name, value] : kept.model)
      for (double v : value.to(DType::Float64).to_vector<double>()) ASSERT_TRUE(std::isfinite(v)) << name;
    EXPECT_FALSE(std::filesystem::exists(checkpoint_temp_path(ck)));
  }
  std::filesystem::remove(ck);
  std::filesystem::remove(ck + ".good");
}

TEST(Trainer, ACheckpointIsNeverWrittenFromNonFiniteValues) {
  auto ck = temp_checkpoint("loom_nonfinite_");
  auto net = fresh_model();
  Checkpoint c;
  c.model = net->state_dict();
  c.model_name = "mlp";
  save_checkpoint(ck, c);
  const auto size = std::filesystem::file_size(ck);
  for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
    Checkpoint d = c;
    auto w = d.model[1].second.to_host();
    std::vector<float> values(w.data<float>(), w.data<float>() + w.numel());
    values[3] = static_cast<float>(bad);
    d.model[1].second = from_vector(values, w.shape);
    auto msg = test::error_of([&] { save_checkpoint(ck, d); });
    EXPECT_NE(msg.find("save_checkpoint: '" + ck + "' not written (the previous checkpoint is kept): model/" +
                       d.model[1].first + " holds a non-finite value"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("at element 3"), std::string::npos) << msg;
    EXPECT_FALSE(std::filesystem::exists(checkpoint_temp_path(ck)));
    EXPECT_EQ(std::filesystem::file_size(ck), size);
  }
  EXPECT_EQ(load_checkpoint(ck).model_name, "mlp");
  std::filesystem::remove(ck);
}

TEST(Trainer, AFailingEpochEndEvaluationKeepsTheEpochsTraining) {
  auto ck = temp_checkpoint("loom_evalfail_");
  auto train = loader();
  auto test = data::DeviceLoader(blobs(16), {.batch_size = 8});
  BlobTrainer t(fresh_model(), quiet({.epochs = 2, .checkpoint = ck}));
  t.fail_eval = true;
  EXPECT_EQ(test::error_of([&] { t.fit(train, &test); }), "evaluation failed");
  auto saved = load_checkpoint(ck);
  EXPECT_EQ(saved.step, 8);  // the first epoch, saved before its evaluation
  EXPECT_EQ(saved.epoch, 1);
  EXPECT_EQ(saved.batch_in_epoch, 0);
  std::filesystem::remove(ck);
}

TEST(Trainer, DestinationsAreCheckedBeforeTheFirstStep) {
  auto dir = std::filesystem::temp_directory_path();
  for (auto o : {TrainerOptions{.checkpoint = dir.string()}, TrainerOptions{.checkpoint = "/nonexistent/x/ck.h5"},
                 TrainerOptions{.profile = dir.string()}}) {
    auto train = loader();
    BlobTrainer t(fresh_model(), quiet(o));
    auto msg = test::error_of([&] { t.fit(train); });
    EXPECT_TRUE(msg.find("is a directory") != std::string::npos || msg.find("does not exist") != std::string::npos)
        << msg;
    EXPECT_TRUE(t.losses().empty());
  }
}

// The checkpoint, its temporary file and the profile are three files, none of them a file
// the run reads (TrainerOptions::inputs): a run told otherwise refuses to start, and the
// file it would have replaced is left as it was.
TEST(Trainer, OutputsThatAreOneFileOrAnInputAreRefused) {
  auto dir = std::filesystem::temp_directory_path() / ("loom_outputs_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string data = (dir / "data.h5").string(), ck = (dir / "run.ckpt.h5").string();
  { std::ofstream(data) << "the data"; }
  const std::pair<TrainerOptions, std::string> cases[] = {
      {{.checkpoint = ck, .profile = ck}, "--profile '" + ck + "' is the checkpoint"},
      {{.checkpoint = ck, .profile = ck + ".tmp"}, "--profile '" + ck + ".tmp' is the checkpoint's temporary file"},
      {{.checkpoint = data, .inputs = {data}}, "--checkpoint '" + data + "' is a file the run reads"},
      {{.checkpoint = (dir / "." / "data.h5").string(), .inputs = {data}}, "is a file the run reads"},
      {{.checkpoint = (dir / "saved").string(), .inputs = {(dir / "saved.tmp").string()}},
       "its temporary file '" + (dir / "saved.tmp").string() + "' is a file the run reads"},
      {{.profile = data, .inputs = {data}}, "--profile '" + data + "' is a file the run reads"},
  };
  for (const auto& [o, want] : cases) {
    auto train = loader();
    BlobTrainer t(fresh_model(), quiet(o));
    auto msg = test::error_of([&] { t.fit(train); });
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
    EXPECT_TRUE(t.losses().empty());
    std::ifstream in(data);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, "the data");
  }
  std::filesystem::remove_all(dir);
}

TEST(Trainer, SigtermStopsLikeSigint) {
  auto ck = temp_checkpoint("loom_sigterm_");
  auto train = loader();
  BlobTrainer t(fresh_model(), quiet({.epochs = 2, .checkpoint = ck}), /*interrupt_at=*/5);
  t.stop_signal = SIGTERM;  // as `kill` or a batch scheduler sends
  t.fit(train);
  EXPECT_TRUE(t.interrupted());
  EXPECT_EQ(t.losses().size(), 5u);  // the step in progress finished, then it stopped
  EXPECT_EQ(load_checkpoint(ck).step, 5);
  std::filesystem::remove(ck);
}

std::vector<double> flat_parameters(nn::Module& m) {
  std::vector<double> out;
  for (const auto& p : m.parameters())
    for (double v : p.to(DType::Float64).to_vector<double>()) out.push_back(v);
  return out;
}

// SGD's first step moves the parameters by lr x the gradient (the momentum buffer starts as
// the gradient): clipped to norm c, by exactly lr x c; unclipped, by far more.
TEST(Trainer, ClipGradNormBoundsTheUpdate) {
  constexpr double lr = 0.2, clip = 1e-3;  // BlobTrainer's SGD lr
  auto moved = [&](double max_norm) {
    auto net = fresh_model();
    const auto before = flat_parameters(*net);
    auto train = loader();
    BlobTrainer t(net, quiet({.max_steps = 1, .clip_grad_norm = max_norm}));
    t.fit(train);
    const auto after = flat_parameters(*net);
    double s = 0;
    for (std::size_t i = 0; i < before.size(); ++i) s += (after[i] - before[i]) * (after[i] - before[i]);
    return std::sqrt(s);
  };
  // (float32 parameters round each small update: a few 1e-4 of its norm)
  EXPECT_NEAR(moved(clip), lr * clip, 5e-3 * lr * clip);
  EXPECT_GT(moved(0), 20 * lr * clip) << "the gradient's norm is below the clip: the test shows nothing";
}

// A test set the batch does not divide: the last batch is padded (LastBatch::Pad), and the
// padding counts in no sum nor in the number of samples divided by.
TEST(Trainer, EvaluationOverAPaddedLastBatchCountsRealSamplesOnly) {
  auto net = fresh_model();
  BlobTrainer t(net, quiet({}));
  t.mask_padding = true;
  auto eval = [&](int64_t batch) {
    data::DeviceLoader l(blobs(20), {.batch_size = batch, .last_batch = data::LastBatch::Pad});
    return t.evaluate(l);
  };
  const auto padded = eval(8);  // 8 + 8 + 4 real rows of 8
  EXPECT_EQ(padded.at("rows"), 1.0);
  // The same as batches that divide the set: one of 20, and twenty of 1.
  EXPECT_DOUBLE_EQ(padded.at("accuracy"), eval(20).at("accuracy"));
  EXPECT_DOUBLE_EQ(padded.at("accuracy"), eval(1).at("accuracy"));
  const double correct = padded.at("accuracy") * 20;
  EXPECT_DOUBLE_EQ(correct, std::round(correct)) << "a fraction of 20 samples";
  // The untrained model gets some right and some wrong, so a miscount would show.
  EXPECT_GT(correct, 0);
  EXPECT_LT(correct, 20);
}

TEST(Trainer, EvalEveryEvaluatesEveryNStepsAndAtTheEnd) {
  auto train = loader();  // 8 batches per epoch
  auto test = data::DeviceLoader(blobs(16), {.batch_size = 8});
  BlobTrainer t(fresh_model(), quiet({.epochs = 2, .eval_every = 5}));
  t.fit(train, &test);
  using Evals = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(t.eval_batches_at, (Evals{{5, 2}, {10, 2}, {15, 2}, {16, 2}}));
  // 0: at each epoch's end instead.
  auto train2 = loader();
  BlobTrainer u(fresh_model(), quiet({.epochs = 2}));
  u.fit(train2, &test);
  EXPECT_EQ(u.eval_batches_at, (Evals{{8, 2}, {16, 2}}));
}

TEST(Trainer, CheckpointEveryWritesEveryNSteps) {
  auto ck = temp_checkpoint("loom_every_");
  auto train = loader();
  BlobTrainer t(fresh_model(), quiet({.epochs = 1, .max_steps = 7, .checkpoint = ck, .checkpoint_every = 3}));
  t.watch_checkpoint = true;
  t.fit(train);
  // As each of steps 1..7 starts: nothing, then step 3's checkpoint, then step 6's.
  EXPECT_EQ(t.checkpoint_seen, (std::vector<int64_t>{-1, -1, -1, 3, 3, 3, 6}));
  EXPECT_EQ(load_checkpoint(ck).step, 7);  // and the last step's, at the stop
  std::filesystem::remove(ck);
}

}  // namespace
}  // namespace loom
