// Host transforms: values, determinism per (seed, epoch, index), and error messages.
#include "test_util.h"

#include <loom/data/transforms.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

namespace loom::data {
namespace {

using ::testing::HasSubstr;

Example image(int64_t c, int64_t h, int64_t w) {
  std::vector<uint8_t> px(static_cast<std::size_t>(c * h * w));
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i);
  Example e;
  e["input"] = HostArray::from_vector<uint8_t>(px, {c, h, w});
  return e;
}

TEST(Transforms, ToFloatScalesUint8AndCastConverts) {
  Example e = image(1, 2, 2);
  e["target"] = HostArray::from_vector<uint8_t>({3}, {});
  to_float()(e, {});
  cast("target", HostDType::Int64)(e, {});
  ASSERT_EQ(e.at("input").dtype, HostDType::Float32);
  EXPECT_FLOAT_EQ(e.at("input").data<float>()[3], 3.0f / 255.0f);
  EXPECT_EQ(e.at("target").data<int64_t>()[0], 3);
  EXPECT_EQ(e.at("target").shape, Shape{});
  // Floats truncate toward zero; one the integer dtype cannot hold is an error naming it.
  e["score"] = HostArray::from_vector<float>({-0.5f, 2.75f}, {2});
  cast("score", HostDType::UInt8)(e, {});
  EXPECT_EQ(e.at("score").data<uint8_t>()[0], 0);
  EXPECT_EQ(e.at("score").data<uint8_t>()[1], 2);
  for (float bad : {300.0f, -1.0f, std::nanf("")}) {
    e["score"] = HostArray::from_vector<float>({1.0f, bad}, {2});
    const std::string msg = test::error_of([&] { cast("score", HostDType::UInt8)(e, {}); });
    EXPECT_NE(msg.find("cast: field 'score' float32[2]: the value"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(element 1) does not fit in uint8"), std::string::npos) << msg;
  }
}

TEST(Transforms, NormalizePerChannel) {
  Example e = image(2, 1, 2);  // channel 0: 0,1; channel 1: 2,3
  compose({to_float(), normalize({0.0, 2.0 / 255}, {1.0 / 255, 2.0 / 255})})(e, {});
  const float* p = e.at("input").data<float>();
  EXPECT_NEAR(p[0], 0.0, 1e-5);
  EXPECT_NEAR(p[1], 1.0, 1e-5);
  EXPECT_NEAR(p[2], 0.0, 1e-5);
  EXPECT_NEAR(p[3], 0.5, 1e-5);
  Example raw = image(2, 1, 2);
  EXPECT_THAT(test::error_of([&] { normalize({0.5}, {0.5})(raw, {}); }), HasSubstr("apply to_float first"));
  Example f = image(3, 1, 2);
  to_float()(f, {});
  EXPECT_THAT(test::error_of([&] { normalize({0, 0}, {1, 1})(f, {}); }), HasSubstr("has 3 channels"));
}

TEST(Transforms, RandomCropWithPaddingMatchesAManualCrop) {
  const auto crop = random_crop({4, 4}, 2, "input", /*fill=*/0);
  const uint64_t stream = stream_id("random_crop:input");
  int shifted = 0;
  for (int64_t index = 0; index < 40; ++index) {
    Example e = image(2, 4, 4);
    const Example original = e;
    const SampleContext ctx{9, 1, index};
    crop(e, ctx);
    ASSERT_EQ(e.at("input").shape, (Shape{2, 4, 4}));
    const int64_t top = ctx.uniform_int(stream, 5) - 2, left = ctx.uniform_int(stream + 1, 5) - 2;
    shifted += top != 0 || left != 0;
    const uint8_t* in = original.at("input").data<uint8_t>();
    const uint8_t* out = e.at("input").data<uint8_t>();
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t y = 0; y < 4; ++y)
        for (int64_t x = 0; x < 4; ++x) {
          const int64_t sy = y + top, sx = x + left;
          const uint8_t want = sy >= 0 && sy < 4 && sx >= 0 && sx < 4 ? in[(c * 4 + sy) * 4 + sx] : 0;
          ASSERT_EQ(out[(c * 4 + y) * 4 + x], want) << "index " << index << " c" << c << " y" << y << " x" << x;
        }
  }
  EXPECT_GT(shifted, 20);
  Example e = image(1, 3, 3);
  EXPECT_THAT(test::error_of([&] { random_crop({8, 8}, 1)(e, {}); }), HasSubstr("larger than field 'input'"));
  // A fill the image's dtype cannot hold is an error (300 became 255 in uint8, -1 undefined).
  for (double fill : {300.0, -1.0, 0.5})
    EXPECT_THAT(test::error_of([&] { random_crop({3, 3}, 1, "input", fill)(e, {}); }),
                HasSubstr("is not a value of field 'input' (uint8"))
        << fill;
  random_crop({3, 3}, 1, "input", 255)(e, {});
}

TEST(Transforms, FlipIsDeterministicPerSampleAndReversesRows) {
  const auto flip = random_horizontal_flip(0.5);
  int flipped = 0;
  for (int64_t index = 0; index < 200; ++index) {
    Example a = image(1, 2, 3), b = image(1, 2, 3);
    const SampleContext ctx{1, 0, index};
    flip(a, ctx);
    flip(b, ctx);
    EXPECT_EQ(a.at("input").bytes, b.at("input").bytes);
    if (a.at("input").bytes != image(1, 2, 3).at("input").bytes) {
      ++flipped;
      EXPECT_EQ(a.at("input").bytes, (std::vector<unsigned char>{2, 1, 0, 5, 4, 3}));
    }
  }
  EXPECT_GT(flipped, 70);
  EXPECT_LT(flipped, 130);
  Example f = image(1, 1, 4);
  to_float()(f, {});
  random_horizontal_flip(1.0)(f, {});
  EXPECT_FLOAT_EQ(f.at("input").data<float>()[0], 3.0f / 255);
}

TEST(Transforms, ContextDrawsDependOnEveryCoordinate) {
  const SampleContext a{1, 2, 3};
  EXPECT_EQ(a.random(5), (SampleContext{1, 2, 3}.random(5)));
  EXPECT_NE(a.random(5), (SampleContext{2, 2, 3}.random(5)));
  EXPECT_NE(a.random(5), (SampleContext{1, 3, 3}.random(5)));
  EXPECT_NE(a.random(5), (SampleContext{1, 2, 4}.random(5)));
  EXPECT_NE(a.random(5), a.random(6));
  const double u = a.uniform(0);
  EXPECT_GE(u, 0.0);
  EXPECT_LT(u, 1.0);
}

}  // namespace
}  // namespace loom::data
