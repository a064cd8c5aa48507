// Samplers decide which dataset indices an epoch visits and in what order; make_batches cuts
// that order into batches of one fixed size.
//
//   loom::data::RandomSampler sampler(dataset->size(), /*seed=*/42);
//   auto order = sampler.indices(/*epoch=*/3);            // a permutation, f(seed, epoch)
//   auto batches = loom::data::make_batches(order, 256, loom::data::LastBatch::Pad);
//
//   // Rank 1 of 4 in data-parallel training: a disjoint quarter of each epoch's permutation.
//   loom::data::DistributedSampler shard(dataset->size(), 1, 4, {.shuffle = true, .seed = 42});
//
// Every sampler is a pure function of its arguments and the epoch, so the order never depends
// on thread counts or on what ran before.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The dataset indices of `epoch`, in visiting order.
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
  // indices(e).size() for every epoch.
  virtual int64_t size() const = 0;
};

// 0, 1, ..., n-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

// A permutation of 0..n-1 that depends only on (seed, epoch).
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

struct DistributedSamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  // When n is not a multiple of world_size: false pads the global order with indices from
  // its start (every sample is seen, a few twice); true drops the tail (each at most once).
  bool drop_last = false;
};

// Shard `rank` of `world_size`: the global order (a permutation of f(seed, epoch), or
// sequential) made a multiple of world_size, then every world_size-th index from `rank` on.
// Together the ranks cover the dataset exactly once when world_size divides n.
class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t n, int64_t rank, int64_t world_size,
                     DistributedSamplerOptions options = {});
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return per_rank_; }

 private:
  int64_t n_, rank_, world_size_, per_rank_;
  DistributedSamplerOptions options_;
};

// What to do with a last batch shorter than batch_size. A short batch has a new shape, and a
// new shape recompiles the step graph, so the default keeps every batch the same size.
enum class LastBatch {
  Drop,  // leave it out
  Pad,   // fill it with indices from the start of the epoch's order (see Batch::valid)
  Keep,  // deliver it short
};

// "LastBatch::Drop", "LastBatch::Pad", "LastBatch::Keep", for messages.
const char* last_batch_name(LastBatch last);

// Cuts `indices` into batches of batch_size. With Pad, the padded batch's extra entries repeat
// indices[0], indices[1], ... (cycling when there are fewer indices than batch_size).
std::vector<std::vector<int64_t>> make_batches(const std::vector<int64_t>& indices,
                                               int64_t batch_size, LastBatch last);

}  // namespace loom::data
