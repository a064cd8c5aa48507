// The fused elementwise kernel: runs a ir::Fusion (a straight-line program of
// elementwise steps, see compiler/program.h) over the result in blocks of kFusedBlock
// elements. Each block's values live in small scratch registers that stay in L1, so every
// operand is read once and the result written once, however long the chain.
#pragma once

#include "ir/program.h"
#include "runtime/cpu/fused_jit.h"
#include "runtime/cpu/kernels.h"

#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace loom::runtime {

inline constexpr int64_t kFusedBlock = 512;

struct StackedFold;  // below

// With `code` (compile_fused_code), sub-blocks run as its machine code where they can; the
// result is the same to the bit either way.
void fused_kernel(const ir::Fusion& fusion, std::span<const TensorView> in,
                  const TensorView& out, const FusedCode* code = nullptr);

// The fusion's machine code (fused_jit.h) on `isa` (default: the best of fused_isas()),
// expecting splats where the evaluator reads loads as one value and reading contiguous bfloat16
// operands itself where the isa can; `out` is the dtype the result is stored in (a reduction's
// prologue: the compute type). nullptr where it does not apply. Made once per compiled program.
// fold_width: as FusedCode::compile's (a reduction prologue's rows, rows_fold_width).
std::unique_ptr<const FusedCode> compile_fused_code(const ir::Fusion& fusion, DType out,
                                                   std::optional<FusedIsa> isa = std::nullopt,
                                                   int fold_width = 0);

// One unary, binary or ternary elementwise op (not Cast) alone, in any dtype its shape
// inference admits: operands contiguous and of the result's shape. It runs the very step a
// fusion runs (one implementation per op), so an op gives the same bits fused or alone.
void elementwise_kernel(ir::Op op, std::span<const TensorView> in, const TensorView& out);

// A Sum, Mean or Max (attr: its axes) of a fusion's result, which is never stored: the
// reduction evaluates the fusion (its prologue) over `in` as it reads (kernels_reduce.cpp).
void fused_reduce_kernel(ir::Op op, const ir::Attr& attr, const ir::Fusion& prologue,
                         std::span<const TensorView> in, const TensorView& out,
                         const FusedCode* code = nullptr);

// Sums or means of several prologues over the same operands `in`, reduced over the same axes
// (compiler/stack_reductions.h): out is [prologues.size(), reduced shape...], row j the
// reduction of prologues[j] (its code codes[j], or nullptr), each the bits it has alone.
// With `fold` (compile_stacked_fold), their rows are folded together in one pass.
void stacked_reduce_kernel(ir::Op op, const ir::Attr& attr,
                           std::span<const ir::Fusion* const> prologues,
                           std::span<const FusedCode* const> codes,
                           std::span<const TensorView> in, const TensorView& out,
                           const StackedFold* fold = nullptr);

// Whether stacked_reduce_kernel reads its prologues together, piece by piece, when they have
// this shape and are reduced over these axes (column sums over channels-last rows of 8, 16, 32
// or 64): the CPU target's Target::stack_reductions.
bool reads_stacked(const Shape& shape, const std::vector<int64_t>& axes);

// The row width at which a Sum or Mean of this shape over these axes folds its prologue's rows
// straight from the code's registers (FusedCode::fold_rows: column sums over channels-last rows
// of 8, 16, 32 or 64; the code folds those that are a multiple of its lanes); 0 where it does
// not.
int rows_fold_width(const Shape& shape, const std::vector<int64_t>& axes);

// A column sum over rows of W floats (a channels-last per-channel statistic) takes the rows in
// groups of kGroupRows: per column, a group's values are added in float as a fixed tree,
// ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), and that sum is added to the column's
// double sum. The group sum is within a few ulps of the exact sum; widening every element to
// double instead was the loop's bound (kernels_reduce.cpp's fold_fixed_rows). Unlike a double
// fold, a group can overflow with values near float's largest (PyTorch's float sums too).
inline constexpr int64_t kGroupRows = 8;

// One group: the rows at r, r + W, ..., r + 7 * W, folded into sums[0, W).
template <int W>
inline void add_row_group(const float* r, double* sums) {
  static_assert(kGroupRows == 8, "the tree sums eight rows");
  for (int j = 0; j < W; ++j, ++r)
    sums[j] += static_cast<double>(((r[0] + r[W]) + (r[2 * W] + r[3 * W])) +
                                   ((r[4 * W] + r[5 * W]) + (r[6 * W] + r[7 * W])));
}

// The row widths that fold_fixed_rows and fold_fusion_rows take: convolutional networks'
// channel counts.
constexpr bool fixed_rows(int64_t width) {
  return width == 8 || width == 16 || width == 32 || width == 64;
}

// The len / (kGroupRows * width) whole groups at v (len a multiple of a group), each folded by
// add_row_group; width as fixed_rows.
void fold_row_groups(const float* v, int64_t len, int64_t width, double* sums);

// Elements [begin, begin + len) of a float32 fusion's result (begin at a group's start) folded
// in rows of `width` (fixed_rows) into sums[0, width) as fold_row_groups folds them, a last short
// group padded with zeros; through the code's fold (FusedCode::fold_rows) where it has one for
// this width, so the values never go to memory.
void fold_fusion_rows(const ir::Fusion& fusion, std::span<const TensorView> in, int64_t begin,
                      int64_t len, int64_t width, double* sums, const FusedCode* code);

// A stacked sum's prologues (compiler/stack_reductions.h) merged into one fusion, their shared
// loads read once, with code that folds all their results together (FusedCode::compile_fold):
// one pass over the operands instead of one per prologue.
struct StackedFold {
  ir::Fusion fusion;          // the prologues' loads (each distinct one once) and steps
  std::vector<int> results;   // per prologue: its result among fusion's values
  std::unique_ptr<const FusedCode> code;
};

// The stacked fold of `prologues` in rows of `width` (rows_fold_width); nullptr where there is
// no such code (no fused code here, a width not a multiple of its lanes, registers).
std::unique_ptr<const StackedFold> compile_stacked_fold(
    std::span<const ir::Fusion* const> prologues, int width);

// Folds elements [begin, begin + len) of every prologue of `fold` (begin at a group's start)
// into sums + j * width for prologue j, as fold_fusion_rows folds each alone, in sub-blocks of
// whole groups; stops where a sub-block is not (a short last group, a load the code does not
// take there) and returns where it stopped, for the caller to fold the rest prologue by
// prologue.
int64_t fold_stacked_rows(const StackedFold& fold, std::span<const TensorView> in, int64_t begin,
                          int64_t len, int64_t width, double* sums);

// Elements [begin, begin + len) of a fusion's result, in its compute type T (float or
// double), written to dst: for kernels that take a fused prologue (reductions).
template <class T>
void eval_fusion(const ir::Fusion& fusion, std::span<const TensorView> in, int64_t begin,
                 int64_t len, T* dst, const FusedCode* code = nullptr);

// d[i] = op(a[i]) for a unary elementwise op, computed as a fusion step computes it (a and d
// must not overlap): the activation of a GEMM/conv epilogue, so that folding it into the
// product changes no bits of the result.
template <class T>
void unary_step(ir::Op op, const T* a, T* d, int64_t n);

// A Matmul or Conv2d with an epilogue (compiler/fuse_epilogue.h): out = activation(op(in[0],
// in[1]) + in[epilogue.bias]), the bias one value per column (matmul) or output channel (conv).
void epilogue_kernel(ir::Op op, const ir::Attr& attr, const ir::Epilogue& epilogue,
                     std::span<const TensorView> in, const TensorView& out);

}  // namespace loom::runtime
