// Eager host transforms: functions that edit one Example in place on a worker thread, before
// collation. Compose them in a vector (applied in order) or with compose().
//
//   std::vector<loom::data::Transform> augment = {
//       loom::data::to_float("input"),                                // uint8 → float32 / 255
//       loom::data::normalize({0.2860}, {0.3530}, "input"),           // per channel
//       loom::data::random_crop({28, 28}, /*padding=*/2, "input"),
//       loom::data::random_horizontal_flip(0.5, "input"),
//       loom::data::cast("target", loom::data::HostDType::Int64),
//   };
//
//   // Your own: any callable taking (Example&, const SampleContext&).
//   loom::data::Transform invert = [](loom::data::Example& e, const loom::data::SampleContext&) {
//     for (float& v : std::span(e.at("input").data<float>(), e.at("input").numel())) v = 1 - v;
//   };
//
// Randomness comes from the SampleContext: a value drawn from (seed, epoch, sample index,
// stream), never from a shared generator, so a sample's augmentation is the same whatever the
// thread count or the order in which workers reach it. Each built-in random transform uses its
// own stream (derived from its kind and field), so a crop and a flip are independent.
#pragma once

#include <loom/data/dataset.h>

#include <array>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace loom::data {

// Identifies one sample of one epoch for random transforms.
struct SampleContext {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t index = 0;  // the dataset index

  // 64 random bits from (seed, epoch, index, stream).
  uint64_t random(uint64_t stream) const;
  // Uniform in [0, 1).
  double uniform(uint64_t stream) const;
  // Uniform integer in [0, n).
  int64_t uniform_int(uint64_t stream, int64_t n) const;
  // A standard generator seeded from (seed, epoch, index, stream), for transforms that need
  // many draws.
  std::mt19937_64 generator(uint64_t stream) const;
};

// Stream numbers for user transforms: any value works; this hashes a name.
uint64_t stream_id(const std::string& name);

using Transform = std::function<void(Example&, const SampleContext&)>;

// Applies `transforms` in order.
Transform compose(std::vector<Transform> transforms);

// uint8 → float32 scaled by 1/255 (as torchvision's ToTensor); other dtypes → float32.
Transform to_float(std::string field = "input");
// Converts the field's elements to `dtype` (e.g. uint8 labels → int64).
Transform cast(std::string field, HostDType dtype);
// (x - mean[c]) / std[c] for channel c = index along dimension `channel_dim` of the sample
// (0 for [C,H,W]). mean and std have one entry per channel, or one for all. The field must
// be float32 or float64 (apply to_float first).
Transform normalize(std::vector<double> mean, std::vector<double> std, std::string field = "input",
                    int64_t channel_dim = 0);
// Pads the last two dimensions by `padding` on each side with `fill`, then crops a random
// size[0] x size[1] window (torchvision RandomCrop(size, padding)). Any dtype, [..., H, W].
Transform random_crop(std::array<int64_t, 2> size, int64_t padding = 0, std::string field = "input",
                      double fill = 0);
// Reverses the last dimension with probability p.
Transform random_horizontal_flip(double p = 0.5, std::string field = "input");

}  // namespace loom::data
