// The DeviceLoader on the guarded device: the CPU's batches, byte for byte, every field of
// every batch collated into a guarded host block (Backend::alloc_host) and copied in from
// there, no guard band touched, and the blocks given back batch by batch, so that they do
// not pile up over epochs. The host-memory contract itself: loom::alloc_host on the CPU and
// on the guarded device.
#include "backend/guarded_backend.h"
#include "nn/nn_test_util.h"
#include "test_util.h"

#include <loom/data/loader.h>
#include <loom/data/transforms.h>
#include <loom/lazy.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace loom {
namespace {

using data::FieldSpec;
using data::HostDType;

constexpr int64_t kFields = 5;
constexpr int64_t kBatchesPerEpoch = 5;  // 37 samples in batches of 8, the last one padded
constexpr int kPrefetch = 3;

// Five fields of five dtypes over 37 samples; the uint8 image is made float32 and flipped at
// random (per seed, epoch and sample) by the transforms.
std::shared_ptr<data::Dataset> dataset() {
  return std::make_shared<data::SyntheticDataset>(
      37,
      std::map<std::string, FieldSpec>{{"image", {HostDType::UInt8, {3, 5, 5}, 0, 256}},
                                       {"target", {HostDType::Int64, {}, 0, 10}},
                                       {"weight", {HostDType::Float64, {2}, -1, 1}},
                                       {"count", {HostDType::Int32, {4}, 0, 100}},
                                       {"mask", {HostDType::Bool, {3}, 0, 2}}},
      7);
}

data::DeviceLoader loader_on(Device device) {
  return data::DeviceLoader(dataset(),
                            {.batch_size = 8, .shuffle = true, .seed = 3,
                             .last_batch = data::LastBatch::Pad, .threads = 2,
                             .prefetch = kPrefetch, .mark_step = false, .device = device},
                            {data::to_float("image"), data::random_horizontal_flip(0.5, "image")});
}

// A batch as the host sees it: field → values copied back.
using HostBatch = std::map<std::string, HostTensor>;

HostBatch to_host(const data::Batch& b) {
  HostBatch out;
  for (const auto& [name, t] : b.tensors) out.emplace(name, t.to_host());
  return out;
}

TEST(GuardedLoader, DeliversTheCpuBatchesCopiedFromGuardedHostBlocks) {
  test::fresh_engine();
  const Device g = test::guarded_device();
  auto cpu = loader_on(Device{});
  auto guarded = loader_on(g);
  const int64_t violations = test::guard_violations();
  const int64_t copies = test::guarded_copies_from_host_blocks();
  constexpr int kEpochs = 3;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    std::vector<HostBatch> want;
    for (auto& b : cpu) want.push_back(to_host(b));
    ASSERT_EQ(want.size(), static_cast<std::size_t>(kBatchesPerEpoch));
    std::size_t k = 0;
    for (auto& b : guarded) {
      const std::string where = "epoch " + std::to_string(epoch) + " batch " + std::to_string(k);
      ASSERT_LT(k, want.size()) << where;
      ASSERT_EQ(b.tensors.size(), static_cast<std::size_t>(kFields)) << where;
      for (const auto& [name, t] : b.tensors) {
        EXPECT_EQ(t.device(), g) << where << " field " << name;
        const HostTensor got = t.to_host();
        const HostTensor& w = want[k].at(name);
        EXPECT_EQ(got.dtype, w.dtype) << where << " field " << name;
        EXPECT_EQ(got.shape, w.shape) << where << " field " << name;
        EXPECT_TRUE(got.bytes == w.bytes) << where << " field " << name;
      }
      ++k;
    }
    EXPECT_EQ(k, want.size()) << "epoch " << epoch;
  }
  EXPECT_EQ(test::guarded_copies_from_host_blocks() - copies, kEpochs * kBatchesPerEpoch * kFields)
      << "every field of every batch is copied in from a host block of the guarded device";
  EXPECT_EQ(test::guard_violations(), violations);
}

TEST(GuardedLoader, HostBlocksAreGivenBackBatchByBatch) {
  test::fresh_engine();
  auto loader = loader_on(test::guarded_device());
  const int64_t alive = test::guarded_host_blocks_alive();
  const int64_t violations = test::guard_violations();
  for (int epoch = 0; epoch < 6; ++epoch) {
    const int64_t made = test::guarded_host_blocks_made();
    int64_t most_alive = 0;
    for (auto& b : loader) {
      (void)b;
      most_alive = std::max(most_alive, test::guarded_host_blocks_alive() - alive);
    }
    EXPECT_EQ(test::guarded_host_blocks_made() - made, kBatchesPerEpoch * kFields)
        << "epoch " << epoch << ": one block per field of each batch";
    EXPECT_LE(most_alive, kPrefetch * kFields) << "epoch " << epoch << ": only batches in flight hold blocks";
    EXPECT_EQ(test::guarded_host_blocks_alive(), alive) << "epoch " << epoch;
  }
  // An epoch left early gives its blocks back too.
  for (auto& b : loader) {
    (void)b;
    break;
  }
  EXPECT_EQ(test::guarded_host_blocks_alive(), alive);
  EXPECT_EQ(test::guard_violations(), violations);
}

TEST(HostMemory, CpuBlocksAreAlignedAndCopiedFrom) {
  auto block = alloc_host(3 * sizeof(float));
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(block.get()) % 64, 0u);
  const float values[] = {1.5f, -2, 4};
  std::memcpy(block.get(), values, sizeof values);
  EXPECT_EQ(test::values(from_host(block.get(), DType::Float32, {3})), (std::vector<double>{1.5, -2, 4}));
}

TEST(HostMemory, GuardedBlocksArePoisonedGuardedAndCountedWhenCopiedFrom) {
  const Device g = test::guarded_device();
  const int64_t alive = test::guarded_host_blocks_alive();
  const int64_t copies = test::guarded_copies_from_host_blocks();
  auto block = alloc_host(4 * sizeof(float), g);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(test::guarded_host_blocks_alive(), alive + 1);
  auto* bytes = static_cast<unsigned char*>(block.get());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(bytes[i], 0xFF) << i;
  const float values[] = {1, 2, 3, 4};
  std::memcpy(block.get(), values, sizeof values);
  EXPECT_EQ(test::values(from_host(block.get(), DType::Float32, {4}, g)), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(test::guarded_copies_from_host_blocks(), copies + 1);
  // A part of a block is inside it; plain host memory is not.
  EXPECT_EQ(test::values(from_host(bytes + 8, DType::Float32, {2}, g)), (std::vector<double>{3, 4}));
  EXPECT_EQ(test::guarded_copies_from_host_blocks(), copies + 2);
  std::vector<float> plain(values, values + 4);
  EXPECT_EQ(test::values(from_host(plain.data(), DType::Float32, {4}, g)), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(test::guarded_copies_from_host_blocks(), copies + 2);
  // A write past the block is a violation, found when it is given back.
  const int64_t violations = test::guard_violations();
  bytes[16] = 0;
  block.reset();
  EXPECT_EQ(test::guard_violations(), violations + 1);
  EXPECT_EQ(test::guarded_host_blocks_alive(), alive);
}

}  // namespace
}  // namespace loom
