// conv2d splits one image's output positions into column blocks when there are fewer
// (image, group) pairs than threads; the blocked result must equal the unblocked one.
#include "test_util.h"

namespace loom {
namespace {

TEST(Conv2dBlocks, OneImageEqualsTheSameImageInABatch) {
  auto x = uniform({1, 3, 37, 41}, -1, 1, 5, DType::Float64);
  auto w = normal({4, 3, 3, 3}, 0, 0.5, 6, DType::Float64);
  Conv2dParams o{.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}};
  auto single = conv2d(x, w, {}, o).to_vector<double>();  // few units: blocked columns
  auto batch = conv2d(expand(x, {16, 3, 37, 41}), w, {}, o);
  auto first = slice(batch, 0, 0, 1).to_vector<double>();  // many units: whole images
  ASSERT_EQ(single.size(), first.size());
  for (std::size_t i = 0; i < single.size(); ++i) ASSERT_NEAR(single[i], first[i], 1e-12) << i;
}

}  // namespace
}  // namespace loom
