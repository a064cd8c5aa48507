// loom::Error — the one exception type for everything a user can cause.
//
//   try { auto c = loom::matmul(a, b); }
//   catch (const loom::Error& e) { std::cerr << e.what(); }
//   // matmul: expected a [..., M, K] x [..., K, N] product, got [2,3] and [4,5]
//
// Messages name the op (or file), what was expected and what was got.
#pragma once

#include <stdexcept>
#include <string>

namespace loom {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace loom
