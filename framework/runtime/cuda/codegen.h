// The CUDA kernels of a Program, as CUDA C: one source per program (one NVRTC compile, one
// module), with one or more __global__ entry points per instruction. Every shape, stride and
// dtype is a constant in the source, so a kernel's parameters are only addresses:
//
//   extern "C" __global__ void k12_main(void* out, const void* a0, const void* a1);
//
// `out` is the instruction's result and a0..a{n-1} its operands in Instr::args order. An
// instruction's launches run in order on the compute stream (a reduction may launch twice, a
// scatter first copies its base). Nothing here calls the CUDA runtime: the source of a
// program can be generated and compiled (nvrtc.h) on a machine without a GPU.
#pragma once

#include "ir/program.h"

#include <cstdint>
#include <string>
#include <vector>

namespace loom::runtime::cuda {

// One launch of a generated entry point: a 1-D grid.
struct Launch {
  std::string entry;     // an extern "C" __global__ function of the program's source
  int64_t blocks = 1;    // gridDim.x, at most 2^31 - 1
  int threads = 256;     // blockDim.x
  int shared_bytes = 0;  // dynamic shared memory
};

// What runs one instruction.
enum class Runs : uint8_t {
  Nothing,  // a Reshape: the result shares its operand's memory
  Kernels,  // generated launches only
  Library,  // a Matmul or a convolution through cuBLASLt/cuDNN (library_ops.h), then its
            // launches (an epilogue: bias and activation applied in place), if any
};

struct InstrCode {
  Runs runs = Runs::Kernels;
  std::string source;  // definitions; entry points are named prefix + "_" + something
  std::vector<Launch> launches;
};

struct ProgramCode {
  std::string source;                // prelude() and every instruction's source
  std::vector<InstrCode> instrs;     // per instruction (sources moved into `source`)
  int kernels() const;               // launches in all
};

// The helpers every generated kernel may use (kept short: it is part of every compile):
//   typedef long long i64; typedef unsigned short bf16;
//   float bf16_to_f(bf16); bf16 f_to_bf16(float)   (round to nearest even, NaN kept quiet)
//   i64 thread_index()   (blockIdx.x * blockDim.x + threadIdx.x, as i64)
//   lane(v, k)           (value k of a 4-vector such as float4 or ushort4)
const std::string& prelude();

// The code of instruction `i` of `p`: dispatches on its op to the generators below.
// `prefix` names its entry points (unique in the program, e.g. "k12").
InstrCode generate(const ir::Program& p, int i, const std::string& prefix);
// The whole program's source and launches.
ProgramCode generate_program(const ir::Program& p);

// The CUDA C type that stores `t` ("float", "double", "i64", "int", "unsigned char" for
// Bool, "bf16") and the type its arithmetic runs in ("float" for bf16).
const char* storage_type(DType t);
const char* compute_type(DType t);
// A double as a CUDA C literal of type `t` that reads back exactly ("__longlong_as_double(..)"
// or a hex float for non-finite values, "1.5f", "3LL", ...).
std::string literal(double v, DType t);

// ---- The generators (each handles the ops named; generate() picks one) ----

// codegen_fused.cpp: elementwise ops (unary, binary, Where, Cast, Constant) unfused or as a
// Fusion; the reductions Sum, Mean, Max, ArgMax with or without a prologue fusion; and the
// epilogue of a Matmul or Conv2d (Instr::epilogue: out = activation(out + bias), in place).
InstrCode elementwise_code(const ir::Program& p, int i, const std::string& prefix);
InstrCode reduce_code(const ir::Program& p, int i, const std::string& prefix);
InstrCode epilogue_code(const ir::Program& p, int i, const std::string& prefix);

// codegen_ops.cpp: movement (Permute, Slice, Expand, Pad, Concat), Iota, RandUniform,
// RandNormal, indexing (Gather, IndexSelect, ScatterAdd, OneHot) and pooling (MaxPool2d,
// AvgPool2d, MaxPool2dGrad, AvgPool2dGrad).
InstrCode movement_code(const ir::Program& p, int i, const std::string& prefix);
InstrCode random_code(const ir::Program& p, int i, const std::string& prefix);
InstrCode index_code(const ir::Program& p, int i, const std::string& prefix);
InstrCode pool_code(const ir::Program& p, int i, const std::string& prefix);
// Im2col (compiler/conv_im2col.h): one thread per result element (codegen_pool.cpp).
InstrCode im2col_code(const ir::Program& p, int i, const std::string& prefix);

}  // namespace loom::runtime::cuda
