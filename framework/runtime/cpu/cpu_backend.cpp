// The CPU backend: interprets a Program instruction by instruction on the device thread,
// with kernels from kernels.cpp. Reshape shares its input's storage (buffers are immutable).
#include "runtime/cpu/cpu_backend.h"

#include "compiler/channels_last.h"
#include "compiler/conv_im2col.h"

#include "ir/setting.h"
#include "runtime/cpu/allocator.h"
#include "runtime/cpu/conv/conv_algorithm.h"
#include "runtime/cpu/heap_count.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/kernels_fused.h"
#include "runtime/cpu/onednn.h"
#include "runtime/device_queue.h"
#include "runtime/donation.h"
#include "runtime/registry.h"

#include <loom/error.h>
#include <loom/metrics.h>
#include <loom/profiler.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <span>
#include <string>

namespace loom::runtime {
namespace {

// LOOM_PROFILE_SHAPES=1: each kernel's span is named with its result's dtype and shape and its
// operands', "conv2d_grad_weight bfloat16[512,512,3,3] <- bfloat16[32,4,4,512] ...", so that a
// trace tells the convs of one model apart.
bool profiled_shapes() {
  static const bool on = [] {
    const char* v = std::getenv("LOOM_PROFILE_SHAPES");
    return v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

void append_view(std::string& s, const TensorView& v) {
  s += dtype_name(v.dtype);
  s += '[';
  for (std::size_t d = 0; d < v.shape.size(); ++d) {
    if (d) s += ',';
    s += std::to_string(v.shape[d]);
  }
  s += ']';
}

// The span name, kept for the process: spans hold their names until they are saved.
const char* shaped_name(const char* kernel, const TensorView& out,
                        std::span<const TensorView> in) {
  std::string name = kernel;
  name += ' ';
  append_view(name, out);
  name += " <-";
  for (const TensorView& v : in) append_view(name += ' ', v);
  static std::mutex mutex;
  static std::set<std::string> names;
  const std::lock_guard lock(mutex);
  return names.insert(std::move(name)).first->c_str();
}

// A compiled program and what running it needs, kept between runs: the arena that memory
// planning laid the intermediates out in, and the per-slot tables. Programs run one at a time
// on the device thread, so one set per executable is enough, and a steady-state run asks the
// allocator only for its outputs.
class CpuExecutable final : public Executable {
 public:
  explicit CpuExecutable(ir::Program p) : program(std::move(p)) {
    data.resize(program.num_slots());
    owned.resize(program.num_slots());
    arg_views.resize(program.instrs.size());
    out_views.resize(program.instrs.size());
    for (std::size_t i = 0; i < program.instrs.size(); ++i) {
      const auto& in = program.instrs[i];
      for (auto a : in.args) {
        auto t = program.slot_type(a);
        arg_views[i].push_back({nullptr, t.dtype, t.shape});
      }
      out_views[i] = {nullptr, in.dtype, in.shape};
    }
    fused_code.resize(program.instrs.size());
    stacks.resize(program.instrs.size());
    scatter_rows.resize(program.instrs.size());
    for (std::size_t i = 0; i < program.instrs.size(); ++i) {
      const auto& in = program.instrs[i];
      if (in.op == ir::Op::ScatterAdd)
        scatter_rows[i] = ir::index_uniform_inner(
            program, in.args[1], static_cast<std::size_t>(in.attr.get<ir::DimAttr>().dim));
    }
    for (std::size_t i = 0; i < program.instrs.size(); ++i) {
      const auto& in = program.instrs[i];
      // A sum's or mean's prologue over channels-last rows also folds them from registers.
      int fold_width = 0;
      if (in.fusion && (in.op == ir::Op::Sum || in.op == ir::Op::Mean))
        fold_width = rows_fold_width(in.fusion->shape, in.attr.get<ir::AxesAttr>().axes);
      if (in.fusion && !in.epilogue.active()) {
        const bool reduces = ir::op_info(in.op).group == ir::OpGroup::Reduce;
        fused_code[i] = compile_fused_code(*in.fusion, reduces ? in.fusion->compute : in.dtype,
                                           std::nullopt, fold_width);
      }
      if (in.stacked.empty()) continue;
      Stack& stack = stacks[i];
      stack.prologues.push_back(in.fusion.get());
      stack.codes.push_back(fused_code[i].get());
      for (const auto& f : in.stacked) {
        stack.owned.push_back(compile_fused_code(*f, f->compute, std::nullopt, fold_width));
        stack.prologues.push_back(f.get());
        stack.codes.push_back(stack.owned.back().get());
      }
      if (fold_width) stack.fold = compile_stacked_fold(stack.prologues, fold_width);
    }
  }
  ir::Program program;
  // Per instruction: its fusion's (or its reduction's prologue's) machine code (fused_jit.h),
  // or nullptr.
  std::vector<std::unique_ptr<const FusedCode>> fused_code;
  // Per instruction: a stacked reduction's prologues and their code, `fusion`'s first.
  struct Stack {
    std::vector<const ir::Fusion*> prologues;
    std::vector<const FusedCode*> codes;
    std::vector<std::unique_ptr<const FusedCode>> owned;  // the code of `stacked`
    std::unique_ptr<const StackedFold> fold;  // all of them folded in one pass, or nullptr
  };
  std::vector<Stack> stacks;
  // Per instruction: a ScatterAdd whose index holds one value per line (scatter_add_rows_kernel).
  std::vector<uint8_t> scatter_rows;
  // Run state, touched only by the device thread. The kernels' views (dtype and shape) are
  // made once here; a run only points them at this run's buffers, so it copies no shapes.
  mutable std::shared_ptr<Storage> arena;
  mutable std::vector<void*> data;                      // per slot
  mutable std::vector<std::shared_ptr<Storage>> owned;  // per slot: escaping results, inputs
  mutable std::vector<std::vector<TensorView>> arg_views;  // per instruction
  mutable std::vector<TensorView> out_views;               // per instruction
  mutable bool ran = false;  // set after the first run (renew_exit_hook)
  mutable std::vector<uint8_t> donatable;                  // per input, this run
};

// Returns how many results took over an input's buffer (donation, memory_plan.h).
int run_program(const CpuExecutable& exe, const BufferList& inputs, const BufferList& outputs) {
  int donated = 0;
  const auto& p = exe.program;
  const auto n_in = static_cast<int>(p.inputs.size());
  if (p.arena_bytes > 0 && !exe.arena) exe.arena = allocate_for(nullptr, p.arena_bytes, allocate);
  auto* arena = exe.arena ? static_cast<std::byte*>(exe.arena->data()) : nullptr;
  std::fill(exe.data.begin(), exe.data.end(), nullptr);
  // This run's references are dropped when it ends, failed (an exception) or not: inputs and
  // outputs belong to their tensors, and a failed run must not keep them (and their memory).
  struct DropReferences {
    const CpuExecutable& exe;
    ~DropReferences() {
      for (auto& o : exe.owned) o.reset();
    }
  } drop{exe};
  exe.donatable.resize(n_in);
  for (int i = 0; i < n_in; ++i) {
    // Programs run in queue order, so an input is already computed; it may have failed.
    auto error = inputs[i]->ready->wait();
    if (!error.empty()) throw Error(input_failed(error));
    exe.donatable[i] = only_this_run_holds(inputs[i]);
    exe.owned[i] = inputs[i]->storage;
    exe.data[i] = inputs[i]->storage->data();
  }
  for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i) {
    const auto& in = p.instrs[i];
    const int out_slot = n_in + i;
    if (in.op == ir::Op::Reshape) {  // same bytes, same owner
      exe.data[out_slot] = exe.data[in.args[0]];
      exe.owned[out_slot] = exe.owned[in.args[0]];
      continue;
    }
    if (in.arena_offset >= 0) {
      exe.data[out_slot] = arena + in.arena_offset;
    } else {
      auto bytes = static_cast<std::size_t>(shape_numel(in.shape)) * dtype_size(in.dtype);
      exe.owned[out_slot] = take_donor(in, bytes, exe.donatable, exe.owned);
      if (exe.owned[out_slot]) ++donated;
      else exe.owned[out_slot] = allocate_for(&in, bytes, allocate);
      exe.data[out_slot] = exe.owned[out_slot]->data();
    }
    auto& views = exe.arg_views[i];
    for (std::size_t k = 0; k < views.size(); ++k) views[k].data = exe.data[in.args[k]];
    TensorView& out = exe.out_views[i];
    out.data = exe.data[out_slot];
    // One span per instruction while the profiler runs, named by its kernel (ir::kernel_name)
    // and with LOOM_PROFILE_SHAPES=1 its shapes: where a step's device time goes, op by op.
    const char* span_name = profiled_shapes() && profiler::is_running()
                                ? shaped_name(ir::kernel_name(in), out, views)
                                : ir::kernel_name(in);
    profiler::Trace span(span_name);
    if (in.epilogue.active())
      epilogue_kernel(in.op, in.attr, in.epilogue, views, out);
    else if (exe.scatter_rows[i])
      scatter_add_rows_kernel(in.attr, views[0], views[1], views[2], out);
    else if (!in.fusion)
      run_kernel(in.op, in.attr, views, out);
    else if (!in.stacked.empty())
      stacked_reduce_kernel(in.op, in.attr, exe.stacks[i].prologues, exe.stacks[i].codes, views,
                            out, exe.stacks[i].fold.get());
    else if (ir::op_info(in.op).group == ir::OpGroup::Reduce)
      fused_reduce_kernel(in.op, in.attr, *in.fusion, views, out, exe.fused_code[i].get());
    else
      fused_kernel(*in.fusion, views, out, exe.fused_code[i].get());
  }
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    int slot = p.outputs[k];
    assert(exe.owned[slot] && "memory plan: a program output lives in the arena");
    outputs[k]->storage = exe.owned[slot];
  }
  return donated;
}

// Which convs run on channels-last activations (compiler/channels_last.h). LOOM_CONV_LAYOUT:
//   "auto" (the default): bfloat16 ones where oneDNN runs them natively (its direct kernels
//     take nhwc as it is and would otherwise reorder each operand in and out at every call:
//     46 of 256 ms of a ResNet-20 step); float32 ones except those float32_channels_last
//     keeps [N,C,H,W];
//   "nchw": none; "channels_last": all float32 and bfloat16 ones, on oneDNN.
uint8_t channels_last_convs() {
  constexpr auto bit = [](DType t) { return static_cast<uint8_t>(1u << static_cast<int>(t)); };
  const std::string layout = compiler::conv_layout_setting();
  if (layout == "auto")
    return static_cast<uint8_t>(bit(DType::Float32) |
                                (onednn::native_bfloat16() ? bit(DType::BFloat16) : 0));
  if (layout == "nchw") return 0;
  return bit(DType::Float32) | bit(DType::BFloat16);
}

// Under "auto", a float32 conv stays [N,C,H,W] where loom runs it by Winograd (conv_algorithm.h:
// 3x3, stride 1, 64 channels or more on both sides) on output planes of 16x16 or more in
// batches of 16 or more, and everywhere when LOOM_CONV forces one of loom's own algorithms;
// every other float32 conv goes channels-last, on oneDNN. kernel_bench (2026-11-24, the 2-core
// development machine, BM_Conv2d* against BM_OneDnnConv2d*/layout 2, float32, forward + input
// gradient + weight gradient, ms): oneDNN channels-last wins at ResNet-20's 16- and 32-channel stages (9.35
// against 11.51 and 9.06 against 11.66 per stride-1 conv), at every strided conv, 1x1
// projection and stem (0.55 to 0.93 of loom's time) and at ResNet-18's 4x4 planes (32.1
// against 40.2, where oneDNN's blocked kernels ran); loom's Winograd wins at ResNet-18's 32x32
// and 16x16 planes (26.1 against 36.2, 24.8 against 32.3) and is about even at 8x8 (ResNet-20's
// 64-channel stage 7.6 against 8.0, ResNet-18's 256-channel one 28.4 against 30.0), where
// staying in the neighbours' layout saves transposes. Whole steps, loom_bench captured,
// LOOM_CONV_LAYOUT=auto against nchw alternated, ms: ResNet-20 b128 201 / 188 / 206 / 211
// against 230 / 218 / 235 / 233; ResNet-18 b32 503 / 490 / 477 against 486 / 483 / 484 (all
// channels-last, in an earlier run: 543 / 546 / 537). Small batches go channels-last all the
// same (2026-11-24, the 2-core Sapphire Rapids machine, ResNet-18 captured fp32 steps, auto
// against LOOM_CONV_LAYOUT=channels_last before this rule, ms): batch 2 58.1 against 51.9, 4
// 78.1 against 73, 8 126 against 120, 16 209 against 210, 32 385 and 388 against 409 and 410;
// at batch 1 (loom_bench's infer section) the 128-channel 16x16 conv took 715 us under
// Winograd and 242 on oneDNN channels-last, and the evaluation 7.85 against 5.45 ms.
constexpr int64_t kWinogradKeepsPlane = 16 * 16;
constexpr int64_t kWinogradKeepsBatch = 16;

bool float32_channels_last(DType dtype, const ir::Conv2dAttr& attr, const Shape& input,
                           const Shape& weight, const Shape& output) {
  if (dtype != DType::Float32 || compiler::conv_layout_setting() != "auto") return true;
  if (own_algorithm_forced()) return false;
  const ConvGeometry g = conv_geometry(attr, input, weight, output);
  return g.oh * g.ow < kWinogradKeepsPlane || g.n < kWinogradKeepsBatch ||
         conv_algorithm(g, ConvPass::kForward, DType::Float32) != ConvAlgorithm::kWinograd;
}

// LOOM_STACK_REDUCTIONS, read once: 0 keeps sibling sums apart (compiler/stack_reductions.h),
// to compare; 1 (the default) stacks them.
bool stack_reductions_setting() {
  static const bool on = ir::env_setting("LOOM_STACK_REDUCTIONS", "1", {"0", "1"}) == "1";
  return on;
}

// The CPU runs every op at every dtype and takes every rewrite. Convolutions and matmuls run
// in bfloat16 (on oneDNN, accumulating in float32) where the processor has bfloat16
// instructions; elsewhere the compiler widens them to float32 (compiler/widen.h).
ir::Target cpu_target() {
  ir::Target t;
  t.name = "cpu";
  t.run_everything();
  if (onednn::native_bfloat16())
    for (ir::Op op : {ir::Op::Conv2d, ir::Op::Conv2dGradInput, ir::Op::Conv2dGradWeight,
                      ir::Op::Matmul})
      t.run_bfloat16(op);
  t.fuse_epilogue = t.fuse_elementwise = t.fuse_reduce_prologue = true;
  t.fold_transpose = t.plan_memory = true;
  t.stack_reductions = stack_reductions_setting() ? reads_stacked : nullptr;
  t.channels_last_convs = channels_last_convs();
  t.channels_last_conv = float32_channels_last;
  // None unless LOOM_CONV_IM2COL names a rule: the CPU's conv kernels have their own batch-1
  // path (conv_matmul.cpp), which writes im2col in the weight's order for such convs already.
  t.conv_as_matmul = compiler::conv_im2col_rule(nullptr);
  return t;
}

class CpuBackend final : public Backend {
 public:
  std::shared_ptr<Storage> alloc(std::size_t bytes) override { return allocate(bytes); }
  void empty_cache() override { runtime::empty_cache(); }

  void copy_in(const void* host, Storage& dst, std::size_t bytes) override {
    if (bytes) std::memcpy(dst.data(), host, bytes);
  }

  void copy_out(const Storage& src, void* host, std::size_t bytes) override {
    if (bytes) std::memcpy(host, src.data(), bytes);
  }

  // Only the CPU's own memory is known to be host memory.
  bool copy(const Storage& src, Storage& dst, std::size_t bytes) override {
    if (!(src.device() == Device{})) return false;
    if (bytes) std::memcpy(dst.data(), src.data(), bytes);
    return true;
  }

  const ir::Target& target() const override { return target_; }

  std::shared_ptr<const Executable> compile(ir::Program program) override {
    return std::make_shared<CpuExecutable>(std::move(program));
  }

  void execute(std::shared_ptr<const Executable> exe, BufferList inputs,
               BufferList outputs) override {
    queue_.enqueue([exe = std::move(exe), inputs = std::move(inputs),
                    outputs = std::move(outputs)]() mutable {
      const auto& program = static_cast<const CpuExecutable&>(*exe);
      profiler::Trace span("execute");
      auto start = std::chrono::steady_clock::now();
      std::string error;
      int64_t allocations = 0, library_allocations = 0;
      int donated = 0;
      {
        HeapCount counting;
        const int64_t before = heap_allocations();
        const int64_t library_before = library_heap_allocations();
        try {
          donated = run_program(program, inputs, outputs);
        } catch (const std::exception& e) {
          error = e.what();
        }
        // The inputs are let go of before the readers wake (below): a host woken by the
        // signal then finds the buffers the step freed back in the allocator's cache, so the
        // memory a step needs does not depend on which thread drops its references first.
        inputs.clear();
        allocations = heap_allocations() - before;
        library_allocations = library_heap_allocations() - library_before;
      }
      // Its kernels may have made a library's statics: the exit hook goes after them.
      if (!program.ran) program.ran = true, renew_exit_hook();
      // Counted before the outputs are ready, so a reader that waited on them sees the run.
      metrics::increment("ExecuteProgram", Device{});
      metrics::increment("ExecuteHeapAlloc", Device{}, allocations);
      metrics::increment("ExecuteHeapAllocLibrary", Device{}, library_allocations);
      metrics::increment("DonatedBuffer", Device{}, donated);
      metrics::record("ExecuteTime", std::chrono::duration<double, std::nano>(
                                         std::chrono::steady_clock::now() - start).count());
      // The outputs too, when they share one Completion (run_graph gives a program one).
      auto signal = [&](Completion& c) {
        if (error.empty()) c.set_done();
        else c.set_failed(error);
      };
      auto ready = outputs.empty() ? nullptr : outputs.front()->ready;
      const bool shared = std::all_of(outputs.begin(), outputs.end(),
                                      [&](const auto& o) { return o->ready == ready; });
      if (shared) {
        outputs.clear();
        if (ready) signal(*ready);
      } else {
        for (auto& o : outputs) signal(*o->ready);
      }
    });
  }

  void enqueue_callback(std::function<void()> fn) override { queue_.enqueue(std::move(fn)); }
  void synchronize() override { queue_.wait_idle(); }

 private:
  const ir::Target target_ = cpu_target();
  DeviceQueue queue_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace loom::runtime
