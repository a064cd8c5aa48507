// DeviceLoader: batches equal a serial reference for any thread count, one MarkStep per
// iteration, errors rethrown on the consumer thread, and no hang or thread leak on early exit.
#include "loaders_test_util.h"
#include "test_util.h"

#include <loom/data/hdf5.h>
#include <loom/data/loader.h>
#include <loom/debug.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>

#include <atomic>
#include <chrono>
#include <dirent.h>
#include <fstream>
#include <thread>

namespace loom::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using test::TempDir;

std::vector<Transform> augmentation() {
  return {to_float("input"), normalize({0.5}, {0.25}, "input"), random_crop({8, 8}, 2, "input"),
          random_horizontal_flip(0.5, "input")};
}

// The plain serial reference: sampler → get → transforms → stack, one sample at a time.
std::vector<Example> reference_epoch(Dataset& ds, const std::vector<Transform>& transforms, int64_t batch_size,
                                     bool shuffle, uint64_t seed, int64_t epoch) {
  ds.set_epoch(epoch);
  std::vector<int64_t> order = shuffle ? RandomSampler(ds.size(), seed).indices(epoch)
                                       : SequentialSampler(ds.size()).indices(epoch);
  std::vector<Example> batches;
  for (std::size_t start = 0; start + static_cast<std::size_t>(batch_size) <= order.size();
       start += static_cast<std::size_t>(batch_size)) {
    Example stacked;
    for (int64_t k = 0; k < batch_size; ++k) {
      const int64_t index = order[start + static_cast<std::size_t>(k)];
      Example e = ds.get(index);
      for (const auto& t : transforms) t(e, SampleContext{seed, epoch, index});
      for (auto& [name, a] : e) {
        if (!stacked.contains(name)) {
          Shape shape{batch_size};
          shape.insert(shape.end(), a.shape.begin(), a.shape.end());
          stacked[name] = HostArray(a.dtype, shape);
        }
        std::copy(a.bytes.begin(), a.bytes.end(),
                  stacked.at(name).bytes.begin() + static_cast<std::ptrdiff_t>(k * a.bytes.size()));
      }
    }
    batches.push_back(std::move(stacked));
  }
  return batches;
}

void expect_equal(const Batch& got, const Example& want, const std::string& where) {
  ASSERT_EQ(got.tensors.size(), want.size()) << where;
  for (const auto& [name, a] : want) {
    HostTensor h = got[name].to_host();
    ASSERT_EQ(h.shape, a.shape) << where << " field " << name;
    ASSERT_EQ(h.dtype, *device_dtype(a.dtype)) << where << " field " << name;
    ASSERT_TRUE(h.bytes == a.bytes) << where << " field " << name;
  }
}

TEST(DeviceLoader, BatchesEqualTheSerialReferenceForAnyThreadCount) {
  TempDir dir;
  const std::string file = dir.file("images.h5");
  test::write_image_file(file, 100, 8, 8);
  auto ds = std::make_shared<HDF5Dataset>(file, HDF5Fields{{"train/images", "input"}, {"train/labels", "target"}});
  const uint64_t seed = 1234;
  std::vector<std::vector<Example>> reference;
  for (int64_t epoch = 0; epoch < 2; ++epoch) reference.push_back(reference_epoch(*ds, augmentation(), 16, true, seed, epoch));
  ASSERT_EQ(reference[0].size(), 6u);
  ASSERT_NE(reference[0][0].at("target").bytes, reference[1][0].at("target").bytes) << "epochs reshuffle";

  for (int threads : {1, 2, 4}) {
    for (int prefetch : {1, 3}) {
      DeviceLoader loader(ds, {.batch_size = 16, .shuffle = true, .seed = seed, .threads = threads, .prefetch = prefetch,
                               .mark_step = false},
                          augmentation());
      EXPECT_EQ(loader.batches_per_epoch(), 6);
      for (int64_t epoch = 0; epoch < 2; ++epoch) {
        EXPECT_EQ(loader.epoch(), epoch);
        std::size_t k = 0;
        for (auto& batch : loader) {
          const std::string where = "threads " + std::to_string(threads) + " prefetch " + std::to_string(prefetch) +
                                    " epoch " + std::to_string(epoch) + " batch " + std::to_string(k);
          ASSERT_LT(k, reference[static_cast<std::size_t>(epoch)].size()) << where;
          EXPECT_EQ(batch.epoch, epoch);
          EXPECT_EQ(batch.index, static_cast<int64_t>(k));
          EXPECT_EQ(batch.valid, 16);
          expect_equal(batch, reference[static_cast<std::size_t>(epoch)][k], where);
          ++k;
        }
        EXPECT_EQ(k, 6u);
      }
    }
  }
}

TEST(DeviceLoader, SetEpochReplaysAnEpoch) {
  auto ds = std::make_shared<SyntheticDataset>(
      64, std::map<std::string, FieldSpec>{{"input", {HostDType::Float32, {3}, 0, 1}}}, 3);
  DeviceLoader loader(ds, {.batch_size = 8, .shuffle = true, .seed = 5, .threads = 2});
  std::vector<std::vector<int64_t>> first, again;
  loader.set_epoch(4);
  for (auto& b : loader) first.push_back(b.indices);
  EXPECT_EQ(loader.epoch(), 5);
  loader.set_epoch(4);
  for (auto& b : loader) again.push_back(b.indices);
  EXPECT_EQ(first, again);
  EXPECT_EQ(first.size(), 8u);
}

// Resuming inside an epoch: set_epoch(e, k) delivers batches k.. of epoch e, each as a full
// pass gives it, without reading the batches before k; the epoch after starts at batch 0.
TEST(DeviceLoader, SetEpochFromABatchStartsThereWithoutReadingTheOnesBefore) {
  struct Counting final : Dataset {
    SyntheticDataset inner{64, {{"input", {HostDType::Float32, {3}, 0, 1}}}, 3};
    mutable std::atomic<int64_t> reads{0};
    int64_t size() const override { return inner.size(); }
    Example get(int64_t index) const override {
      ++reads;
      return inner.get(index);
    }
    std::string source() const override { return "counting"; }
  };
  auto ds = std::make_shared<Counting>();
  DeviceLoader loader(ds, {.batch_size = 8, .shuffle = true, .seed = 5, .threads = 2, .mark_step = false});
  std::vector<std::vector<int64_t>> full;
  std::vector<std::vector<float>> full_values;
  loader.set_epoch(3);
  for (auto& b : loader) {
    full.push_back(b.indices);
    full_values.push_back(b["input"].to_vector<float>());
  }
  ASSERT_EQ(full.size(), 8u);
  ds->reads = 0;
  loader.set_epoch(3, 5);
  std::vector<int64_t> numbers;
  for (auto& b : loader) {
    numbers.push_back(b.index);
    EXPECT_EQ(b.epoch, 3);
    EXPECT_EQ(b.indices, full[static_cast<std::size_t>(b.index)]) << "batch " << b.index;
    EXPECT_EQ(b["input"].to_vector<float>(), full_values[static_cast<std::size_t>(b.index)]) << "batch " << b.index;
  }
  EXPECT_EQ(numbers, (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(ds->reads, 3 * 8);  // batches 0-4 were not read
  EXPECT_EQ(loader.epoch(), 4);
  int64_t next = 0;
  for (auto& b : loader) EXPECT_EQ(b.index, next++);  // epoch 4: from its first batch
  EXPECT_EQ(next, 8);
  loader.set_epoch(3, 8);  // past the last batch: an empty pass
  for (auto& b : loader) ADD_FAILURE() << "batch " << b.index;
  EXPECT_THAT(test::error_of([&] { loader.set_epoch(3, 9); }),
              HasSubstr("DeviceLoader::set_epoch: batch 9 is past the epoch's 8 batches"));
  EXPECT_THAT(test::error_of([&] { loader.set_epoch(3, -1); }), HasSubstr("expected a first batch >= 0, got -1"));
}

// The steps a loop over a loader marks are named after the loop's line in loom::debug's
// causes (they were all the loader's own line, so two loops were compared with each other).
TEST(DeviceLoader, ItsStepsAreNamedAfterTheLoop) {
  debug::reset();
  auto ds = std::make_shared<SyntheticDataset>(
      12, std::map<std::string, FieldSpec>{{"input", {HostDType::Float32, {3}, 0, 1}}}, 3);
  DeviceLoader loader(ds, {.batch_size = 4});
  Tensor kept;
  const int line = __LINE__ + 1;
  for (auto& b : loader) kept = (b["input"] * 2.0).sum();
  bool named = false;
  for (const auto& c : debug::recompile_causes())
    named |= c.site == "device_loader_test.cpp:" + std::to_string(line);
  EXPECT_TRUE(named);
}

// A pass that finished is not timed after it (reset_stats() made it count again); a world
// size or rank that makes no sense is an error; an epoch that cannot start leaves epoch() as
// it was.
TEST(DeviceLoader, StatsRanksAndEpochsStayTrue) {
  auto ds = std::make_shared<SyntheticDataset>(
      12, std::map<std::string, FieldSpec>{{"input", {HostDType::Float32, {3}, 0, 1}}}, 3);
  DeviceLoader loader(ds, {.batch_size = 4, .mark_step = false});
  auto it = loader.begin();
  while (it != loader.end()) ++it;
  loader.reset_stats();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LT(loader.stats().iterate_seconds, 0.1);
  for (auto [rank, world] : {std::pair<int64_t, int64_t>{0, 0}, {0, -3}, {2, 2}, {-1, 2}})
    EXPECT_THAT(test::error_of([&] { DeviceLoader(ds, {.rank = rank, .world_size = world}); }),
                HasSubstr("expected 0 <= rank < world_size"));
  struct Past final : Sampler {
    std::vector<int64_t> indices(int64_t) const override { return {0, 99}; }
    int64_t size() const override { return 2; }
  };
  DeviceLoader bad(ds, {.batch_size = 2, .sampler = std::make_shared<Past>()});
  EXPECT_THROW(bad.begin(), Error);
  EXPECT_EQ(bad.epoch(), 0);
}

// A sample that does not collate with the others is named by its index in the dataset.
TEST(DeviceLoader, ASampleThatDoesNotCollateIsNamedByItsIndex) {
  struct Odd final : Dataset {
    int64_t size() const override { return 8; }
    Example get(int64_t index) const override {
      Example e;
      e["x"] = HostArray::from_vector<float>(std::vector<float>(index == 5 ? 3 : 2, 1.f), {index == 5 ? 3 : 2});
      return e;
    }
  };
  DeviceLoader loader(std::make_shared<Odd>(), {.batch_size = 4, .mark_step = false});
  const std::string msg = test::error_of([&] {
    for (auto& b : loader) (void)b;
  });
  EXPECT_THAT(msg, HasSubstr("collate: sample 5 field 'x' is float32[3], expected float32[2] as sample 4")) << msg;
}

// A custom sampler's index outside the dataset is an error when its epoch starts, before any
// sample is read (a dataset of the user's may not check its indices).
TEST(DeviceLoader, ASamplersIndexOutsideTheDatasetIsAClearError) {
  struct Past final : Sampler {
    std::vector<int64_t> indices(int64_t) const override { return {0, 1, 64, 2}; }
    int64_t size() const override { return 4; }
  };
  auto ds = std::make_shared<SyntheticDataset>(
      64, std::map<std::string, FieldSpec>{{"input", {HostDType::Float32, {3}, 0, 1}}}, 3);
  DeviceLoader loader(ds, {.batch_size = 2, .sampler = std::make_shared<Past>()});
  const std::string msg = test::error_of([&] {
    for (auto& b : loader) (void)b;
  });
  EXPECT_THAT(msg, HasSubstr("DeviceLoader: the sampler gave index 64 for a dataset of 64 samples")) << msg;
}

TEST(DeviceLoader, EachIterationIsOneMarkStep) {
  test::fresh_engine();
  auto ds = std::make_shared<SyntheticDataset>(
      40, std::map<std::string, FieldSpec>{{"input", {HostDType::Float32, {4}, 0, 1}},
                                           {"target", {HostDType::Int64, {}, 0, 10}}});
  DeviceLoader loader(ds, {.batch_size = 4, .threads = 2});
  Tensor w = ones({4}, DType::Float32);
  int64_t iterations = 0;
  for (auto& batch : loader) {
    w = w + batch["input"].sum({0});  // traced; the increment runs it
    ++iterations;
  }
  EXPECT_EQ(iterations, 10);
  EXPECT_EQ(metrics::counter("MarkStep"), iterations);
  EXPECT_EQ(metrics::counter("LoaderBatches"), iterations);
  EXPECT_EQ(metrics::counter("LoaderSamples"), 40);
  EXPECT_EQ(metrics::stat("LoaderWaitTime").count, iterations + 1) << "one wait per batch, plus the end";
  EXPECT_FALSE(w.is_pending()) << "the last step was run by the last increment";
  const auto s = loader.stats();
  EXPECT_EQ(s.batches, 10);
  EXPECT_EQ(s.samples, 40);
  EXPECT_GT(s.samples_per_second(), 0);
  EXPECT_GE(s.wait_fraction(), 0);
  EXPECT_LE(s.wait_fraction(), 1);

  DeviceLoader quiet(ds, {.batch_size = 4, .threads = 1, .mark_step = false});
  const int64_t before = metrics::counter("MarkStep");
  for (auto& batch : quiet) (void)batch;
  EXPECT_EQ(metrics::counter("MarkStep"), before);
}

TEST(DeviceLoader, PaddedLastBatchKeepsTheShapeAndCountsValidRows) {
  auto ds = std::make_shared<InMemoryDataset>(std::map<std::string, HostArray>{
      {"x", HostArray::from_vector<int64_t>({10, 11, 12, 13, 14, 15, 16}, {7})}});
  DeviceLoader pad(ds, {.batch_size = 3, .last_batch = LastBatch::Pad, .threads = 2, .mark_step = false});
  std::vector<std::vector<int64_t>> values;
  std::vector<int64_t> valid;
  for (auto& b : pad) {
    values.push_back(b["x"].to_vector<int64_t>());
    valid.push_back(b.valid);
  }
  EXPECT_EQ(values, (std::vector<std::vector<int64_t>>{{10, 11, 12}, {13, 14, 15}, {16, 10, 11}}));
  EXPECT_EQ(valid, (std::vector<int64_t>{3, 3, 1}));
  DeviceLoader keep(ds, {.batch_size = 3, .last_batch = LastBatch::Keep, .mark_step = false});
  int64_t rows = 0;
  for (auto& b : keep) rows += b["x"].size(0);
  EXPECT_EQ(rows, 7);
  EXPECT_THAT(test::error_of([&] { DeviceLoader(ds, {.batch_size = 8}); }), HasSubstr("make no batch of 8"));
}

TEST(DeviceLoader, ShardedLoadersCoverTheDatasetOnce) {
  auto ds = std::make_shared<InMemoryDataset>(std::map<std::string, HostArray>{
      {"x", HostArray::from_vector<int64_t>(test::fake_labels(48), {48})}});
  std::vector<int64_t> all;
  for (int64_t rank = 0; rank < 3; ++rank) {
    DeviceLoader loader(ds, {.batch_size = 4, .shuffle = true, .seed = 9, .threads = 2, .rank = rank,
                             .world_size = 3, .mark_step = false});
    for (auto& b : loader) all.insert(all.end(), b.indices.begin(), b.indices.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> iota(48);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(all, iota);
}

TEST(DeviceLoader, TokenWindowsFromHDF5) {
  TempDir dir;
  const std::string file = dir.file("tokens.h5");
  std::vector<uint8_t> text(500);
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<uint8_t>(i % 256);
  test::write_h5(file, {{"train/tokens", H5T_STD_U8LE, H5T_NATIVE_UINT8, {500}, text.data(), 128, 4}});
  auto ds = std::make_shared<TokenWindowDataset>(read_hdf5(file, "train/tokens"), 16,
                                                 TokenWindowOptions{.windows = 32, .seed = 2}, file);
  DeviceLoader loader(ds, {.batch_size = 8, .shuffle = true, .seed = 1, .threads = 2, .mark_step = false});
  int batches = 0;
  for (auto& b : loader) {
    EXPECT_EQ(b["input"].shape(), (Shape{8, 16}));
    EXPECT_EQ(b["input"].dtype(), DType::Int64);
    auto in = b["input"].to_vector<int64_t>(), out = b["target"].to_vector<int64_t>();
    for (std::size_t i = 0; i < in.size(); ++i) EXPECT_EQ(out[i], (in[i] + 1) % 256);
    ++batches;
  }
  EXPECT_EQ(batches, 4);
}

// ---- errors and shutdown ----

TEST(DeviceLoader, WorkerExceptionIsRethrownWithTheSampleIndex) {
  auto ds = std::make_shared<SyntheticDataset>(
      64, std::map<std::string, FieldSpec>{{"input", {HostDType::Float32, {2}, 0, 1}}});
  for (int threads : {1, 4}) {
    Transform bad = [](Example&, const SampleContext& ctx) {
      if (ctx.index == 37) throw std::runtime_error("bad pixel");
    };
    DeviceLoader loader(ds, {.batch_size = 8, .threads = threads, .prefetch = 3}, {bad});
    int delivered = 0;
    std::string message;
    try {
      for (auto& batch : loader) {
        (void)batch;
        ++delivered;
      }
    } catch (const Error& e) {
      message = e.what();
      try {
        std::rethrow_if_nested(e);
        ADD_FAILURE() << "expected the original exception nested";
      } catch (const std::runtime_error& original) {
        EXPECT_STREQ(original.what(), "bad pixel");
      }
    }
    EXPECT_EQ(delivered, 4) << "every batch before the failing one arrives, in order";
    EXPECT_THAT(message, AllOf(HasSubstr("sample 37"), HasSubstr("<memory>"), HasSubstr("bad pixel")));
    // The loader stays usable: the next epoch fails at the same place, without hanging.
    EXPECT_THROW(for (auto& b : loader) (void)b, Error);
  }
}

TEST(DeviceLoader, RefusingAnEmptyEpochNamesTheLastBatchModePassed) {
  auto empty = std::make_shared<InMemoryDataset>(
      std::map<std::string, HostArray>{{"x", HostArray(HostDType::Float32, {0, 2})}});
  for (auto [mode, name] : {std::pair{LastBatch::Drop, "Drop"}, std::pair{LastBatch::Pad, "Pad"},
                            std::pair{LastBatch::Keep, "Keep"}})
    EXPECT_EQ(test::error_of([&] { DeviceLoader(empty, {.batch_size = 4, .last_batch = mode}); }),
              std::string("DeviceLoader ('<memory>'): 0 samples per epoch make no batch of 4 with LastBatch::") + name);
  auto three = std::make_shared<InMemoryDataset>(
      std::map<std::string, HostArray>{{"x", HostArray(HostDType::Float32, {3, 2})}});
  EXPECT_EQ(test::error_of([&] { DeviceLoader(three, {.batch_size = 4}); }),
            "DeviceLoader ('<memory>'): 3 samples per epoch make no batch of 4 with LastBatch::Drop");
  EXPECT_EQ(DeviceLoader(three, {.batch_size = 4, .last_batch = LastBatch::Keep}).batches_per_epoch(), 1);
}

TEST(DeviceLoader, Uint8FieldsMustBeConverted) {
  auto ds = std::make_shared<SyntheticDataset>(
      16, std::map<std::string, FieldSpec>{{"input", {HostDType::UInt8, {2}, 0, 256}}});
  DeviceLoader loader(ds, {.batch_size = 4});
  EXPECT_THAT(test::error_of([&] { for (auto& b : loader) (void)b; }),
              AllOf(HasSubstr("'input' is uint8"), HasSubstr("to_float")));
}

TEST(DeviceLoader, CorruptChunkMidEpochNamesFileAndDatasetAndEndsTheLoop) {
  TempDir dir;
  const std::string file = dir.file("corrupt.h5");
  test::write_image_file(file, 128, 8, 8, /*chunk_rows=*/16, /*deflate=*/6);
  // The 5th chunk: rows 64-79 of train/images.
  ASSERT_EQ(test::corrupt_chunk(file, "train/images", 4), 64u);
  auto ds = std::make_shared<HDF5Dataset>(file, HDF5Fields{{"train/images", "input"}, {"train/labels", "target"}});
  DeviceLoader loader(ds, {.batch_size = 16, .threads = 2}, {to_float("input")});
  int delivered = 0;
  const std::string message = test::error_of([&] {
    for (auto& b : loader) {
      (void)b;
      ++delivered;
    }
  });
  EXPECT_EQ(delivered, 4);
  EXPECT_THAT(message, AllOf(HasSubstr(file), HasSubstr("dataset 'train/images'"), HasSubstr("64")));
}

TEST(DeviceLoader, CorruptChunkInAShuffledBatchNamesItsRowsNotTheBatchs) {
  TempDir dir;
  const std::string file = dir.file("corrupt.h5");
  test::write_image_file(file, 480, 4, 4, /*chunk_rows=*/16, /*deflate=*/6);
  ASSERT_EQ(test::corrupt_chunk(file, "train/images", 20), 320u);
  auto ds = std::make_shared<HDF5Dataset>(file, HDF5Fields{{"train/images", "input"}, {"train/labels", "target"}});
  // The first shuffled batch of 240 needs every chunk: one read of rows 0..479, which fails.
  DeviceLoader loader(ds, {.batch_size = 240, .shuffle = true, .threads = 1}, {to_float("input")});
  const std::string message = test::error_of([&] {
    for (auto& b : loader) (void)b;
  });
  EXPECT_THAT(message, HasSubstr("of '" + file + " train/images, train/labels' (epoch 0, batch 0): HDF5Dataset: '" +
                                 file + "' dataset 'train/images': cannot read samples 320..335: "));
  EXPECT_THAT(message, Not(HasSubstr("0..479")));
}

int thread_count() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

TEST(DeviceLoader, EarlyBreakAndDestructionNeitherHangNorLeakThreads) {
  auto ds = std::make_shared<SyntheticDataset>(
      4096, std::map<std::string, FieldSpec>{{"input", {HostDType::Float32, {16}, 0, 1}}});
  auto cycle = [&] {
    DeviceLoader loader(ds, {.batch_size = 8, .threads = 4, .prefetch = 2});
    int k = 0;
    for (auto& b : loader) {
      (void)b;
      if (++k == 2) break;
    }
    EXPECT_EQ(k, 2);
    // A new iteration after a break starts the next epoch from its first batch.
    for (auto& b : loader) {
      EXPECT_EQ(b.index, 0);
      EXPECT_EQ(b.epoch, 1);
      break;
    }
  };
  cycle();  // warms TBB's worker pool
  const int warm = thread_count();
  for (int i = 0; i < 20; ++i) cycle();
  EXPECT_LE(thread_count(), warm + 2) << "a loader thread leaked";

  // Destroyed without iterating, and destroyed while a slow transform is running.
  { DeviceLoader idle(ds, {.batch_size = 8}); }
  std::atomic<int> started{0};
  Transform slow = [&](Example&, const SampleContext&) {
    ++started;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  };
  {
    DeviceLoader loader(ds, {.batch_size = 64, .threads = 2, .prefetch = 4}, {slow});
    auto it = loader.begin();
    EXPECT_FALSE(it == std::default_sentinel);
  }
  EXPECT_GT(started.load(), 0);
}

// A loader whose consumer is behind (the queue full, as in a training loop that is slower
// than its data) holds no TBB worker: a worker waiting in it is one the step's kernels, which
// share TBB's pool, would run without (on the 2-core machine, half of them). Every thread of
// the caller's arena must then meet inside one parallel_for. Repeated, as the thread that
// would wait was a matter of chance.
TEST(DeviceLoader, AConsumerThatIsBehindHoldsNoTbbWorker) {
  const int n = tbb::info::default_concurrency();
  if (n < 2) GTEST_SKIP() << "one core: TBB has no worker threads to hold";
  auto ds = std::make_shared<SyntheticDataset>(
      4096, std::map<std::string, FieldSpec>{{"input", {HostDType::Float32, {4}, 0, 1}}});
  using Clock = std::chrono::steady_clock;
  for (int round = 0; round < 3; ++round) {
    std::atomic<int> samples{0};
    Transform count = [&](Example&, const SampleContext&) {  // slow enough for every thread to join in
      ++samples;
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    };
    DeviceLoader loader(ds, {.batch_size = 8, .threads = n, .prefetch = 2, .mark_step = false}, {count});
    auto it = loader.begin();  // one batch taken; then the consumer stalls
    // Until the loader has stopped preparing (its queue full): no count change for 100 ms.
    for (int last = -1; last != samples.load();) {
      last = samples.load();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::atomic<int> arrived{0};
    std::atomic<int> alone{0};
    tbb::parallel_for(
        0, n,
        [&](int) {
          ++arrived;
          const auto deadline = Clock::now() + std::chrono::seconds(3);
          while (arrived.load() < n && Clock::now() < deadline) std::this_thread::yield();
          if (arrived.load() < n) ++alone;
        },
        tbb::simple_partitioner());
    EXPECT_EQ(alone.load(), 0) << "round " << round << ": " << n
                               << " threads never met while the loader's queue was full";
  }
}

TEST(DeviceLoader, ExceptionInTheLoopBodyLeavesTheLoaderUsable) {
  auto ds = std::make_shared<SyntheticDataset>(
      64, std::map<std::string, FieldSpec>{{"input", {HostDType::Float32, {2}, 0, 1}}});
  DeviceLoader loader(ds, {.batch_size = 4, .threads = 2, .prefetch = 1});
  EXPECT_THROW(
      for (auto& b : loader) {
        if (b.index == 3) throw std::runtime_error("step failed");
      },
      std::runtime_error);
  int n = 0;
  for (auto& b : loader) n += b.epoch == 1;
  EXPECT_EQ(n, 16);
}

}  // namespace
}  // namespace loom::data
