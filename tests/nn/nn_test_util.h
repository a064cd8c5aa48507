// Helpers shared by the models tests.
#pragma once

#include "test_util.h"

#include <loom/autograd.h>
#include <loom/nn/module.h>

#include <cmath>
#include <functional>
#include <random>

#include <vector>

namespace loom::test {

// Every element of `t` as a double (one transfer).
inline std::vector<double> values(const Tensor& t) {
  auto h = t.to_host();
  std::vector<double> v(static_cast<std::size_t>(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i) v[static_cast<std::size_t>(i)] = h.at(i);
  return v;
}

inline void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

// Sets nn::default_dtype() for a scope.
class DefaultDTypeGuard {
 public:
  explicit DefaultDTypeGuard(DType dtype) : previous_(nn::default_dtype()) { nn::set_default_dtype(dtype); }
  ~DefaultDTypeGuard() { nn::set_default_dtype(previous_); }
  DefaultDTypeGuard(const DefaultDTypeGuard&) = delete;
  DefaultDTypeGuard& operator=(const DefaultDTypeGuard&) = delete;

 private:
  DType previous_;
};

// The (name, shape) list of named tensors.
inline std::vector<std::pair<std::string, Shape>> names_and_shapes(const nn::NamedTensors& ts) {
  std::vector<std::pair<std::string, Shape>> out;
  for (const auto& [n, t] : ts) out.emplace_back(n, t.shape());
  return out;
}

// n normal samples from a fixed seed (host data for inputs).
inline std::vector<double> random_vector(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist;
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// Checks the gradient of the scalar f(x) at x0 (float64) against central differences.
inline void expect_gradient_matches(const std::function<Tensor(const Tensor&)>& f, const std::vector<double>& x0,
                                    const Shape& shape, double tol = 1e-6) {
  auto x = from_vector(x0, shape);
  x.requires_grad_();
  auto analytic = values(grad(f(x), {x})[0]);
  ASSERT_EQ(analytic.size(), x0.size());
  constexpr double eps = 1e-6;
  for (std::size_t i = 0; i < x0.size(); ++i) {
    auto hi = x0, lo = x0;
    hi[i] += eps;
    lo[i] -= eps;
    double numeric = (f(from_vector(hi, shape)).item<double>() - f(from_vector(lo, shape)).item<double>()) / (2 * eps);
    EXPECT_NEAR(analytic[i], numeric, tol * std::max(1.0, std::abs(numeric))) << "element " << i;
  }
}

// Every parameter of `named` (a module's named_parameters()) has a finite, non-zero gradient:
// backward reached all of them.
inline void expect_every_gradient_finite_and_nonzero(const nn::NamedTensors& named) {
  for (const auto& [name, p] : named) {
    ASSERT_TRUE(p.grad().defined()) << name;
    double norm = 0;
    for (double g : values(p.grad())) {
      ASSERT_TRUE(std::isfinite(g)) << name;
      norm += g * g;
    }
    EXPECT_GT(norm, 0) << name;
  }
}

}  // namespace loom::test
