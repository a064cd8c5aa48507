// The runtime tests' tolerance for computed sums (convolutions, GEMMs), shared by the loom and
// oneDNN kernel tests: |got - want| <= tol * (|want| + rms(want)). Rounding errors in a sum scale
// with the magnitude of its terms, which rms(want) measures for the elements that cancel to
// near 0. LOOM_TEST_SHOW_ERRORS=1 prints the headroom: the worst error in units of the tolerance.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace loom::runtime {

inline void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double squares = 0;
  for (double w : want) squares += w * w;
  const double rms = want.empty() ? 0 : std::sqrt(squares / static_cast<double>(want.size()));
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double bound = tol * (std::abs(want[i]) + rms);
    worst = std::max(worst, std::abs(got[i] - want[i]) / bound);
    ASSERT_LE(std::abs(got[i] - want[i]), bound)
        << what << " at " << i << ": got " << got[i] << ", want " << want[i] << " (tolerance "
        << tol << " x (|want| + " << rms << "))";
  }
  if (std::getenv("LOOM_TEST_SHOW_ERRORS")) std::printf("%-60s %.4f\n", what.c_str(), worst);
}

}  // namespace loom::runtime
