// Acceptance 7: bad input throws loom::Error naming the op, what was expected and what was got.
#include "test_util.h"

#include <gmock/gmock.h>

#include <cmath>
#include <limits>

namespace loom {
namespace {

using test::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(Errors, AddShapeMismatch) {
  auto a = zeros({2, 3});
  auto b = zeros({4});
  auto msg = error_of([&] { add(a, b); });
  EXPECT_THAT(msg, HasSubstr("add: "));
  EXPECT_THAT(msg, HasSubstr("[2,3]"));
  EXPECT_THAT(msg, HasSubstr("[4]"));
}

TEST(Errors, MatmulShapeMismatch) {
  auto msg = error_of([] { matmul(zeros({2, 3}), zeros({4, 5})); });
  EXPECT_THAT(msg, HasSubstr("matmul: expected a [..., M, K] x [..., K, N] product, got [2,3] and [4,5]"));
}

TEST(Errors, Conv2dWrongRankAndChannels) {
  auto msg = error_of([] { conv2d(zeros({3, 32, 32}), zeros({8, 3, 3, 3})); });
  EXPECT_EQ(msg, "conv2d: expected a 4-D input [N,C,H,W], got [3,32,32]");
  msg = error_of([] { conv2d(zeros({1, 4, 8, 8}), zeros({8, 3, 3, 3})); });
  EXPECT_THAT(msg, HasSubstr("conv2d: expected weight [O,C/groups,kh,kw] with C = 4"));
  EXPECT_THAT(msg, HasSubstr("[8,3,3,3]"));
  msg = error_of([] { conv2d(zeros({1, 3, 2, 2}), zeros({8, 3, 3, 3})); });
  EXPECT_THAT(msg, HasSubstr("larger than the padded input"));
}

TEST(Errors, WrongDtype) {
  auto msg = error_of([] { add(zeros({2}), zeros({2}, DType::Float64)); });
  EXPECT_EQ(msg, "add: expected operands of one dtype, got float32 and float64");
  msg = error_of([] { exp(zeros({2}, DType::Int64)); });
  EXPECT_EQ(msg, "exp: expected a floating-point tensor (float32 or float64), got int64");
  msg = error_of([] { gather(zeros({2, 2}), 1, zeros({2, 2}, DType::Int32)); });
  EXPECT_EQ(msg, "gather: expected an index of dtype int64, got int32");
  msg = error_of([] { zeros({2}).to_vector<double>(); });
  EXPECT_EQ(msg, "to_vector: expected a tensor of dtype float64, got float32");
}

TEST(Errors, EmptyOrNegativeDimensions) {
  EXPECT_EQ(error_of([] { zeros({2, 0}); }), "full: expected positive sizes, got [2,0]");
  EXPECT_EQ(error_of([] { ones({-3}); }), "full: expected positive sizes, got [-3]");
  EXPECT_EQ(error_of([] { from_vector<float>({}, {0}); }), "from_host: expected positive sizes, got [0]");
  EXPECT_THAT(error_of([] { reshape(zeros({4}), {2, -2}); }), HasSubstr("reshape: expected positive sizes"));
  EXPECT_THAT(error_of([] { slice(zeros({4}), 0, 3, 1); }), HasSubstr("slice: expected a non-empty range"));
  EXPECT_THAT(error_of([] { rand({3, 0}, 1); }), HasSubstr("rand: expected a result with positive sizes"));
  EXPECT_THAT(error_of([] { from_vector<float>({1, 2, 3}, {2, 2}); }),
              HasSubstr("from_vector: expected 4 values for shape [2,2], got 3"));
}

TEST(Errors, ReadingAfterTheDeviceBufferFailed) {
  wait_device_ops();
  auto x = from_vector<float>({1, 2, 3, 4}, {2, 2});
  auto idx = from_vector<int64_t>({0, 7, 1, 0}, {2, 2});  // 7 is out of range
  auto g = gather(x, 1, idx);
  auto after = g * 2.0;
  mark_step();  // queues; the failure happens on the device thread
  auto msg = error_of([&] { g.to_vector<float>(); });
  EXPECT_THAT(msg, HasSubstr("to_vector: the device buffer of this tensor failed"));
  EXPECT_THAT(msg, HasSubstr("gather"));
  EXPECT_THAT(msg, HasSubstr("7"));
  // A later step that reads the failed buffer fails too, with the cause.
  auto later = after + 1.0;
  mark_step();
  EXPECT_THAT(error_of([&] { later.to_vector<float>(); }), HasSubstr("gather"));
  // ... and says so once, however many steps the failure went through.
  for (int step = 0; step < 3; ++step) {
    later = later * 2.0;
    mark_step();
  }
  const std::string through = error_of([&] { later.to_vector<float>(); });
  const std::string said = "an input of this step had failed: ";
  EXPECT_EQ(through.find(said), through.rfind(said)) << through;
  // The engine goes on working.
  EXPECT_EQ((x + x).to_vector<float>(), (std::vector<float>{2, 4, 6, 8}));
}

// An allocation that fails names what it was for: the op, its result's dtype, shape and
// size. (256 TiB: beyond x86-64's 128 TiB of user address space, so it fails whatever the
// machine's overcommit policy.)
TEST(Errors, OutOfMemoryNamesTheOpAndItsResult) {
  const int64_t side = int64_t{1} << 23;
  auto big = expand(reshape(ones({1}), {1, 1}), {side, side}) * 2.0f;
  const std::string msg = error_of([&] { big.to_vector<float>(); });
  EXPECT_THAT(msg, HasSubstr("the result of "));  // the op the compiler left: an expand here
  EXPECT_THAT(msg, HasSubstr(" (float32[8388608,8388608], 262144.0 GiB): "));
  EXPECT_THAT(msg, HasSubstr("out of memory"));
  // The engine goes on working.
  EXPECT_EQ((ones({2}) + 1.0f).to_vector<float>(), (std::vector<float>{2, 2}));
}

TEST(Errors, MiscellaneousBadInput) {
  EXPECT_THAT(error_of([] { zeros({2, 2}).item<float>(); }), HasSubstr("item: expected a tensor with one element"));
  EXPECT_THAT(error_of([] { zeros({2}).to(Device{DeviceType::CPU, 1}); }), HasSubstr("no device cpu:1 (registered: cpu:0"));
  EXPECT_THAT(error_of([] { sum(zeros({2, 3}), {2}); }), HasSubstr("sum: expected a dimension in [-2, 2), got 2"));
  EXPECT_THAT(error_of([] { Tensor t; exp(t); }), HasSubstr("exp: expected a defined tensor"));
  EXPECT_THAT(error_of([] { concat({zeros({2, 3}), zeros({3, 2})}, 0); }), HasSubstr("concat: expected shapes that match"));
  EXPECT_THAT(error_of([] { one_hot(zeros({3}, DType::Int64), 0); }), HasSubstr("one_hot: expected a positive number"));
  EXPECT_THAT(error_of([] { max_pool2d(zeros({1, 1, 2, 2}), {.kernel = {3, 3}}); }), HasSubstr("max_pool2d: kernel 3"));
}

// Sizes, padding and scalars that do not fit in int64 are errors, not wrapped values.
TEST(Errors, SizesAndScalarsBeyondInt64) {
  const int64_t big = int64_t{1} << 32;
  EXPECT_THAT(error_of([&] { reshape(zeros({4}), {big, big, -1}); }), HasSubstr("more elements than an int64 counts"));
  EXPECT_THAT(error_of([&] { reshape(zeros({4}), {3, 0x5555555555555555, 3, 0x5555555555555555, 4}); }),
              HasSubstr("more elements than an int64 counts"));
  EXPECT_THAT(error_of([&] { from_vector<float>({}, {big, big}); }), HasSubstr("more elements than an int64 counts"));
  EXPECT_THAT(error_of([&] { one_hot(from_vector<int64_t>({0, 1}, {2}), int64_t{1} << 62); }),
              HasSubstr("more elements than an int64 counts"));
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(error_of([&] { pad(ones({5}), {kMax, kMax}); }), HasSubstr("overflows int64"));
  EXPECT_THAT(error_of([&] { max_pool2d(zeros({1, 1, 4, 4}), {.kernel = {3, 3}, .padding = {kMax / 2 + 1, 1}}); }),
              HasSubstr("expected padding at most half the kernel size"));
  // A step past the end takes the first element alone, as in PyTorch.
  EXPECT_EQ(slice(arange(10), 0, 0, 10, kMax).shape(), (Shape{1}));
  EXPECT_THAT(error_of([] { full({2}, std::nan(""), DType::Int64); }), HasSubstr("scalar: the value nan does not fit in int64"));
  EXPECT_THAT(error_of([] { zeros({2}, DType::Int32) + 3e9; }), HasSubstr("does not fit in int32"));
  // A pad value too (it filled with INT_MIN).
  const auto ints = from_vector<int32_t>({1, 2}, {2});
  EXPECT_THAT(error_of([&] { pad(ints, {1, 1}, std::nan("")); }), HasSubstr("pad: the value nan does not fit in int32"));
  EXPECT_THAT(error_of([&] { pad(ints, {1, 1}, 3e9); }), HasSubstr("pad: the value 3000000000.000000 does not fit in int32"));
  EXPECT_THAT(error_of([&] { pad(ints.to(DType::Int64), {1, 1}, 1e19); }), HasSubstr("does not fit in int64"));
  EXPECT_EQ(pad(ints, {1, 0}, -2.5).to_vector<int32_t>(), (std::vector<int32_t>{-2, 1, 2}));
  EXPECT_THAT(error_of([] { arange(0, 1e20); }), HasSubstr("expected start, end and step that fit in int64"));
  EXPECT_THAT(error_of([] { arange(0, std::numeric_limits<double>::infinity()); }), HasSubstr("fit in int64"));
  EXPECT_THAT(error_of([] { arange(-0x1p62, 0x1p62, 2); }), HasSubstr("fewer than 2^62 values"));
  EXPECT_THAT(error_of([] { arange(0, 1e20, 1, DType::Float32); }), HasSubstr("fewer than 2^62 values"));
  EXPECT_THAT(error_of([] { arange(0, std::numeric_limits<double>::infinity(), 1, DType::Float64); }),
              HasSubstr("fewer than 2^62 values"));
}

// A scalar takes the tensor's dtype: a fractional one cannot, with an integer or bool tensor
// (PyTorch would promote to float; loom does not promote), so it is an error, not a scalar
// truncated to 0 (x * 0.5 was all zeros). Whole numbers are fine.
TEST(Errors, AFractionalScalarWithAnIntegerTensor) {
  auto i = from_vector<int64_t>({2, 4}, {2});
  EXPECT_THAT(error_of([&] { i * 0.5; }),
              AllOf(HasSubstr("mul: the scalar 0.5 is not a whole number"), HasSubstr("int64"),
                    HasSubstr("convert the tensor first")));
  EXPECT_THAT(error_of([&] { 0.25 + i.to(DType::Int32); }), HasSubstr("add: the scalar 0.25 is not a whole number"));
  EXPECT_THAT(error_of([&] { i / 2.5; }), HasSubstr("div: the scalar 2.5"));
  EXPECT_THAT(error_of([&] { eq(i, i) - 0.5; }), HasSubstr("sub: the scalar 0.5 is not a whole number"));
  EXPECT_THAT(error_of([&] { i * std::nan(""); }), HasSubstr("the scalar nan is not a whole number"));
  EXPECT_EQ((i * 3.0 - 1.0).to_vector<int64_t>(), (std::vector<int64_t>{5, 11}));
  EXPECT_EQ((from_vector<float>({2, 4}, {2}) * 0.5).to_vector<float>(), (std::vector<float>{1, 2}));
}

// item<int64_t>() reads an integer element as it is stored (it went through a double:
// 2^53 + 1 came back as 2^53, INT64_MAX as INT64_MIN), and a value that does not fit the asked
// type is an error naming it, where the cast was undefined.
TEST(Errors, ItemReadsIntegersExactlyAndRefusesWhatDoesNotFit) {
  const int64_t odd = (int64_t{1} << 53) + 1, top = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(from_vector<int64_t>({odd}, {}).item<int64_t>(), odd);
  EXPECT_EQ(from_vector<int64_t>({top}, {1}).item<int64_t>(), top);
  EXPECT_EQ(from_vector<int32_t>({-7}, {}).item<int64_t>(), -7);
  EXPECT_EQ(from_vector<int64_t>({-7}, {}).item<int32_t>(), -7);
  EXPECT_EQ(full({}, -2.75).item<int64_t>(), -2);  // cut toward zero, as a cast
  EXPECT_EQ(full({}, 2.5).item<float>(), 2.5f);
  EXPECT_THAT(error_of([] { from_vector<int64_t>({int64_t{1} << 40}, {}).item<int32_t>(); }),
              HasSubstr("item: the value 1099511627776 does not fit in int32"));
  EXPECT_THAT(error_of([] { full({}, std::nan("")).item<int64_t>(); }),
              HasSubstr("item: the value nan does not fit in int64"));
  EXPECT_THAT(error_of([] { full({}, 1e19, DType::Float64).item<int64_t>(); }),
              HasSubstr("does not fit in int64"));
  EXPECT_THAT(error_of([] { full({}, 3e9).item<int32_t>(); }), HasSubstr("does not fit in int32"));
}

// A 0-d tensor has no dimension to read a size of: the ops that would are errors, as in
// PyTorch, and those PyTorch defines on it (dimension 0 or -1) give the tensor back.
TEST(Errors, ZeroDimensionalTensors) {
  const auto x = full({}, 3.0);
  const std::string none = "expected a tensor with at least one dimension, got a 0-d tensor";
  EXPECT_THAT(error_of([&] { (void)x.size(0); }), HasSubstr("size: " + none));
  EXPECT_THAT(error_of([&] { (void)x.size(-1); }), HasSubstr("size: " + none));
  EXPECT_THAT(error_of([&] { slice(x, 0, 0, 1); }), HasSubstr("slice: " + none));
  EXPECT_THAT(error_of([&] { transpose(x, 0, 1); }), HasSubstr("transpose: expected a dimension"));
  EXPECT_EQ(transpose(x, 0, -1).item<float>(), 3.0f);
  EXPECT_EQ(squeeze(x, 0).item<float>(), 3.0f);
  EXPECT_EQ(squeeze(x, -1).dim(), 0);
  EXPECT_THAT(error_of([&] { squeeze(x, 1); }), HasSubstr("squeeze: expected a dimension in [-1, 1), got 1"));
  EXPECT_THAT(error_of([&] { concat({x, x}, 0); }), HasSubstr("concat: " + none));
  EXPECT_THAT(error_of([&] { flatten(x, 0, 5); }), HasSubstr("flatten: expected a dimension in [-1, 1), got 5"));
  EXPECT_EQ(flatten(x).shape(), (Shape{1}));
  EXPECT_EQ(sum(x, {0}).item<float>(), 3.0f);
  EXPECT_THAT(error_of([&] { sum(x, {0, -1}); }), HasSubstr("sum: expected each axis once"));  // as PyTorch
  EXPECT_EQ(sum(x, {-1}).item<float>(), 3.0f);
  EXPECT_EQ(argmax(x, -1).item<int64_t>(), 0);
}

}  // namespace
}  // namespace loom
