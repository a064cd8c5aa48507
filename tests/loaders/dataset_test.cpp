// Host arrays, collation, the in-memory/synthetic/token-window datasets, samplers, batching.
#include "test_util.h"

#include <loom/data/dataset.h>
#include <loom/data/sampler.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

namespace loom::data {
namespace {

using ::testing::HasSubstr;

TEST(HostArray, TypedAccessChecksTheDtype) {
  auto a = HostArray::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(a.str(), "float32[2,3]");
  EXPECT_EQ(a.data<float>()[4], 5.0f);
  EXPECT_EQ(a.at(5), 6.0);
  EXPECT_THAT(test::error_of([&] { a.data<int64_t>(); }), HasSubstr("requested int64 elements from a float32 array"));
  EXPECT_THAT(test::error_of([] { HostArray::from_vector<int64_t>({1, 2}, {3}); }), HasSubstr("expected 3 values"));
}

TEST(Example, MissingFieldNamesTheFieldsPresent) {
  Example e;
  e["input"] = HostArray(HostDType::UInt8, {2});
  e["target"] = HostArray(HostDType::Int64, {});
  EXPECT_THAT(test::error_of([&] { e.at("label"); }), HasSubstr("no field 'label' (fields: input, target)"));
}

TEST(Collate, StacksAndChecksShapes) {
  Example a, b;
  a["x"] = HostArray::from_vector<int32_t>({1, 2}, {2});
  b["x"] = HostArray::from_vector<int32_t>({3, 4}, {2});
  a["y"] = HostArray::from_vector<float>({0.5f}, {});
  b["y"] = HostArray::from_vector<float>({1.5f}, {});
  Example c = collate({a, b});
  EXPECT_EQ(c.at("x").shape, (Shape{2, 2}));
  EXPECT_EQ(std::vector<int32_t>(c.at("x").data<int32_t>(), c.at("x").data<int32_t>() + 4),
            (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(c.at("y").shape, (Shape{2}));
  b["x"] = HostArray::from_vector<int32_t>({3, 4, 5}, {3});
  EXPECT_THAT(test::error_of([&] { collate({a, b}); }),
              HasSubstr("sample 1 field 'x' is int32[3], expected int32[2]"));
}

TEST(InMemoryDataset, RowsAndLengthCheck) {
  auto x = HostArray::from_vector<float>({0, 1, 2, 3, 4, 5}, {3, 2});
  auto y = HostArray::from_vector<int64_t>({7, 8, 9}, {3});
  InMemoryDataset ds({{"input", x}, {"target", y}});
  ASSERT_EQ(ds.size(), 3);
  auto e = ds.get(1);
  EXPECT_EQ(e.at("input").shape, (Shape{2}));
  EXPECT_EQ(e.at("input").data<float>()[1], 3.0f);
  EXPECT_EQ(e.at("target").data<int64_t>()[0], 8);
  auto batch = ds.get_batch(std::vector<int64_t>{2, 0, 2});
  ASSERT_EQ(batch.size(), 3u);
  EXPECT_EQ(batch[0].at("target").data<int64_t>()[0], 9);
  EXPECT_EQ(batch[1].at("target").data<int64_t>()[0], 7);
  EXPECT_THAT(test::error_of([&] { ds.get(3); }), HasSubstr("index 3 out of range [0, 3)"));
  auto short_y = HostArray::from_vector<int64_t>({7, 8}, {2});
  EXPECT_THAT(test::error_of([&] { InMemoryDataset({{"input", x}, {"target", short_y}}); }),
              HasSubstr("different lengths"));
}

TEST(SyntheticDataset, DeterministicPerSeedAndIndexWithinRange) {
  std::map<std::string, FieldSpec> fields{{"input", {HostDType::UInt8, {1, 4, 4}, 0, 256}},
                                          {"target", {HostDType::Int64, {}, 0, 10}},
                                          {"noise", {HostDType::Float32, {3}, -1, 1}}};
  SyntheticDataset a(100, fields, 5), b(100, fields, 5), c(100, fields, 6);
  EXPECT_EQ(a.get(17).at("input").bytes, b.get(17).at("input").bytes);
  EXPECT_NE(a.get(17).at("input").bytes, c.get(17).at("input").bytes);
  EXPECT_NE(a.get(17).at("input").bytes, a.get(18).at("input").bytes);
  std::set<int64_t> labels;
  for (int64_t i = 0; i < 100; ++i) {
    auto e = a.get(i);
    const int64_t t = e.at("target").data<int64_t>()[0];
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 10);
    labels.insert(t);
    for (int k = 0; k < 3; ++k) {
      EXPECT_GE(e.at("noise").data<float>()[k], -1.0f);
      EXPECT_LT(e.at("noise").data<float>()[k], 1.0f);
    }
  }
  EXPECT_EQ(labels.size(), 10u);
  // A range its integer dtype cannot hold is refused, not wrapped.
  const std::string msg = test::error_of([] {
    SyntheticDataset(10, {{"input", {HostDType::UInt8, {2}, 0, 1000}}}, 1);
  });
  EXPECT_NE(msg.find("field 'input' is uint8, which cannot hold [0.000000, 1000.000000)"), std::string::npos) << msg;
}

TEST(TokenWindowDataset, InputAndTargetAreShiftedByOne) {
  std::vector<uint8_t> text(50);
  std::iota(text.begin(), text.end(), uint8_t{100});
  TokenWindowDataset seq(HostArray::from_vector<uint8_t>(text, {50}), 8, {.random = false});
  EXPECT_EQ(seq.size(), 49 / 8);
  auto e = seq.get(2);
  ASSERT_EQ(e.at("input").shape, (Shape{8}));
  EXPECT_EQ(e.at("input").dtype, HostDType::Int64);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(e.at("input").data<int64_t>()[i], 100 + 16 + i);
    EXPECT_EQ(e.at("target").data<int64_t>()[i], 100 + 16 + i + 1);
  }

  TokenWindowDataset rnd(HostArray::from_vector<uint8_t>(text, {50}), 8, {.windows = 2000, .seed = 3});
  std::set<int64_t> starts;
  for (int64_t i = 0; i < 2000; ++i) {
    const int64_t s = rnd.window_start(i, 0);
    EXPECT_GE(s, 0);
    EXPECT_LE(s + 8, 49);  // the target's last token is text[s + 8]
    starts.insert(s);
  }
  EXPECT_EQ(starts.size(), 42u) << "every valid start is drawn";
  EXPECT_NE(rnd.window_start(5, 0), rnd.window_start(5, 1)) << "epochs differ (almost surely)";
  rnd.set_epoch(1);
  EXPECT_EQ(rnd.get(5).at("input").data<int64_t>()[0], 100 + rnd.window_start(5, 1));
  EXPECT_THAT(test::error_of([] { TokenWindowDataset(HostArray::from_vector<uint8_t>({1, 2, 3}, {3}), 8); }),
              HasSubstr("cannot hold one window"));
}

TEST(TokenWindowDataset, ErrorsNameTheSourceTokenAndValue) {
  EXPECT_EQ(test::error_of([] {
              TokenWindowDataset(HostArray::from_vector<uint8_t>({1, 2, 3}, {3}), 8, {}, "data/f.h5 val/tokens");
            }),
            "TokenWindowDataset ('data/f.h5 val/tokens'): 3 tokens cannot hold one window of seq_len + 1 = 9");
  std::vector<int32_t> tokens(20, 7);
  tokens[5] = 300;
  tokens[11] = -2;
  const ValueRange vocab{0, 256, "a token (--vocab)"};
  EXPECT_EQ(test::error_of([&] {
              TokenWindowDataset(HostArray::from_vector(tokens, {20}), 4, {.range = vocab}, "data/f.h5 train/tokens");
            }),
            "TokenWindowDataset ('data/f.h5 train/tokens'): token 5 is 300, expected a token (--vocab) in [0, 256) "
            "(out of range: 2 of 20 tokens)");
  tokens[5] = tokens[11] = 255;
  EXPECT_EQ(TokenWindowDataset(HostArray::from_vector(tokens, {20}), 4, {.range = vocab}).size(), 19 / 4);
}

TEST(CheckValues, NamesTheFirstValueOutOfRangeAndCountsThem) {
  const ValueRange classes{0, 10, "a class"};
  EXPECT_NO_THROW(check_values(HostArray::from_vector<uint8_t>({0, 9, 3}, {3}), classes, "src"));
  EXPECT_EQ(test::error_of([&] { check_values(HostArray::from_vector<uint8_t>({0, 10, 3}, {3}), classes, "src"); }),
            "src: sample 1 is 10, expected a class in [0, 10) (out of range: 1 of 3 samples)");
  EXPECT_EQ(test::error_of([&] {
              check_values(HostArray::from_vector<int64_t>({1, 2, 3, -4, 5, 60}, {3, 2}), classes, "src", 100, "row");
            }),
            "src: row 101 element 1 is -4, expected a class in [0, 10) (out of range: 2 of 6 values)");
  EXPECT_EQ(test::error_of([&] { check_values(HostArray::from_vector<int64_t>({12}, {}), classes, "src", 17); }),
            "src: sample 17 is 12, expected a class in [0, 10) (out of range: 1 of 1 samples)");
  EXPECT_EQ(test::error_of([&] { check_values(HostArray::from_vector<double>({1.0}, {1}), classes, "src"); }),
            "src: expected integers (a class in [0, 10)), got float64 values");
  EXPECT_EQ(test::error_of([&] { check_values(HostArray::from_vector<int32_t>({1}, {1}), {5, 5, "a class"}, "src"); }),
            "src: an empty range of values, a class in [5, 5)");
}

TEST(Sampler, RandomIsAPermutationThatDependsOnSeedAndEpoch) {
  RandomSampler s(1000, 7);
  auto e0 = s.indices(0), e1 = s.indices(1);
  auto sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_NE(e0, iota);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(e0, RandomSampler(1000, 7).indices(0)) << "a pure function of (seed, epoch)";
  EXPECT_NE(e0, RandomSampler(1000, 8).indices(0));
  EXPECT_EQ(SequentialSampler(5).indices(3), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(Sampler, ShardsCoverTheDatasetExactlyOnceAcrossRanks) {
  for (bool shuffle : {false, true}) {
    const int64_t n = 120, world = 4;
    std::vector<int64_t> all;
    for (int64_t r = 0; r < world; ++r) {
      DistributedSampler s(n, r, world, {.shuffle = shuffle, .seed = 11});
      auto idx = s.indices(2);
      EXPECT_EQ(static_cast<int64_t>(idx.size()), n / world);
      EXPECT_EQ(s.size(), n / world);
      all.insert(all.end(), idx.begin(), idx.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> iota(n);
    std::iota(iota.begin(), iota.end(), 0);
    EXPECT_EQ(all, iota) << "shuffle=" << shuffle;
  }
}

TEST(Sampler, UnevenShardsPadOrDrop) {
  const int64_t n = 10, world = 4;
  std::map<int64_t, int> seen_pad, seen_drop;
  for (int64_t r = 0; r < world; ++r) {
    auto pad = DistributedSampler(n, r, world, {.shuffle = true, .seed = 1}).indices(0);
    auto drop = DistributedSampler(n, r, world, {.shuffle = true, .seed = 1, .drop_last = true}).indices(0);
    EXPECT_EQ(pad.size(), 3u);
    EXPECT_EQ(drop.size(), 2u);
    for (auto i : pad) ++seen_pad[i];
    for (auto i : drop) ++seen_drop[i];
  }
  EXPECT_EQ(seen_pad.size(), 10u) << "padding: every sample seen";
  int twice = 0;
  for (auto [i, k] : seen_pad) twice += k == 2;
  EXPECT_EQ(twice, 2);
  EXPECT_EQ(seen_drop.size(), 8u) << "drop_last: each at most once";
  for (auto [i, k] : seen_drop) EXPECT_EQ(k, 1);
  EXPECT_THAT(test::error_of([] { DistributedSampler(10, 4, 4); }), HasSubstr("0 <= rank < world_size"));
}

TEST(MakeBatches, DropPadKeep) {
  std::vector<int64_t> idx{5, 6, 7, 8, 9, 10, 11};
  auto drop = make_batches(idx, 3, LastBatch::Drop);
  ASSERT_EQ(drop.size(), 2u);
  EXPECT_EQ(drop[1], (std::vector<int64_t>{8, 9, 10}));
  auto pad = make_batches(idx, 3, LastBatch::Pad);
  ASSERT_EQ(pad.size(), 3u);
  EXPECT_EQ(pad[2], (std::vector<int64_t>{11, 5, 6})) << "padding repeats from the start";
  auto keep = make_batches(idx, 3, LastBatch::Keep);
  EXPECT_EQ(keep[2], (std::vector<int64_t>{11}));
  EXPECT_EQ(make_batches({1, 2}, 5, LastBatch::Pad)[0], (std::vector<int64_t>{1, 2, 1, 2, 1}));
}

}  // namespace
}  // namespace loom::data
