// Three training steps of ResNet-20 and the decoder against PyTorch, in float64 and float32
// (fixtures from tests/reference/make_training_fixtures.py). Weights and data are closed-form
// functions of (state_dict index, element index), computed here exactly as the script does.
// The updates are loom's own optimizers (SGD with momentum and weight decay, AdamW) through
// optimizer_step(opt, barrier), so this checks models, autograd and optim together. Each run
// is made on the CPU and on the test suite's second backend ("guarded"), against the same
// fixtures.
#include "backend/guarded_backend.h"
#include "test_device.h"
#include "nn/nn_test_util.h"

#include <loom/autograd.h>
#include <loom/metrics.h>
#include <loom/models/decoder.h>
#include <loom/models/resnet.h>
#include <loom/nn/functional.h>
#include <loom/optim.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

namespace loom {
namespace {

namespace F = nn::functional;

struct ReferenceRun {
  std::vector<double> losses;
  std::vector<std::pair<std::string, std::vector<double>>> grads, states;  // 7 numbers per key
};

std::map<std::string, ReferenceRun> load_runs() {
  std::ifstream f(std::string(LOOM_TEST_DATA_DIR) + "/models/fixtures/training_reference.txt");
  std::map<std::string, ReferenceRun> runs;
  ReferenceRun* run = nullptr;
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string tag, key;
    in >> tag;
    if (tag == "run") {
      std::string model, dtype;
      in >> model >> dtype;
      run = &runs[model + " " + dtype];
    } else if (tag == "loss") {
      int step;
      double v;
      in >> step >> v;
      run->losses.push_back(v);
    } else if (tag == "grad" || tag == "state") {
      in >> key;
      std::vector<double> v(7);
      for (auto& x : v) in >> x;
      (tag == "grad" ? run->grads : run->states).emplace_back(key, v);
    }
  }
  return runs;
}

double det_value(int64_t i, int64_t k, double scale, double offset = 0) {
  return offset + scale * std::sin(0.7 * static_cast<double>(i) + 1.9 * static_cast<double>(k) + 0.3);
}

// det_values(n, k, scale, offset) of the script, rounded to `dtype`.
Tensor det_tensor(const Shape& shape, int64_t k, double scale, double offset, DType dtype) {
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = det_value(static_cast<int64_t>(i), k, scale, offset);
  if (dtype == DType::Float64) return from_vector(v, shape);
  std::vector<float> f(v.begin(), v.end());
  return from_vector(f, shape);
}

// The script's det_init, by kind of state_dict entry.
void det_init(nn::Module& m, DType dtype) {
  nn::NamedTensors state;
  int64_t k = 0;
  for (const auto& [name, t] : m.state_dict()) {
    auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
    const Shape& s = t.shape();
    if (name.ends_with("num_batches_tracked")) {
      state.emplace_back(name, zeros({}, DType::Int64));
    } else if (name.ends_with("running_mean")) {
      state.emplace_back(name, det_tensor(s, k, 0.1, 0, dtype));
    } else if (name.ends_with("running_var")) {
      state.emplace_back(name, det_tensor(s, k, 0.2, 1, dtype));
    } else if (s.size() == 1 && (has("bn") || has("downsample.1") || has("norm"))) {
      state.emplace_back(name, det_tensor(s, k, 0.1, name.ends_with("weight") ? 1 : 0, dtype));
    } else if (s.size() == 1) {
      state.emplace_back(name, det_tensor(s, k, 0.05, 0, dtype));
    } else {
      int64_t fan_in = shape_numel(s) / s[0];
      state.emplace_back(name, det_tensor(s, k, 1 / std::sqrt(static_cast<double>(fan_in)), 0, dtype));
    }
    ++k;
  }
  m.load_state_dict(state);
}

// p1 s1 p2 s2 e0 e1 e2 as the script's summarize.
std::vector<double> summarize(int64_t k, const Tensor& t) {
  auto v = test::values(t);
  std::vector<double> out;
  for (int j = 0; j < 2; ++j) {
    double p = 0, s = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      double proj = std::cos(0.37 * static_cast<double>(i) + 1.3 * j + 0.11 * static_cast<double>(k));
      p += v[i] * proj;
      s += std::abs(v[i] * proj);
    }
    out.push_back(p);
    out.push_back(s);
  }
  for (std::size_t m = 0; m < 3; ++m) out.push_back(m < v.size() ? v[m] : 0.0);
  return out;
}

void expect_summary(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                    int64_t numel, double tol) {
  for (int j = 0; j < 2; ++j)
    EXPECT_NEAR(got[2 * j], want[2 * j], tol * want[2 * j + 1] + 1e-300) << what << " projection " << j;
  const double scale = want[1] / static_cast<double>(numel);  // typical magnitude of an element
  for (int m = 0; m < 3; ++m)
    EXPECT_NEAR(got[4 + m], want[4 + m], tol * (std::abs(want[4 + m]) + scale)) << what << " element " << m;
}

struct Case {
  std::string model;
  DType dtype;
  bool guarded = false;  // on the guarded device instead of the CPU
};

class TrainingReference : public ::testing::TestWithParam<Case> {};

TEST_P(TrainingReference, MatchesPyTorch) {
  const auto& c = GetParam();
  const bool f64 = c.dtype == DType::Float64;
  auto runs = load_runs();
  const std::string run_name = c.model + (f64 ? " float64" : " float32");
  ASSERT_TRUE(runs.count(run_name)) << "fixture has no run " << run_name;
  const ReferenceRun& ref = runs.at(run_name);
  test::DefaultDTypeGuard dtype(c.dtype);
  // LOOM_TEST_DEVICE (test_device.h) moves the CPU cases to that device: ctest's CUDA run.
  const Device device = c.guarded ? test::guarded_device() : test::test_device();
  const int64_t violations_before = test::guard_violations();

  std::shared_ptr<nn::Module> model;
  std::function<Tensor()> loss_fn;
  Tensor x, y, inp, tgt;
  if (c.model == "resnet20") {
    auto net = models::resnet("resnet20", 3, 10);
    model = net;
    x = det_tensor({4, 3, 16, 16}, 101, 1.0, 0, c.dtype);
    std::vector<int64_t> labels;
    for (int i = 0; i < 4; ++i) labels.push_back((7 * i + 3) % 10);
    y = from_vector(labels, {4});
    x = x.to(device);
    y = y.to(device);
    loss_fn = [&, net] { return F::cross_entropy(net->forward(x), y); };
  } else {
    models::DecoderConfig cfg{.vocab_size = 64, .hidden_size = 32, .num_layers = 2, .num_heads = 4,
                              .num_kv_heads = 2, .intermediate_size = 64, .max_seq_len = 16};
    auto lm = std::make_shared<models::Decoder>(cfg);
    model = lm;
    std::vector<int64_t> a, b;
    for (int r = 0; r < 2; ++r)
      for (int t = 0; t < 16; ++t) {
        a.push_back((13 * (r * 17 + t) + 5) % 64);
        b.push_back((13 * (r * 17 + t + 1) + 5) % 64);
      }
    inp = from_vector(a, {2, 16});
    tgt = from_vector(b, {2, 16});
    inp = inp.to(device);
    tgt = tgt.to(device);
    loss_fn = [&, lm] { return F::cross_entropy(lm->forward(inp).reshape({-1, 64}), tgt.reshape({-1})); };
  }
  model->to(device);
  det_init(*model, c.dtype);
  model->train();
  std::unique_ptr<optim::Optimizer> opt;
  if (c.model == "resnet20")
    opt = std::make_unique<optim::SGD>(model->parameters(),
                                       optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4});
  else
    opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamOptions{.lr = 1e-2, .weight_decay = 0.1});

  // The bar: float64 to 1e-9 (it agrees to ~1e-12 here); float32 losses to 1e-5 and
  // first-step gradients to 1e-4.
  const double tol = f64 ? 1e-10 : 1e-4;
  const double loss_tol = f64 ? 1e-10 : 1e-5;
  auto state = model->state_dict();
  for (int step = 0; step < 3; ++step) {
    opt->zero_grad();
    auto loss = loss_fn();
    ASSERT_EQ(loss.device(), device);
    loss.backward();
    mark_step();
    EXPECT_NEAR(test::values(loss)[0], ref.losses[step], loss_tol * std::abs(ref.losses[step])) << "step " << step;
    if (step == 0) {
      std::map<std::string, std::vector<double>> want(ref.grads.begin(), ref.grads.end());
      ASSERT_EQ(want.size(), model->named_parameters().size());
      for (std::size_t k = 0; k < state.size(); ++k) {
        const auto& [name, t] = state[k];
        if (!want.count(name)) continue;
        ASSERT_TRUE(t.grad().defined()) << name;
        expect_summary("grad " + name, summarize(static_cast<int64_t>(k), t.grad()), want.at(name), t.numel(), tol);
      }
    }
    optim::optimizer_step(*opt, /*barrier=*/true);
  }
  ASSERT_EQ(ref.states.size(), state.size());
  for (std::size_t k = 0; k < state.size(); ++k) {
    const auto& [name, t] = state[k];
    ASSERT_EQ(ref.states[k].first, name);
    expect_summary("state " + name, summarize(static_cast<int64_t>(k), t), ref.states[k].second, t.numel(),
                   name.ends_with("num_batches_tracked") ? 0 : tol);
    EXPECT_EQ(t.device(), device) << name;
  }
  if (c.guarded) {
    wait_device_ops();
    EXPECT_EQ(test::guard_violations(), violations_before);
    EXPECT_GT(metrics::counter("ExecuteProgram", device), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TrainingReference,
                         ::testing::Values(Case{"resnet20", DType::Float64}, Case{"resnet20", DType::Float32},
                                           Case{"decoder", DType::Float64}, Case{"decoder", DType::Float32},
                                           Case{"resnet20", DType::Float64, true},
                                           Case{"resnet20", DType::Float32, true},
                                           Case{"decoder", DType::Float64, true},
                                           Case{"decoder", DType::Float32, true}),
                         [](const auto& info) {
                           return info.param.model + (info.param.dtype == DType::Float64 ? "_float64" : "_float32") +
                                  (info.param.guarded ? "_guarded" : "");
                         });

}  // namespace
}  // namespace loom
