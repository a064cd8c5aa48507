// Samplers and batching: pure functions of (n, seed, epoch, rank), so any thread count sees
// the same order.
#include "random.h"

#include <loom/data/sampler.h>
#include <loom/error.h>

#include <numeric>
#include <string>
#include <utility>

namespace loom::data {
namespace {

void check_size(const char* who, int64_t n) {
  if (n < 0) throw Error(std::string(who) + ": expected a non-negative size, got " + std::to_string(n));
}

// Fisher-Yates driven by a generator keyed on (seed, epoch).
std::vector<int64_t> permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  detail::SplitMix64 rng(detail::hash_words({seed, static_cast<uint64_t>(epoch), 0x73687566666c65ULL}));
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(detail::bounded(rng.next(), static_cast<uint64_t>(i + 1)));
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(j)]);
  }
  return p;
}

}  // namespace

SequentialSampler::SequentialSampler(int64_t n) : n_(n) { check_size("SequentialSampler", n); }

std::vector<int64_t> SequentialSampler::indices(int64_t) const {
  std::vector<int64_t> p(static_cast<std::size_t>(n_));
  std::iota(p.begin(), p.end(), int64_t{0});
  return p;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  check_size("RandomSampler", n);
}

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const { return permutation(n_, seed_, epoch); }

DistributedSampler::DistributedSampler(int64_t n, int64_t rank, int64_t world_size,
                                       DistributedSamplerOptions options)
    : n_(n), rank_(rank), world_size_(world_size), options_(options) {
  check_size("DistributedSampler", n);
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw Error("DistributedSampler: expected 0 <= rank < world_size, got rank " +
                std::to_string(rank) + " of world_size " + std::to_string(world_size));
  per_rank_ = options_.drop_last ? n / world_size : (n + world_size - 1) / world_size;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> global;
  if (options_.shuffle) {
    global = permutation(n_, options_.seed, epoch);
  } else {
    global.resize(static_cast<std::size_t>(n_));
    std::iota(global.begin(), global.end(), int64_t{0});
  }
  const int64_t total = per_rank_ * world_size_;
  if (options_.drop_last) {
    global.resize(static_cast<std::size_t>(total));
  } else {
    for (int64_t i = 0; static_cast<int64_t>(global.size()) < total; ++i)
      global.push_back(global[static_cast<std::size_t>(i % n_)]);
  }
  std::vector<int64_t> out;
  out.reserve(static_cast<std::size_t>(per_rank_));
  for (int64_t i = rank_; i < total; i += world_size_) out.push_back(global[static_cast<std::size_t>(i)]);
  return out;
}

const char* last_batch_name(LastBatch last) {
  switch (last) {
    case LastBatch::Drop: return "LastBatch::Drop";
    case LastBatch::Pad: return "LastBatch::Pad";
    case LastBatch::Keep: return "LastBatch::Keep";
  }
  return "LastBatch(?)";
}

std::vector<std::vector<int64_t>> make_batches(const std::vector<int64_t>& indices,
                                               int64_t batch_size, LastBatch last) {
  if (batch_size < 1) throw Error("make_batches: expected batch_size >= 1, got " + std::to_string(batch_size));
  std::vector<std::vector<int64_t>> out;
  const auto n = static_cast<int64_t>(indices.size());
  for (int64_t start = 0; start < n; start += batch_size) {
    const int64_t end = std::min(n, start + batch_size);
    std::vector<int64_t> b(indices.begin() + start, indices.begin() + end);
    if (end - start < batch_size) {
      if (last == LastBatch::Drop) break;
      if (last == LastBatch::Pad)
        for (int64_t k = 0; static_cast<int64_t>(b.size()) < batch_size; ++k)
          b.push_back(indices[static_cast<std::size_t>(k % n)]);
    }
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace loom::data
