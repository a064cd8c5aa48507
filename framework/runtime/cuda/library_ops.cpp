// Matmul through cuBLASLt, Conv2d and its gradients through cuDNN's convolution API.
//
// Precision. float32 runs in full float32 by default: cuBLASLt with CUBLAS_COMPUTE_32F, cuDNN
// with CUDNN_FMA_MATH (CUDNN_DEFAULT_MATH would let cuDNN use TF32 tensor cores on Ampere and
// later). LOOM_CUDA_TF32=1 in the environment, read once when the first op is made, allows
// TF32 instead (CUBLAS_COMPUTE_32F_FAST_TF32, CUDNN_DEFAULT_MATH): faster, about 3 decimal
// digits per product. bfloat16 reads and writes bfloat16 and accumulates in float32; float64
// computes in float64.
//
// Layout. Convolutions read and write activations in the layout the compiler gave them:
// [N,C,H,W], or [N,H,W,C] where Conv2dAttr::channels_last (the CUDA target asks for it for
// bfloat16, whose tensor-core kernels want it). A channels-last conv transforms its weight,
// kept [O,C/g,kh,kw] as everywhere, into an [O,kh,kw,C/g] copy in the workspace first (the
// weight's gradient is computed in that layout and transformed back): one pass over a small
// tensor.
//
// Algorithms are chosen once, when the op is made, from the libraries' heuristics (no timed
// search, so making an op launches nothing): cuBLASLt's first candidate, cuDNN's first that
// fits kMaxWorkspace. For the two conv gradients that is the first-ranked, deterministic or
// not, as PyTorch takes them; under loom::use_deterministic_algorithms (or
// LOOM_CUDNN_ALGOS=deterministic) the first deterministic one, so that training repeats bit
// for bit (the backend makes its ops again when that setting changes: cuda_backend.cpp).
// LOOM_CUDNN_ALGOS=timed ranks a conv's algorithms by cuDNN's timed search instead
// (cudnnFindConvolution*Algorithm, as torch.backends.cudnn.benchmark does): making each conv op
// then runs every candidate once on the device, in buffers cuDNN allocates, and two processes
// may choose differently. Never under deterministic algorithms, whose choice must repeat.
//
// Alignment. cuBLASLt's heuristic assumes 256-byte aligned operands unless told otherwise,
// and arena offsets are only 64-byte aligned (memory_plan.cpp), so the main algorithm is
// chosen for 16-byte alignment, and a fallback for element alignment runs when an address
// is less aligned than that.
#include "runtime/cuda/library_ops.h"

#include "ir/setting.h"
#include "lazy/debug.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/library_layout.h"

#include <loom/error.h>
#include <loom/lazy.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::runtime::cuda {

namespace {

constexpr std::size_t kMaxWorkspace = std::size_t{32} << 20;  // cuBLASLt's advice for Hopper
constexpr uint32_t kAlignment = 16;  // what the main matmul algorithm may assume of addresses

bool tf32_allowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("LOOM_CUDA_TF32");
    return v != nullptr && std::string_view(v) == "1";
  }();
  return allowed;
}

// Whether the convolutions' two gradients take cuDNN's first-ranked algorithm even where it is
// not deterministic (some sum with atomics), as PyTorch does without
// torch.backends.cudnn.deterministic: the default, "fastest", unless
// loom::use_deterministic_algorithms is on when the op is made. LOOM_CUDNN_ALGOS=deterministic
// (read once) ranks deterministic ones first always, so that training repeats bit for bit.
// On an H200 (2026-11-28) the first-ranked ones made ResNet-20's float32 step at batch 1024
// 21.5 ms against 33.4, ResNet-18's at 256 39.9 against 47.0 (README, "Benchmarks").
// LOOM_CUDNN_ALGOS=timed is "fastest" with the candidates ranked by a timed search
// (timed_conv_algorithms).
const std::string& conv_algos_setting() {
  static const std::string setting =
      ir::env_setting("LOOM_CUDNN_ALGOS", "fastest", {"fastest", "deterministic", "timed"});
  return setting;
}

bool fastest_conv_gradients() {
  return conv_algos_setting() != "deterministic" && !are_deterministic_algorithms_enabled();
}

// Whether a conv's candidates come from cuDNN's timed search rather than its heuristics: only
// with LOOM_CUDNN_ALGOS=timed, and never under deterministic algorithms (a timed ranking can
// differ from one process to the next, and with it the bits).
bool timed_conv_algorithms() {
  return conv_algos_setting() == "timed" && !are_deterministic_algorithms_enabled();
}

// A library descriptor destroyed with its owner. Destroy's status is dropped: a destructor
// cannot throw, and a descriptor that fails to go leaks a few bytes of host memory.
template <class T, auto Destroy>
class Owned {
 public:
  Owned() = default;
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (handle_ != nullptr) static_cast<void>(Destroy(handle_));
  }
  T* out() { return &handle_; }  // for the library's Create call
  T get() const { return handle_; }

 private:
  T handle_ = nullptr;
};

using MatmulDesc = Owned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using MatrixLayout = Owned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using MatmulPreference = Owned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;
using TensorDesc = Owned<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor>;
using FilterDesc = Owned<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor>;
using ConvDesc = Owned<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor>;

// "matmul: float32 [2,4,3] (transposed) x [2,4,5] -> [2,3,5]", for error messages.
std::string describe(const ir::Program& p, const ir::Instr& in) {
  std::string s = std::string(ir::op_name(in.op)) + ": " + dtype_name(in.dtype) + " ";
  for (std::size_t j = 0; j < 2 && j < in.args.size(); ++j) {
    if (j > 0) s += " x ";
    s += shape_str(p.slot_type(in.args[j]).shape);
    if (in.op == ir::Op::Matmul && in.attr.is<ir::MatmulAttr>()) {
      const auto& t = in.attr.get<ir::MatmulAttr>();
      if (j == 0 ? t.transpose_a : t.transpose_b) s += " (transposed)";
    }
  }
  s += " -> " + shape_str(in.shape);
  std::string attr = ir::attr_str(in.attr);
  if (!attr.empty() && in.op != ir::Op::Matmul) s += " (" + attr + ")";
  return s;
}

int to_int(int64_t v, const std::string& what) {
  if (v < 0 || v > std::numeric_limits<int>::max())
    throw Error(what + ": a size of " + std::to_string(v) + " does not fit cuDNN's int");
  return static_cast<int>(v);
}

void check_workspace(const LibraryContext& ctx, std::size_t needed, const std::string& what) {
  if (needed == 0) return;
  if (ctx.workspace == nullptr || ctx.workspace_bytes < needed)
    throw Error(what + ": needs " + std::to_string(needed) + " bytes of workspace, the backend gave " +
                std::to_string(ctx.workspace == nullptr ? 0 : ctx.workspace_bytes));
}

void check_args(std::span<const void* const> args, void* out, const std::string& what) {
  if (args.size() < 2 || args[0] == nullptr || args[1] == nullptr || out == nullptr)
    throw Error(what + ": expected two operand addresses and a result address");
}

// ---------------------------------------------------------------------------------------------
// Matmul

class MatmulOp final : public LibraryOp {
 public:
  MatmulOp(const ir::Program& p, const ir::Instr& in, const LibraryContext& ctx)
      : what_(describe(p, in)), dtype_(in.dtype) {
    const auto& t = in.attr.get<ir::MatmulAttr>();
    const ir::SlotType a = p.slot_type(in.args.at(0));
    const ir::SlotType b = p.slot_type(in.args.at(1));
    if (a.dtype != in.dtype || b.dtype != in.dtype)
      throw Error(what_ + ": expected operands of the result's dtype, got " + dtype_name(a.dtype) +
                  " and " + dtype_name(b.dtype));
    layout_ = matmul_layout(a.shape, b.shape, t.transpose_a, t.transpose_b);
    Shape expected(a.shape.begin(), a.shape.end() - 2);
    expected.push_back(layout_.n);
    expected.push_back(layout_.m);
    if (expected != in.shape)
      throw Error(what_ + ": expected the result " + shape_str(expected) + ", got " + shape_str(in.shape));
    out_bytes_ = static_cast<std::size_t>(shape_numel(in.shape)) * dtype_size(in.dtype);
    if (out_bytes_ == 0) return;           // nothing to write
    if (layout_.k == 0) { zero_fill_ = true; return; }  // an empty sum: zeros
    if (ctx.cublaslt == nullptr) throw Error(what_ + ": no cuBLASLt handle");
    if (layout_.batch > std::numeric_limits<int32_t>::max())
      throw Error(what_ + ": " + std::to_string(layout_.batch) + " products exceed cuBLASLt's batch count");

    cudaDataType_t data = CUDA_R_32F, scale = CUDA_R_32F;
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    switch (in.dtype) {
      case DType::Float32:
        if (tf32_allowed()) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
        break;
      case DType::Float64:
        data = scale = CUDA_R_64F;
        compute = CUBLAS_COMPUTE_64F;
        break;
      case DType::BFloat16:
        data = CUDA_R_16BF;  // float32 scale and accumulation
        break;
      case DType::Int64:
      case DType::Int32:
      case DType::Bool:
        throw Error(what_ + ": cuBLASLt runs float32, float64 and bfloat16 products only");
    }

    check(cublasLtMatmulDescCreate(desc_.out(), compute, scale), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = layout_.transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = layout_.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(desc_.get(), CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
          "cublasLtMatmulDescSetAttribute(TRANSA)");
    check(cublasLtMatmulDescSetAttribute(desc_.get(), CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
          "cublasLtMatmulDescSetAttribute(TRANSB)");
    make_layout(a_, data, layout_.a_rows, layout_.a_cols, layout_.lda, layout_.stride_a);
    make_layout(b_, data, layout_.b_rows, layout_.b_cols, layout_.ldb, layout_.stride_b);
    make_layout(c_, data, layout_.m, layout_.n, layout_.ldc, layout_.stride_c);

    const uint32_t element = static_cast<uint32_t>(dtype_size(in.dtype));
    aligned_ = choose(ctx, kAlignment);
    fallback_ = choose(ctx, element);
    if (!aligned_ && !fallback_)
      throw Error(what_ + ": cuBLASLt offers no algorithm within " +
                  std::to_string(kMaxWorkspace >> 20) + " MiB of workspace");
  }

  std::size_t workspace_bytes() const override {
    return std::max(aligned_ ? aligned_->workspaceSize : 0, fallback_ ? fallback_->workspaceSize : 0);
  }

  void run(const LibraryContext& ctx, std::span<const void* const> args, void* out) const override {
    if (out_bytes_ == 0) return;
    if (zero_fill_) {
      check(cudaMemsetAsync(out, 0, out_bytes_, ctx.stream), "cudaMemsetAsync (matmul, K = 0)");
      return;
    }
    check_args(args, out, what_);
    // cuBLAS's first operand is loom's b, its second loom's a (library_layout.h).
    const void* first = args[1];
    const void* second = args[0];
    auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % kAlignment == 0; };
    const cublasLtMatmulHeuristicResult_t* h =
        aligned_ && aligned(first) && aligned(second) && aligned(out) ? &*aligned_
                                                                     : fallback_ ? &*fallback_ : nullptr;
    if (h == nullptr)
      throw Error(what_ + ": cuBLASLt has no algorithm for operands that are not " +
                  std::to_string(kAlignment) + "-byte aligned");
    check_workspace(ctx, h->workspaceSize, what_);
    const double one_d = 1, zero_d = 0;
    const float one_f = 1, zero_f = 0;
    const bool f64 = dtype_ == DType::Float64;
    const void* alpha = f64 ? static_cast<const void*>(&one_d) : &one_f;
    const void* beta = f64 ? static_cast<const void*>(&zero_d) : &zero_f;
    check(cublasLtMatmul(ctx.cublaslt, desc_.get(), alpha, first, a_.get(), second, b_.get(), beta,
                         out, c_.get(), out, c_.get(), &h->algo,
                         h->workspaceSize > 0 ? ctx.workspace : nullptr, h->workspaceSize, ctx.stream),
          "cublasLtMatmul");
  }

 private:
  void make_layout(MatrixLayout& l, cudaDataType_t data, int64_t rows, int64_t cols, int64_t ld,
                   int64_t stride) {
    check(cublasLtMatrixLayoutCreate(l.out(), data, static_cast<uint64_t>(rows),
                                     static_cast<uint64_t>(cols), ld),
          "cublasLtMatrixLayoutCreate");
    if (layout_.batch == 1) return;
    const auto count = static_cast<int32_t>(layout_.batch);
    check(cublasLtMatrixLayoutSetAttribute(l.get(), CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                           sizeof(count)),
          "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
    check(cublasLtMatrixLayoutSetAttribute(l.get(), CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                           &stride, sizeof(stride)),
          "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
  }

  // cuBLASLt's best algorithm for operands aligned to `alignment` bytes, if it has one.
  std::optional<cublasLtMatmulHeuristicResult_t> choose(const LibraryContext& ctx, uint32_t alignment) {
    MatmulPreference pref;
    check(cublasLtMatmulPreferenceCreate(pref.out()), "cublasLtMatmulPreferenceCreate");
    const uint64_t max_workspace = kMaxWorkspace;
    check(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &max_workspace, sizeof(max_workspace)),
          "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      check(cublasLtMatmulPreferenceSetAttribute(pref.get(), attr, &alignment, sizeof(alignment)),
            "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");
    constexpr int kRequested = 8;
    cublasLtMatmulHeuristicResult_t results[kRequested] = {};
    int returned = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt, desc_.get(), a_.get(), b_.get(),
                                                           c_.get(), c_.get(), pref.get(), kRequested,
                                                           results, &returned);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED) return std::nullopt;  // no kernel for this case
    check(status, "cublasLtMatmulAlgoGetHeuristic");
    for (int r = 0; r < returned; ++r)
      if (results[r].state == CUBLAS_STATUS_SUCCESS && results[r].workspaceSize <= kMaxWorkspace)
        return results[r];
    return std::nullopt;
  }

  std::string what_;
  DType dtype_;
  MatmulLayout layout_;
  std::size_t out_bytes_ = 0;
  bool zero_fill_ = false;
  MatmulDesc desc_;
  MatrixLayout a_, b_, c_;  // cuBLAS's A (loom's b), B (loom's a), and C = D
  std::optional<cublasLtMatmulHeuristicResult_t> aligned_, fallback_;
};

// ---------------------------------------------------------------------------------------------
// Convolutions

// The first of cuDNN's ranked candidates that runs under the math type we allow and fits
// kMaxWorkspace; deterministic ones only when `deterministic`. Leaves `conv` set to the math
// type of the one chosen: cuDNN picks a kernel by the algorithm and the descriptor's math type.
template <class Perf, class Workspace>
std::optional<Perf> pick(const std::vector<Perf>& perfs, bool deterministic,
                         std::optional<cudnnMathType_t> forced_math, cudnnConvolutionDescriptor_t conv,
                         std::size_t& workspace, Workspace workspace_of) {
  for (const Perf& perf : perfs) {
    if (perf.status != CUDNN_STATUS_SUCCESS) continue;
    if (deterministic && perf.determinism != CUDNN_DETERMINISTIC) continue;
    const cudnnMathType_t math = forced_math.value_or(perf.mathType);
    check(cudnnSetConvolutionMathType(conv, math), "cudnnSetConvolutionMathType");
    std::size_t bytes = 0;
    if (workspace_of(perf.algo, &bytes) != CUDNN_STATUS_SUCCESS) continue;  // not under this math
    bytes = std::max(bytes, perf.memory);
    if (bytes > kMaxWorkspace) continue;
    workspace = bytes;
    return perf;
  }
  return std::nullopt;
}

class ConvOp final : public LibraryOp {
 public:
  ConvOp(const ir::Program& p, const ir::Instr& in, const LibraryContext& ctx)
      : what_(describe(p, in)), op_(in.op), dtype_(in.dtype) {
    const ir::Conv2dAttr& conv = in.op == ir::Op::Conv2d ? in.attr.get<ir::Conv2dAttr>()
                                                         : in.attr.get<ir::Conv2dGradAttr>().conv;
    const ir::SlotType a = p.slot_type(in.args.at(0));
    const ir::SlotType b = p.slot_type(in.args.at(1));
    if (a.dtype != in.dtype || b.dtype != in.dtype)
      throw Error(what_ + ": expected operands of the result's dtype, got " + dtype_name(a.dtype) +
                  " and " + dtype_name(b.dtype));
    dims_ = conv_dims(in.op, a.shape, b.shape, in.shape, conv);
    if (in.op == ir::Op::Conv2dGradInput || in.op == ir::Op::Conv2dGradWeight) {
      // The result's logical spatial size (a channels-last input gradient stores it [N,H,W,C]).
      const ir::Pair size = in.attr.get<ir::Conv2dGradAttr>().size;
      const auto& r = in.op == ir::Op::Conv2dGradInput ? dims_.x : dims_.w;
      if (r[2] != size[0] || r[3] != size[1])
        throw Error(what_ + ": expected a result of spatial size " + std::to_string(size[0]) + "x" +
                    std::to_string(size[1]));
    }
    out_bytes_ = static_cast<std::size_t>(shape_numel(in.shape)) * dtype_size(in.dtype);
    if (out_bytes_ == 0) return;
    auto numel = [](const std::array<int64_t, 4>& d) { return d[0] * d[1] * d[2] * d[3]; };
    if (numel(dims_.x) == 0 || numel(dims_.w) == 0 || numel(dims_.y) == 0) {
      zero_fill_ = true;  // a sum over nothing (no batch, no channels)
      return;
    }
    if (ctx.cudnn == nullptr) throw Error(what_ + ": no cuDNN handle");

    cudnnDataType_t data = CUDNN_DATA_FLOAT, compute = CUDNN_DATA_FLOAT;
    std::optional<cudnnMathType_t> forced_math;  // none: the math type cuDNN ranks each algorithm with
    cudnnMathType_t math = CUDNN_DEFAULT_MATH;
    switch (in.dtype) {
      case DType::Float32:
        if (!tf32_allowed()) forced_math = CUDNN_FMA_MATH;  // no TF32
        math = forced_math.value_or(CUDNN_DEFAULT_MATH);
        break;
      case DType::Float64:
        data = compute = CUDNN_DATA_DOUBLE;
        break;
      case DType::BFloat16:
        data = CUDNN_DATA_BFLOAT16;  // float32 compute
        math = CUDNN_TENSOR_OP_MATH;
        break;
      case DType::Int64:
      case DType::Int32:
      case DType::Bool:
        throw Error(what_ + ": cuDNN runs float32, float64 and bfloat16 convolutions only");
    }

    // Channels-last activations ([N,H,W,C]) run with a channels-last filter ([O,kh,kw,C/g]),
    // the layout cuDNN's tensor-core kernels read without reordering: the weight, stored
    // [O,C/g,kh,kw], is transformed into the workspace before the call (or, for the weight's
    // gradient, computed there and transformed into the result after it).
    const cudnnTensorFormat_t format = conv.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    auto tensor = [&](TensorDesc& t, cudnnTensorFormat_t f, const std::array<int64_t, 4>& d) {
      check(cudnnCreateTensorDescriptor(t.out()), "cudnnCreateTensorDescriptor");
      check(cudnnSetTensor4dDescriptor(t.get(), f, data, to_int(d[0], what_), to_int(d[1], what_),
                                       to_int(d[2], what_), to_int(d[3], what_)),
            "cudnnSetTensor4dDescriptor");
    };
    tensor(x_, format, dims_.x);
    tensor(y_, format, dims_.y);
    check(cudnnCreateFilterDescriptor(w_.out()), "cudnnCreateFilterDescriptor");
    check(cudnnSetFilter4dDescriptor(w_.get(), data, format, to_int(dims_.w[0], what_),
                                     to_int(dims_.w[1], what_), to_int(dims_.w[2], what_),
                                     to_int(dims_.w[3], what_)),
          "cudnnSetFilter4dDescriptor");
    if (conv.channels_last) {
      tensor(w_stored_, CUDNN_TENSOR_NCHW, dims_.w);
      tensor(w_transformed_, CUDNN_TENSOR_NHWC, dims_.w);
      const std::size_t bytes = static_cast<std::size_t>(numel(dims_.w)) * dtype_size(in.dtype);
      filter_bytes_ = (bytes + 255) / 256 * 256;  // the algorithm's workspace after it, aligned
    }
    check(cudnnCreateConvolutionDescriptor(conv_.out()), "cudnnCreateConvolutionDescriptor");
    check(cudnnSetConvolution2dDescriptor(conv_.get(), to_int(conv.padding[0], what_),
                                          to_int(conv.padding[1], what_), to_int(conv.stride[0], what_),
                                          to_int(conv.stride[1], what_), to_int(conv.dilation[0], what_),
                                          to_int(conv.dilation[1], what_), CUDNN_CROSS_CORRELATION, compute),
          "cudnnSetConvolution2dDescriptor");
    check(cudnnSetConvolutionGroupCount(conv_.get(), to_int(conv.groups, what_)),
          "cudnnSetConvolutionGroupCount");
    check(cudnnSetConvolutionMathType(conv_.get(), math), "cudnnSetConvolutionMathType");

    // cuDNN's own idea of the forward output must be ours (conv_dims), or the attribute was
    // read differently.
    int n = 0, c = 0, h = 0, w = 0;
    check(cudnnGetConvolution2dForwardOutputDim(conv_.get(), x_.get(), w_.get(), &n, &c, &h, &w),
          "cudnnGetConvolution2dForwardOutputDim");
    if (std::array<int64_t, 4>{n, c, h, w} != dims_.y)
      throw Error(what_ + ": cuDNN computes a forward output [" + std::to_string(n) + "," +
                  std::to_string(c) + "," + std::to_string(h) + "," + std::to_string(w) + "]");

    choose_algorithm(ctx.cudnn, forced_math);
  }

  std::size_t workspace_bytes() const override { return filter_bytes_ + workspace_; }

  void run(const LibraryContext& ctx, std::span<const void* const> args, void* out) const override {
    if (out_bytes_ == 0) return;
    if (zero_fill_) {
      check(cudaMemsetAsync(out, 0, out_bytes_, ctx.stream), "cudaMemsetAsync (empty convolution)");
      return;
    }
    check_args(args, out, what_);
    check_workspace(ctx, workspace_bytes(), what_);
    check(cudnnSetStream(ctx.cudnn, ctx.stream), "cudnnSetStream");
    const double one_d = 1, zero_d = 0;
    const float one_f = 1, zero_f = 0;  // float and bfloat16 data: float scaling factors
    const bool f64 = dtype_ == DType::Float64;
    const void* alpha = f64 ? static_cast<const void*>(&one_d) : &one_f;
    const void* beta = f64 ? static_cast<const void*>(&zero_d) : &zero_f;
    // The workspace: the channels-last filter (filter_bytes_, none for NCHW), then the
    // algorithm's.
    void* filter = filter_bytes_ > 0 ? ctx.workspace : nullptr;
    void* ws = workspace_ > 0 ? static_cast<char*>(ctx.workspace) + filter_bytes_ : nullptr;
    auto transform = [&](const TensorDesc& from, const void* src, const TensorDesc& to, void* dst) {
      check(cudnnTransformTensor(ctx.cudnn, alpha, from.get(), src, beta, to.get(), dst),
            "cudnnTransformTensor (the filter's layout)");
    };
    if (op_ == ir::Op::Conv2d || op_ == ir::Op::Conv2dGradInput) {
      const void* w = args[1];
      if (filter != nullptr) {
        transform(w_stored_, w, w_transformed_, filter);
        w = filter;
      }
      if (op_ == ir::Op::Conv2d)
        check(cudnnConvolutionForward(ctx.cudnn, alpha, x_.get(), args[0], w_.get(), w, conv_.get(),
                                      fwd_, ws, workspace_, beta, y_.get(), out),
              "cudnnConvolutionForward");
      else
        check(cudnnConvolutionBackwardData(ctx.cudnn, alpha, w_.get(), w, y_.get(), args[0],
                                           conv_.get(), bwd_data_, ws, workspace_, beta, x_.get(),
                                           out),
              "cudnnConvolutionBackwardData");
    } else {
      check(cudnnConvolutionBackwardFilter(ctx.cudnn, alpha, x_.get(), args[0], y_.get(), args[1],
                                           conv_.get(), bwd_filter_, ws, workspace_, beta, w_.get(),
                                           filter != nullptr ? filter : out),
            "cudnnConvolutionBackwardFilter");
      if (filter != nullptr) transform(w_transformed_, filter, w_stored_, out);
    }
  }

 private:
  void choose_algorithm(cudnnHandle_t handle, std::optional<cudnnMathType_t> forced_math) {
    int count = 0;
    const bool fastest = fastest_conv_gradients();
    const bool timed = timed_conv_algorithms();
    // The search times each candidate on the device: let the work queued before it (the last
    // step, still running) finish first, so that it does not count against the early ones.
    if (timed) check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before cuDNN's timed search)");
    if (op_ == ir::Op::Conv2d) {
      check(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &count),
            "cudnnGetConvolutionForwardAlgorithmMaxCount");
      const auto perfs = candidates<cudnnConvolutionFwdAlgoPerf_t>(
          count, timed,
          [&](int n, int* got, auto* out) {
            return cudnnFindConvolutionForwardAlgorithm(handle, x_.get(), w_.get(), conv_.get(),
                                                        y_.get(), n, got, out);
          },
          [&](int n, int* got, auto* out) {
            return cudnnGetConvolutionForwardAlgorithm_v7(handle, x_.get(), w_.get(), conv_.get(),
                                                          y_.get(), n, got, out);
          },
          "cudnnGetConvolutionForwardAlgorithm_v7");
      // Forward algorithms are deterministic anyway; take the fastest ranked one.
      fwd_ = choose(perfs, false, forced_math, [&](cudnnConvolutionFwdAlgo_t algo, std::size_t* bytes) {
        return cudnnGetConvolutionForwardWorkspaceSize(handle, x_.get(), w_.get(), conv_.get(),
                                                       y_.get(), algo, bytes);
      });
    } else if (op_ == ir::Op::Conv2dGradInput) {
      check(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &count),
            "cudnnGetConvolutionBackwardDataAlgorithmMaxCount");
      const auto perfs = candidates<cudnnConvolutionBwdDataAlgoPerf_t>(
          count, timed,
          [&](int n, int* got, auto* out) {
            return cudnnFindConvolutionBackwardDataAlgorithm(handle, w_.get(), y_.get(), conv_.get(),
                                                             x_.get(), n, got, out);
          },
          [&](int n, int* got, auto* out) {
            return cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, w_.get(), y_.get(), conv_.get(),
                                                               x_.get(), n, got, out);
          },
          "cudnnGetConvolutionBackwardDataAlgorithm_v7");
      bwd_data_ = choose(perfs, !fastest, forced_math,
                         [&](cudnnConvolutionBwdDataAlgo_t algo, std::size_t* bytes) {
                           return cudnnGetConvolutionBackwardDataWorkspaceSize(
                               handle, w_.get(), y_.get(), conv_.get(), x_.get(), algo, bytes);
                         });
    } else {
      check(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &count),
            "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount");
      const auto perfs = candidates<cudnnConvolutionBwdFilterAlgoPerf_t>(
          count, timed,
          [&](int n, int* got, auto* out) {
            return cudnnFindConvolutionBackwardFilterAlgorithm(handle, x_.get(), y_.get(), conv_.get(),
                                                               w_.get(), n, got, out);
          },
          [&](int n, int* got, auto* out) {
            return cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, x_.get(), y_.get(), conv_.get(),
                                                                 w_.get(), n, got, out);
          },
          "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
      bwd_filter_ = choose(perfs, !fastest, forced_math,
                           [&](cudnnConvolutionBwdFilterAlgo_t algo, std::size_t* bytes) {
                             return cudnnGetConvolutionBackwardFilterWorkspaceSize(
                                 handle, x_.get(), y_.get(), conv_.get(), w_.get(), algo, bytes);
                           });
    }
  }

  // cuDNN's candidates for this pass, best first: by its timed search (`find`) when `timed`,
  // else, or where that search fails (it allocates its own buffers: the device may be short of
  // memory; one warning per process), by its heuristics (`rank`).
  template <class Perf, class Find, class Rank>
  std::vector<Perf> candidates(int count, bool timed, Find find, Rank rank,
                               const char* rank_name) const {
    std::vector<Perf> perfs(static_cast<std::size_t>(std::max(count, 1)));
    const int capacity = static_cast<int>(perfs.size());
    int returned = 0;
    if (timed) {
      const cudnnStatus_t status = find(capacity, &returned, perfs.data());
      if (status != CUDNN_STATUS_SUCCESS || returned <= 0) {
        debug::warn_once("cudnn-timed-search",
                         what_ + ": cuDNN's timed search of algorithms failed (" +
                             cudnnGetErrorString(status) +
                             "); ranking by its heuristics instead (LOOM_CUDNN_ALGOS=timed)");
        returned = 0;
      }
    }
    if (returned == 0) check(rank(capacity, &returned, perfs.data()), rank_name);
    perfs.resize(static_cast<std::size_t>(std::clamp(returned, 0, capacity)));
    return perfs;
  }

  // The first candidate that fits (pick), deterministic ones first when `deterministic_first`
  // and any one where none of those does.
  template <class Perf, class Workspace>
  decltype(Perf::algo) choose(const std::vector<Perf>& perfs, bool deterministic_first,
              std::optional<cudnnMathType_t> forced_math, Workspace workspace_of) {
    auto perf = pick(perfs, deterministic_first, forced_math, conv_.get(), workspace_, workspace_of);
    if (!perf && deterministic_first)
      perf = pick(perfs, false, forced_math, conv_.get(), workspace_, workspace_of);
    if (!perf)
      throw Error(what_ + ": cuDNN offers no algorithm within " + std::to_string(kMaxWorkspace >> 20) +
                  " MiB of workspace");
    return perf->algo;
  }

  std::string what_;
  ir::Op op_;
  DType dtype_;
  ConvDims dims_;
  std::size_t out_bytes_ = 0;
  bool zero_fill_ = false;
  TensorDesc x_, y_;  // the input and the output of the forward convolution
  FilterDesc w_;
  // Channels-last only: the weight as a tensor, stored ([O,C/g,kh,kw]) and transformed
  // ([O,kh,kw,C/g]), and the transformed copy's bytes at the workspace's start.
  TensorDesc w_stored_, w_transformed_;
  std::size_t filter_bytes_ = 0;
  ConvDesc conv_;
  cudnnConvolutionFwdAlgo_t fwd_ = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnConvolutionBwdDataAlgo_t bwd_data_ = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_ = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
  std::size_t workspace_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// The host-side arithmetic (library_layout.h)

MatmulLayout matmul_layout(const Shape& a, const Shape& b, bool transpose_a, bool transpose_b) {
  auto fail = [&] {
    throw Error(std::string("matmul: expected a [..., M, K] x [..., K, N] product") +
                (transpose_a || transpose_b ? " (operands stored transposed: " +
                                                  std::string(transpose_a ? "a" : "") +
                                                  (transpose_a && transpose_b ? ", " : "") +
                                                  (transpose_b ? "b" : "") + ")"
                                            : "") +
                ", got " + shape_str(a) + " and " + shape_str(b));
  };
  const std::size_t r = a.size();
  if (r < 2 || b.size() != r) fail();
  for (int64_t d : a) if (d < 0) fail();
  for (int64_t d : b) if (d < 0) fail();
  const int64_t M = transpose_a ? a[r - 1] : a[r - 2];
  const int64_t K = transpose_a ? a[r - 2] : a[r - 1];
  const int64_t kb = transpose_b ? b[r - 1] : b[r - 2];
  const int64_t N = transpose_b ? b[r - 2] : b[r - 1];
  if (K != kb) fail();
  MatmulLayout l;
  for (std::size_t d = 0; d + 2 < r; ++d) {
    if (a[d] != b[d]) fail();
    l.batch *= a[d];
  }
  // Column-major C^T[N,M] = B^T[N,K] A^T[K,M].
  l.m = N;
  l.n = M;
  l.k = K;
  // cuBLAS's A is loom's b: stored [K,N] row-major it reads as an N x K column-major matrix,
  // already B^T; stored transposed ([N,K]) it reads as K x N, B itself, to transpose.
  l.transa = transpose_b;
  l.a_rows = transpose_b ? K : N;
  l.a_cols = transpose_b ? N : K;
  // cuBLAS's B is loom's a: [M,K] row-major reads as K x M, A^T; stored [K,M] reads as M x K.
  l.transb = transpose_a;
  l.b_rows = transpose_a ? M : K;
  l.b_cols = transpose_a ? K : M;
  l.lda = std::max<int64_t>(1, l.a_rows);
  l.ldb = std::max<int64_t>(1, l.b_rows);
  l.ldc = std::max<int64_t>(1, N);
  l.stride_a = K * N;
  l.stride_b = M * K;
  l.stride_c = M * N;
  return l;
}

ConvDims conv_dims(ir::Op op, const Shape& a, const Shape& b, const Shape& out, const ir::Conv2dAttr& conv) {
  const std::string name = ir::op_name(op);
  auto shapes = [&] { return shape_str(a) + " and " + shape_str(b) + " -> " + shape_str(out); };
  if (a.size() != 4 || b.size() != 4 || out.size() != 4)
    throw Error(name + ": expected 4-D operands and result, got " + shapes());
  auto dims = [](const Shape& s) { return std::array<int64_t, 4>{s[0], s[1], s[2], s[3]}; };
  // Channels-last activations are stored [N,H,W,C]: their logical [N,C,H,W].
  auto act = [&](const Shape& s) {
    return conv.channels_last ? std::array<int64_t, 4>{s[0], s[3], s[1], s[2]} : dims(s);
  };
  ConvDims d;
  if (op == ir::Op::Conv2d) {
    d = {act(a), dims(b), act(out)};
  } else if (op == ir::Op::Conv2dGradInput) {
    d = {act(out), dims(b), act(a)};
  } else if (op == ir::Op::Conv2dGradWeight) {
    d = {act(a), dims(out), act(b)};
  } else {
    throw Error(name + ": not a convolution");
  }
  const int64_t g = conv.groups;
  const auto& [x, w, y] = d;
  bool ok = g >= 1 && x[1] == w[1] * g && w[0] % g == 0 && y[0] == x[0] && y[1] == w[0] &&
            std::all_of(x.begin(), x.end(), [](int64_t v) { return v >= 0; }) &&
            std::all_of(w.begin(), w.end(), [](int64_t v) { return v >= 0; });
  for (int i = 0; ok && i < 2; ++i) {
    const int64_t stride = conv.stride[i], pad = conv.padding[i], dil = conv.dilation[i];
    const int64_t span = dil * (w[2 + i] - 1) + 1;
    ok = stride >= 1 && pad >= 0 && dil >= 1 && w[2 + i] >= 1 && x[2 + i] + 2 * pad >= span &&
         y[2 + i] == (x[2 + i] + 2 * pad - span) / stride + 1;
  }
  if (!ok)
    throw Error(name + ": expected input " + (conv.channels_last ? "[N,H,W,C]" : "[N,C,H,W]") +
                ", weight [O,C/groups,kh,kw] and output " +
                (conv.channels_last ? "[N,Ho,Wo,O]" : "[N,O,Ho,Wo]") +
                " that agree with stride=" + std::to_string(conv.stride[0]) + "," +
                std::to_string(conv.stride[1]) + " padding=" + std::to_string(conv.padding[0]) + "," +
                std::to_string(conv.padding[1]) + " dilation=" + std::to_string(conv.dilation[0]) +
                "," + std::to_string(conv.dilation[1]) + " groups=" + std::to_string(g) + ", got " +
                shapes());
  return d;
}

std::unique_ptr<LibraryOp> make_library_op(const ir::Program& p, int i, const LibraryContext& ctx) {
  if (i < 0 || static_cast<std::size_t>(i) >= p.instrs.size())
    throw Error("make_library_op: no instruction " + std::to_string(i));
  const ir::Instr& in = p.instrs[static_cast<std::size_t>(i)];
  if (in.args.size() < 2)
    throw Error(describe(p, in) + ": expected two operands, got " + std::to_string(in.args.size()));
  switch (in.op) {
    case ir::Op::Matmul:
      return std::make_unique<MatmulOp>(p, in, ctx);
    case ir::Op::Conv2d:
    case ir::Op::Conv2dGradInput:
    case ir::Op::Conv2dGradWeight:
      return std::make_unique<ConvOp>(p, in, ctx);
    default:
      throw Error(describe(p, in) + ": not run by cuBLASLt or cuDNN");
  }
}

}  // namespace loom::runtime::cuda
