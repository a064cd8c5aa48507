#include <loom/nn/init.h>

#include <loom/autograd.h>
#include <loom/error.h>

#include <atomic>
#include <cmath>
#include <string>

namespace loom::nn {
namespace {

constexpr uint64_t splitmix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The generator is (base, counter); next_seed hashes both, so seeds drawn after
// manual_seed(1) and manual_seed(2) share no values even though the counters restart. It
// starts as manual_seed(0) leaves it.
std::atomic<uint64_t> g_base{splitmix(0)};
std::atomic<uint64_t> g_counter{0};

void check_float(const Tensor& t, const char* op) {
  if (!t.defined()) throw Error(std::string(op) + ": expected a defined tensor, got an empty handle");
  if (!is_floating(t.dtype()))
    throw Error(std::string(op) + ": expected a floating-point tensor, got " + dtype_name(t.dtype()));
}

void set(const Tensor& t, const Tensor& value) {
  NoGradGuard no_grad;
  t.assign(value);
}

double kaiming_std(const Tensor& t, double a, init::FanMode mode, init::Nonlinearity nl,
                   const char* op) {
  check_float(t, op);
  auto [fan_in, fan_out] = init::fan_in_and_fan_out(t.shape());
  int64_t fan = mode == init::FanMode::FanIn ? fan_in : fan_out;
  if (fan == 0) throw Error(std::string(op) + ": cannot initialise a tensor with zero elements " + shape_str(t.shape()));
  return init::calculate_gain(nl, a) / std::sqrt(static_cast<double>(fan));
}

}  // namespace

void manual_seed(uint64_t seed) {
  g_base.store(splitmix(seed));
  g_counter.store(0);
}

uint64_t next_seed() {
  uint64_t n = g_counter.fetch_add(1);
  return splitmix(g_base.load() ^ splitmix(n));
}

namespace init {

std::pair<int64_t, int64_t> fan_in_and_fan_out(const Shape& shape) {
  if (shape.size() < 2)
    throw Error("fan_in_and_fan_out: expected a tensor of at least 2 dimensions, got " + shape_str(shape));
  int64_t receptive = 1;
  for (std::size_t d = 2; d < shape.size(); ++d) receptive *= shape[d];
  return {shape[1] * receptive, shape[0] * receptive};
}

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::Linear: return 1;
    case Nonlinearity::Sigmoid: return 1;
    case Nonlinearity::Tanh: return 5.0 / 3.0;
    case Nonlinearity::ReLU: return std::sqrt(2.0);
    case Nonlinearity::LeakyReLU: return std::sqrt(2.0 / (1 + param * param));
  }
  throw Error("calculate_gain: unknown nonlinearity");
}

void uniform_(const Tensor& t, double low, double high) {
  check_float(t, "uniform_");
  set(t, uniform(t.shape(), low, high, next_seed(), t.dtype(), t.device()));
}

void normal_(const Tensor& t, double mean, double stddev) {
  check_float(t, "normal_");
  set(t, normal(t.shape(), mean, stddev, next_seed(), t.dtype(), t.device()));
}

void constant_(const Tensor& t, double value) {
  if (!t.defined()) throw Error("constant_: expected a defined tensor, got an empty handle");
  set(t, full(t.shape(), value, t.dtype(), t.device()));
}

void kaiming_uniform_(const Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity) {
  double bound = std::sqrt(3.0) * kaiming_std(t, a, mode, nonlinearity, "kaiming_uniform_");
  set(t, uniform(t.shape(), -bound, bound, next_seed(), t.dtype(), t.device()));
}

void kaiming_normal_(const Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity) {
  double stddev = kaiming_std(t, a, mode, nonlinearity, "kaiming_normal_");
  set(t, normal(t.shape(), 0, stddev, next_seed(), t.dtype(), t.device()));
}

}  // namespace init
}  // namespace loom::nn
