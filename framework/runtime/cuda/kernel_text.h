// Small text helpers that the op generators (codegen_ops.cpp, codegen_index.cpp) share: the
// entry point's signature, integer literals, the index type and the launch of a flat grid.
// Every size is a constant in the generated source, so these only spell numbers and names.
#pragma once

#include "runtime/cuda/codegen.h"

#include <loom/dtype.h>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::runtime::cuda::text {

inline constexpr int kThreads = 256;  // threads per block of a flat (one thread per element) grid

// An integer literal: plain when it fits an int (so int arithmetic stays int), else i64.
inline std::string num(int64_t v) {
  const bool small = v >= -(int64_t{1} << 31) + 1 && v < (int64_t{1} << 31);
  return std::to_string(v) + (small ? "" : "LL");
}

// The row-major strides (in elements) of a contiguous tensor of shape `s`.
inline std::vector<int64_t> contiguous(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (std::size_t d = s.size(); d-- > 0;) {
    st[d] = acc;
    acc *= s[d];
  }
  return st;
}

// An i64 literal, for comparisons with i64 values.
inline std::string wide(int64_t v) { return std::to_string(v) + "LL"; }

// The type a kernel indexes with: int while every offset it forms stays below 2^31 (cheaper
// division by constants and half the registers), i64 beyond.
inline const char* index_type(int64_t largest_extent) {
  return largest_extent < (int64_t{1} << 31) ? "int" : "i64";
}

// The unsigned type of an element's width: what a copy moves, whatever the dtype.
inline const char* bits_type(DType t) {
  switch (dtype_size(t)) {
    case 1: return "unsigned char";
    case 2: return "unsigned short";
    case 4: return "unsigned int";
    default: return "unsigned long long";
  }
}

// `extern "C" __global__ void <entry>(void* out_, const void* a0_, ...) {` with one parameter
// per operand of the instruction, used or not (the backend passes them all, in order).
inline std::string signature(const std::string& entry, std::size_t args) {
  std::string s = "extern \"C\" __global__ void " + entry + "(void* out_";
  for (std::size_t k = 0; k < args; ++k) s += ", const void* a" + std::to_string(k) + "_";
  return s + ") {\n";
}

// A 1-D grid of kThreads-thread blocks covering `n` threads (n > 0).
inline Launch flat_launch(const std::string& entry, int64_t n) {
  return Launch{entry, (n + kThreads - 1) / kThreads, kThreads, 0};
}

// The first lines of a one-thread-per-element kernel over `n` elements: `t` is the element,
// in type `I`, and threads past the end return.
inline std::string flat_head(const std::string& entry, std::size_t args, int64_t n,
                             const char* index) {
  return signature(entry, args) + "  const i64 t64 = thread_index();\n  if (t64 >= " +
         std::to_string(n) + "LL) return;\n  const " + index + " t = (" + index + ")t64;\n";
}

}  // namespace loom::runtime::cuda::text
