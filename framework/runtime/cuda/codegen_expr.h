// Pieces of CUDA C shared by the elementwise, epilogue (codegen_fused.cpp) and reduction
// (codegen_reduce.cpp) generators: the expression of each elementwise op, the conversions
// between storage and arithmetic types, strided offsets, and a fusion's straight-line body.
// Semantics follow the CPU backend (runtime/cpu/fused_steps.h, kernels_elementwise.cpp),
// which is the reference.
//
//   std::string body, last;
//   body += fusion_values(*in.fusion, "i", "    ", &last);   // const float v0 = ...; v1 = ...
//   body += "    o[i] = " + store_as(last, in.fusion->compute, in.dtype) + ";\n";
#pragma once

#include "ir/program.h"

#include <cstdint>
#include <string>
#include <vector>

namespace loom::runtime::cuda::gen {

// prefix followed by n in decimal: "v3", "x0".
std::string named(const char* prefix, int64_t n);

// The dtype arithmetic on `t` runs in: bfloat16 in float32, every other dtype in itself.
DType arith_dtype(DType t);

// A value of storage dtype `from` (an expression of storage_type(from)) as a value of
// arithmetic dtype `t` (static_cast, bfloat16 through float32).
std::string load_as(const std::string& v, DType from, DType t);
// A value of arithmetic dtype `t` stored as dtype `to`: bool is "not zero", bfloat16 rounds to
// nearest even (through float32), floating point to integer truncates as x86 does (NaN and
// out of range give the integer's lowest value, as the CPU backend computes it).
std::string store_as(const std::string& v, DType t, DType to);

// The expression of elementwise step `s` (an ir::Op with its Cast target or Constant value)
// computed in arithmetic dtype `t` on operands a, b, c (simple names of type compute_type(t)),
// of type compute_type(t); tests give 0 or 1. Throws loom::Error for an op `t` lacks (exp on
// int64, arithmetic on bool).
std::string step_expr(const ir::FusedStep& s, DType t, const std::string& a,
                      const std::string& b = {}, const std::string& c = {});

// The offset, in elements, of the result's flat index `idx` in an operand read through
// `sizes` (row-major split of the index) and `strides` (0: broadcast): constant divisions and
// remainders, none for a broadcast dimension.
std::string offset_expr(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                        const std::string& idx);

// "int" when every index below `bound` (and the grid-stride step past it) fits 32 bits, else
// "i64": 32-bit division by a constant is several times cheaper.
const char* index_type(int64_t bound);

// `extern "C" __global__ void __launch_bounds__(threads) name(void* out, const void* a0, ..)`
// with one operand address per argument of `in`, used or not.
std::string kernel_head(const std::string& name, int threads, std::size_t args);

// Declarations of typed operand pointers x0, x1, .. (`const float* __restrict__ x0 = ..`), and
// of the result `o` (storage_type(in.dtype)*). __restrict__ only when no operand may donate
// its buffer to the result (Instr::donors).
std::string pointers(const ir::Program& p, const ir::Instr& in, const std::string& indent);

// Throws unless every load of in.fusion names an operand of `in` in that operand's dtype (the
// type pointers() gives it).
void check_loads(const ir::Program& p, const ir::Instr& in);

// Lines computing every value of `f` at flat index `idx` of f.shape, each a `const` named v0,
// v1, .. in f.compute, reading operand k through pointer xk (pointers()); *last is the result's
// name. Where `loaded` is given and names an expression for load j (not empty), that
// expression (of the operand's storage type, read already) stands for load j's memory access.
std::string fusion_values(const ir::Fusion& f, const std::string& idx, const std::string& indent,
                          std::string* last, const std::vector<std::string>* loaded = nullptr);

// Blocks of `threads` for `n` elements, one per thread, at most kMaxBlocks (a grid-stride loop
// covers the rest).
inline constexpr int64_t kMaxBlocks = int64_t{1} << 20;
int64_t blocks_for(int64_t n, int threads);

}  // namespace loom::runtime::cuda::gen
