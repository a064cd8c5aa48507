// The fused elementwise kernel. TBB spreads the result's blocks of kFusedBlock elements over
// threads; each thread evaluates its consecutive blocks as sub-blocks of at most kFusedBlock
// elements, with one cursor per strided operand that moves along as it goes (no division per
// block). Over one sub-block an operand is read
//   - in place, when its elements there are contiguous and of the compute type;
//   - as one value (a splat), when it does not change there: a per-channel operand inside one
//     plane of an NCHW tensor, a scalar, a constant; steps whose operands are all splats are
//     computed once, on that one value;
//   - or converted and broadcast into a scratch register otherwise.
// A sub-block ends early where a broadcast or in-place run ends, when that run is long enough
// (kMinRun) for a splat or an in-place read to pay for the shorter block. Each step then runs
// as one simple loop over the sub-block, which the compiler vectorises, a splat operand being a
// scalar in a vector register; transcendental functions use Eigen's vectorised versions. The
// last step writes straight into the result when no conversion is needed; otherwise
// store_result converts. A fusion with machine code (fused_jit.h, made when its program is
// compiled) runs its sub-blocks through that code instead of step by step, with the same bits;
// a contiguous bfloat16 operand that code reads itself is then left unconverted, and converted
// only for a sub-block the code does not take.
// The steps themselves, one implementation per op, are in fused_steps.h.
#include "runtime/cpu/kernels_fused.h"

#include "runtime/cpu/fused_jit.h"
#include "runtime/cpu/fused_steps.h"
#include "runtime/cpu/kernels_impl.h"

#include "ir/unreachable.h"

#include <tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace loom::runtime {
namespace {

using ir::FusedLoad;
using ir::FusedStep;
using ir::Fusion;
using ir::Op;
using fused_steps::only_splats;
using fused_steps::Operand;
using fused_steps::run_step;

// Tags of the per-thread buffers a fusion evaluates with: its block registers, where each of
// its values is, its splat values and its loads' cursors.
struct Registers;
struct Values;
struct Splats;
struct Cursors;
struct Alone;  // elementwise_kernel's result and condition blocks
struct CodeValues;  // the value pointers FusedCode::run reads
struct Patterns;    // one period of each pattern load
struct InPlace;     // the bfloat16 loads the code reads itself
struct Stage;       // fold_rows' values awaiting a whole group

// Registers start on a 64-byte boundary (thread_scratch's, kFusedBlock elements apart), so
// vector_map works on them in place.
template <class T>
T* scratch_registers(std::size_t n) {
  static_assert(kScratchAlignment % 64 == 0 && kFusedBlock * sizeof(T) % 64 == 0);
  return thread_scratch<T, Registers>(n);
}

// A sub-block ends where a broadcast or in-place run ends when that run has at least this many
// elements left: shorter runs are copied into a register with the rest of the block.
constexpr int64_t kMinRun = 128;

// The longest sub-block the fusion's machine code runs at once (fused_jit.h).
constexpr int64_t kCodeBlock = 16 * kFusedBlock;

// The longest period of a pattern load (below).
constexpr int64_t kMaxPeriod = 16384;

// How far a short period is repeated where the machine code runs (expand_patterns): its
// sub-blocks end where a pattern does, and each call costs the evaluator's set-up (load_all,
// the values computed before). On the 2-core AVX2 EPYC (settings alternated in one shell loop,
// best of 3,000 captured steps), a channels-last bfloat16 batch norm + ReLU, C = 16, over
// [128,32,32,16]: 319-325 us at 1,024 elements (two blocks, the evaluator's own repeat), 293-301
// at 2,048, 288 at 4,096, 296-303 at 8,192 (two patterns of 32 KiB no longer fit L1 together);
// C = 64 over [128,8,8,64]: 87-89 us (one outlier 157), 81-82, 80, 81-83.
constexpr int64_t kCodePattern = 4096;

// Asks for the cache lines of the n elements that follow p's sub-block of n elements. The steps
// of a sub-block read their operands one at a time, each for a few microseconds only, which
// leaves the hardware prefetchers too little time to run ahead of any one stream: asking for
// every operand's next sub-block at once keeps all of them in flight, as one loop over all
// streams would. (A prefetch never faults, so running past the operand's end is harmless.)
template <class S>
void prefetch_next(const S* p, int64_t n) {
  if (n > kFusedBlock) return;  // the machine code's long loops: the hardware's prefetchers keep up
  const auto* next = reinterpret_cast<const char*>(p + n);
  const auto bytes = static_cast<int64_t>(sizeof(S)) * n;
  for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(next + at);
}

// Where a strided load stands in its operand: the coordinates, in the load's merged
// dimensions, of the element at the evaluator's position, and that element's offset.
struct Cursor {
  std::array<int64_t, ir::kMaxFusedRank> idx;
  int64_t offset;
};

// A load that is read by a plain position, without a cursor: contiguous over the whole result.
bool is_flat(const FusedLoad& l) { return l.flat(); }

// The elements of a load's dimensions after its first: its period along the result when the
// first dimension is broadcast (pattern_period).
int64_t base_period(const FusedLoad& l) {
  int64_t period = 1;
  for (std::size_t d = 1; d < l.sizes.size(); ++d) period *= l.sizes[d];
  return period;
}

// A load that repeats along the result with a period of at most kMaxPeriod elements and is not
// read in place or as a splat over long runs: a per-channel operand over planes shorter than
// kMinRun ([N, C, 8x8] reads [1, C, 1]: period C * 64), or of a channels-last tensor
// ([N, H, W, C] reads [1, 1, 1, C]: period C, written out as a multiple of C). A thread evaluating many periods
// writes one period out once and reads it in place from then on, instead of copying the
// operand's short runs into a register block after block. Returns the period, or 0.
int64_t pattern_period(const FusedLoad& l, DType compute) {
  if (is_flat(l) || l.sizes.size() < 2 || l.strides[0] != 0) return 0;
  const int64_t inner = l.sizes.back();
  if (inner >= kMinRun && (l.strides.back() == 0 || (l.strides.back() == 1 && l.dtype == compute)))
    return 0;
  int64_t period = base_period(l);
  // A short period (a per-channel operand of a channels-last tensor: period C) is written out
  // repeated to two blocks, so that sub-blocks read it in place and are not cut short.
  constexpr int64_t kShortPeriodRepeat = 2 * kFusedBlock;
  if (period > 0 && period < kMinRun) period *= (kShortPeriodRepeat + period - 1) / period;
  return period >= kMinRun && period <= kMaxPeriod ? period : 0;
}

// The cursor at element `pos` of the result's index space.
void seek(const FusedLoad& l, int64_t pos, Cursor& c) {
  const std::size_t rank = l.sizes.size();
  assert(rank >= 1 && rank <= ir::kMaxFusedRank && "fused load: bad rank");
  c.offset = l.offset;
  for (std::size_t d = rank; d-- > 0;) {
    c.idx[d] = pos % l.sizes[d];
    pos /= l.sizes[d];
    c.offset += c.idx[d] * l.strides[d];
  }
}

// Elements left in the cursor's run along the innermost dimension.
int64_t run_left(const FusedLoad& l, const Cursor& c) {
  return l.sizes.back() - c.idx[l.sizes.size() - 1];
}

// Moves the cursor `run` elements on along its innermost dimension (run <= run_left), carrying
// into the outer dimensions where the run ends.
void step_run(const FusedLoad& l, Cursor& c, int64_t run) {
  const std::size_t last = l.sizes.size() - 1;
  c.idx[last] += run;
  c.offset += run * l.strides[last];
  for (std::size_t d = last; d > 0 && c.idx[d] == l.sizes[d]; --d) {
    c.offset += l.strides[d - 1] - c.idx[d] * l.strides[d];
    c.idx[d] = 0;
    ++c.idx[d - 1];
  }
}

// Reads `len` elements of the result's index space from `src`, starting at the cursor, into
// dst, converted to T; moves the cursor past them. One run along the innermost dimension at a
// time.
template <class T, class S>
void load_block(const FusedLoad& l, const S* src, Cursor& c, int64_t len, T* dst) {
  const int64_t step = l.strides.back();
  for (int64_t i = 0; i < len;) {
    const int64_t run = std::min(len - i, run_left(l, c));
    const S* p = src + c.offset;
    if (step == 0) {
      std::fill(dst + i, dst + i + run, static_cast<T>(*p));
    } else if (step == 1) {
      for (int64_t k = 0; k < run; ++k) dst[i + k] = static_cast<T>(p[k]);
    } else {
      for (int64_t k = 0; k < run; ++k) dst[i + k] = static_cast<T>(p[k * step]);
    }
    i += run;
    step_run(l, c, run);
  }
}

// Where BlockEvaluator::eval writes a fusion's result, each pointer at the first element it
// evaluates (at most one set): `direct`, where the steps (their last one) and the code write it;
// `code`, where only the code writes it (a result over an operand: the code reads each vector of
// its operands before it writes it there, the steps' loops do not, run_fusion); `narrow`, where
// only the code writes it, as bfloat16 or bool (FusedCode::narrows; `width` bytes an element).
// Where the steps run instead and for none, eval's emit receives the result.
template <class T>
struct Target {
  T* direct = nullptr;
  T* code = nullptr;
  char* narrow = nullptr;
  int64_t width = 0;

  Target at(int64_t offset) const {
    return {direct ? direct + offset : nullptr, code ? code + offset : nullptr,
            narrow ? narrow + offset * width : nullptr, width};
  }
};

// Evaluates a fusion over consecutive elements on one thread, with that thread's scratch
// registers, splat values and cursors.
template <class T>
class BlockEvaluator {
 public:
  BlockEvaluator(const Fusion& f, std::span<const TensorView> in, const FusedCode* code = nullptr)
      : f_(f), in_(in), code_(code), n_loads_(static_cast<int>(f.loads.size())),
        n_values_(n_loads_ + static_cast<int>(f.steps.size())),
        regs_(scratch_registers<T>(static_cast<std::size_t>(f.num_registers) * kFusedBlock)),
        value_(thread_scratch<Operand<T>, Values>(n_values_)),
        splat_(thread_scratch<T, Splats>(n_values_)),
        cursor_(thread_scratch<Cursor, Cursors>(n_loads_)),
        pattern_(thread_scratch<const T*, Patterns>(n_loads_)),
        period_(thread_scratch<int64_t, Patterns>(n_loads_)),
        in_place_(thread_scratch<const void*, InPlace>(n_loads_)) {
    std::fill_n(pattern_, n_loads_, nullptr);
    assert(n_values_ > n_loads_ && "fused kernel: a fusion without steps");
  }

  // Elements [begin, begin + len) of the result's index space, in sub-blocks of at most
  // kFusedBlock elements, written to `to` (Target) [0, len) where it says so; otherwise
  // emit(at, n, value) receives elements [at, at + n) of the result.
  template <class Emit>
  void eval(int64_t begin, int64_t len, Target<T> to, Emit&& emit) {
    expand_patterns(len);
    seek_all(begin);
    const int last = n_values_ - 1;
    T* const direct = to.direct;
    // The machine code keeps no values in registers between steps, so it takes longer
    // sub-blocks (fewer calls, fewer evaluations of the values computed before it) when it
    // writes the result directly and reads every operand in place or as a splat.
    const bool code_writes = code_ && (to.direct || to.code || to.narrow);
    const int64_t max_len = code_writes ? kCodeBlock : kFusedBlock;
    for (int64_t pos = begin, end = begin + len; pos < end;) {
      const int64_t n = load_all(pos, std::min(max_len, end - pos));
      if (run_code(n, to.at(pos - begin))) {
        if (!code_writes) emit(pos, n, value_[last]);
        pos += n;
        continue;
      }
      run_steps(pos, n, direct ? direct + (pos - begin) : nullptr);
      if (!direct) emit(pos, n, value_[last]);
      pos += n;
    }
  }

  // Elements [begin, begin + len) of every value the code folds (compile_fold), in sub-blocks
  // of whole groups through the code alone; returns where it stopped (fold_stacked_rows).
  int64_t fold_rows_together(int64_t begin, int64_t len, int64_t width, double* sums) {
    const int64_t group = kGroupRows * width;
    assert(code_ && code_->fold_width() == width && "fold_rows_together: no fold");
    expand_patterns(len);
    seek_all(begin);
    int64_t pos = begin;
    for (const int64_t end = begin + len; pos < end;) {
      const int64_t n = load_all(pos, std::min(kCodeBlock, end - pos), group);
      if (n % group != 0 || !run_code_fold(n, sums)) break;
      pos += n;
    }
    return pos;
  }

  // Elements [begin, begin + len) of the (float32) result folded in rows of `width` values into
  // sums[0, width), as FusedCode::fold_rows does: groups of kGroupRows rows from `begin` (a
  // group's start), a last short group padded with zeros. Sub-blocks of whole groups go through
  // the code's fold where it has one for this width; any other sub-block (an operand copied, a
  // run cut short) is computed into `stage` and its whole groups folded there, to the same bits.
  void fold_rows(int64_t begin, int64_t len, int64_t width, double* sums) {
    static_assert(std::is_same_v<T, float>, "fold_rows: float32 results only");
    const int64_t group = kGroupRows * width;
    const bool folds = code_ && code_->fold_width() == width;
    T* stage = thread_scratch<T, Stage>(static_cast<std::size_t>(kFusedBlock + group));
    int64_t staged = 0;  // elements in stage, less than a group between sub-blocks
    expand_patterns(len);
    seek_all(begin);
    for (int64_t pos = begin, end = begin + len; pos < end;) {
      const bool whole = folds && staged == 0;  // the code may fold this sub-block
      const int64_t n = load_all(pos, std::min(whole ? kCodeBlock : kFusedBlock, end - pos), group);
      pos += n;
      if (whole && n % group == 0 && run_code_fold(n, sums)) continue;
      assert(n <= kFusedBlock && "fold_rows: a long sub-block without the code's fold");
      if (!run_code(n, Target<T>{.direct = stage + staged})) run_steps(pos - n, n, stage + staged);
      staged += n;
      const int64_t done = staged - staged % group;
      fold_row_groups(stage, done, width, sums);
      std::copy(stage + done, stage + staged, stage);
      staged -= done;
    }
    if (staged > 0) {
      std::fill(stage + staged, stage + group, T(0));
      fold_row_groups(stage, group, width, sums);
    }
  }

 private:
  // The steps over the sub-block of n elements at pos (the code did not run), the last writing
  // into `direct` where given (a splat result filled in), else into its register.
  void run_steps(int64_t pos, int64_t n, T* direct) {
    convert_in_place_loads(pos, n);
    const int last = n_values_ - 1;
    for (int v = n_loads_; v < n_values_; ++v) {
      const auto& s = f_.steps[v - n_loads_];
      const Operand<T> a = operand(s.a), b = operand(s.b), c = operand(s.c);
      if (only_splats(a, b, c)) {
        run_step<T>(s, a, b, c, splat_ + v, 1);
        value_[v] = {splat_ + v, true};
        continue;
      }
      T* d = (v == last && direct) ? direct : reg(v);
      run_step<T>(s, a, b, c, d, n);
      value_[v] = {d, false};
    }
    if (direct && value_[last].splat) std::fill_n(direct, n, *value_[last].p);
  }

  // The code's fold over the sub-block's n elements (fold_rows), when the sub-block's loads are
  // splats exactly where the code expects them (see run_code). False: it did not run.
  bool run_code_fold(int64_t n, double* sums) {
    const void** values = code_values();
    if (!values) return false;
    code_->fold_rows(values, sums, n);
    return true;
  }

  T* reg(int v) const { return regs_ + f_.register_of[v] * kFusedBlock; }

  // Runs the sub-block's n elements through the fusion's machine code (fused_jit.h), when it
  // has code and the sub-block's loads are splats exactly where the code expects them (a
  // broadcast run that does not cover the sub-block was copied instead): the values computed
  // before are computed here first, as the steps below compute them, and the code writes the
  // result where `to` says, or to the last value's register. False: the steps must run.
  bool run_code(int64_t n, Target<T> to) {
    if constexpr (!std::is_same_v<T, float>) {
      return false;
    } else {
      const void** values = code_values();
      if (!values) return false;
      if (to.narrow) {
        code_->run_narrow(values, to.narrow, n);
        return true;
      }
      const int last = n_values_ - 1;
      T* d = to.direct ? to.direct : to.code ? to.code : reg(last);
      code_->run(values, d, n);
      value_[last] = {d, false};
      return true;
    }
  }

  // The value pointers the code reads over the current sub-block, the values computed before
  // it computed; nullptr where there is no code or the sub-block's loads are not splats
  // exactly where the code expects them.
  const void** code_values() {
    if (!code_) return nullptr;
    const auto& before = code_->before();
    for (int k = 0; k < n_loads_; ++k)
      if (value_[k].splat != before[k]) return nullptr;
    const void** values = thread_scratch<const void*, CodeValues>(n_values_);
    for (int v = 0; v < n_values_; ++v) {
      if (v >= n_loads_ && before[v]) {
        const auto& s = f_.steps[v - n_loads_];
        run_step<T>(s, operand(s.a), operand(s.b), operand(s.c), splat_ + v, 1);
        value_[v] = {splat_ + v, true};
      }
      values[v] = v < n_loads_ ? (in_place_[v] ? in_place_[v] : value_[v].p)
                  : before[v]  ? value_[v].p
                               : nullptr;
    }
    return values;
  }

  // Whether the code reads load k (bfloat16 or bool) in place (load_all then leaves it
  // unconverted).
  bool reads_in_place(int k) const {
    return code_ && (code_->loads()[k] == FusedCode::Load::BFloat16Elements ||
                     code_->loads()[k] == FusedCode::Load::BoolElements);
  }

  // Converts the loads the code would have read in place, for the steps (the code did not run).
  void convert_in_place_loads(int64_t pos, int64_t n) {
    for (int k = 0; k < n_loads_; ++k) {
      if (!in_place_[k]) continue;
      assert(n <= kFusedBlock && "fused kernel: a long sub-block without its code");
      T* r = reg(k);
      visit_storage(f_.loads[k].dtype, [&](auto tag) {
        using S = typename decltype(tag)::type;
        const S* p = in_[f_.loads[k].arg].template as<const S>() + pos;
        for (int64_t i = 0; i < n; ++i) r[i] = static_cast<T>(p[i]);
      });
      value_[k] = {r, false};
    }
  }
  Operand<T> operand(int v) const { return v >= 0 ? value_[v] : Operand<T>{}; }

  void seek_all(int64_t pos) {
    for (int k = 0; k < n_loads_; ++k)
      if (!is_flat(f_.loads[k]) && !pattern_[k]) seek(f_.loads[k], pos, cursor_[k]);
  }

  // Writes out one period of each pattern load (pattern_period) when the elements to evaluate
  // span several periods (so the copy pays for itself), else leaves them to the cursors.
  void expand_patterns(int64_t len) {
    int64_t total = 0;
    for (int k = 0; k < n_loads_; ++k) {
      period_[k] = pattern_period(f_.loads[k], f_.compute);
      if (period_[k] > 0 && len < 4 * period_[k]) period_[k] = 0;
      if (code_ && period_[k] > 0 && base_period(f_.loads[k]) < kMinRun) {
        // A short period repeated further for the machine code, whose sub-blocks end where a
        // pattern does: up to kCodePattern elements, while the elements span four of them.
        while (2 * period_[k] <= kCodePattern && len >= 8 * period_[k]) period_[k] *= 2;
      }
      total += period_[k];
      pattern_[k] = nullptr;
    }
    if (total == 0) return;
    T* buf = thread_scratch<T, Patterns>(static_cast<std::size_t>(total));
    for (int k = 0; k < n_loads_; ++k) {
      if (!period_[k]) continue;
      const auto& l = f_.loads[k];
      // A short period repeated (pattern_period) is read once and then copied, doubling.
      const int64_t base = base_period(l);
      seek(l, 0, cursor_[k]);
      visit_storage(l.dtype, [&](auto tag) {
        using S = typename decltype(tag)::type;
        load_block(l, in_[l.arg].as<const S>(), cursor_[k], base, buf);
      });
      for (int64_t have = base; have < period_[k]; have *= 2)
        std::copy_n(buf, std::min(have, period_[k] - have), buf + have);
      pattern_[k] = buf;
      buf += period_[k];
    }
  }

  // Loads every operand for the sub-block at `pos` of at most `max_len` elements; returns its
  // length, cut where a broadcast or in-place run ends when that run is long (kMinRun).
  // A max_len beyond kFusedBlock (the machine code's sub-blocks) is cut to kFusedBlock where
  // an operand has to be copied into a register. A length of at least `granule` elements is
  // then cut to a multiple of it (fold_rows' groups).
  int64_t load_all(int64_t pos, int64_t max_len, int64_t granule = 1) {
    int64_t n = max_len;
    bool copies = false;
    for (int k = 0; k < n_loads_; ++k) {
      const auto& l = f_.loads[k];
      if (is_flat(l)) {
        copies |= f_.register_of[k] >= 0 && !reads_in_place(k);
        continue;
      }
      if (pattern_[k]) {
        const int64_t left = period_[k] - pos % period_[k];
        if (left < n && left >= kMinRun) n = left;
        copies |= left < n;
        continue;
      }
      const int64_t left = run_left(l, cursor_[k]);
      const bool whole_run = l.strides.back() == 0 || (l.strides.back() == 1 && l.dtype == f_.compute);
      if (whole_run && left < n && left >= kMinRun) n = left;
      copies |= !whole_run || left < n;
    }
    if (copies) n = std::min(n, kFusedBlock);
    if (n >= granule) n -= n % granule;
    for (int k = 0; k < n_loads_; ++k) {
      const auto& l = f_.loads[k];
      const TensorView& src = in_[l.arg];
      Cursor& c = cursor_[k];
      in_place_[k] = nullptr;
      if (reads_in_place(k)) {  // read by the code (or converted if it does not run)
        in_place_[k] = static_cast<const char*>(src.data) + pos * dtype_size(l.dtype);
        value_[k] = {nullptr, false};
      } else if (f_.register_of[k] < 0) {  // contiguous, of the compute type: read in place
        value_[k] = {src.as<const T>() + pos, false};
        prefetch_next(value_[k].p, n);
      } else if (pattern_[k]) {  // in place from its period, or copied around its end
        const int64_t phase = pos % period_[k];
        if (period_[k] - phase >= n) {
          value_[k] = {pattern_[k] + phase, false};
        } else {
          T* r = reg(k);
          for (int64_t i = 0, at = phase; i < n; ++i, at = at + 1 == period_[k] ? 0 : at + 1)
            r[i] = pattern_[k][at];
          value_[k] = {r, false};
        }
      } else if (is_flat(l)) {  // contiguous, converted
        visit_storage(l.dtype, [&](auto tag) {
          using S = typename decltype(tag)::type;
          const S* p = src.as<const S>() + pos;
          prefetch_next(p, n);
          T* r = reg(k);
          for (int64_t i = 0; i < n; ++i) r[i] = static_cast<T>(p[i]);
        });
        value_[k] = {reg(k), false};
      } else if (run_left(l, c) >= n && l.strides.back() == 0) {  // one value throughout
        visit_storage(l.dtype, [&](auto tag) {
          using S = typename decltype(tag)::type;
          splat_[k] = static_cast<T>(src.as<const S>()[c.offset]);
        });
        value_[k] = {splat_ + k, true};
        step_run(l, c, n);
      } else if (run_left(l, c) >= n && l.strides.back() == 1 && l.dtype == f_.compute) {
        value_[k] = {src.as<const T>() + c.offset, false};
        prefetch_next(value_[k].p, n);
        step_run(l, c, n);
      } else {
        visit_storage(l.dtype, [&](auto tag) {
          using S = typename decltype(tag)::type;
          load_block(l, src.as<const S>(), c, n, reg(k));
        });
        value_[k] = {reg(k), false};
      }
    }
    return n;
  }

  const Fusion& f_;
  std::span<const TensorView> in_;
  const FusedCode* code_;  // the fusion's machine code, or nullptr: the steps run one by one
  const int n_loads_, n_values_;
  T* regs_;
  Operand<T>* value_;  // per value: where it is over the current sub-block
  T* splat_;           // per value: its one value, when it is a splat
  Cursor* cursor_;     // per load: where the current sub-block starts in the operand
  const T** pattern_;  // per load: one period of a pattern load, written out; or nullptr
  int64_t* period_;    // per load: its period when it has a pattern
  const void** in_place_;  // per load: its bfloat16 or bool elements over the sub-block, when
                           // the code reads them itself (reads_in_place); or nullptr
};

// Elements [at, at + n) of a fusion's or op's result, computed in T, stored into `out`: the
// one place a result is converted to its storage dtype (T itself, bool, or bfloat16). (A result of
// type T that overlaps no operand is written by the last step directly instead.)
template <class T>
void store_result(Operand<T> r, const TensorView& out, int64_t at, int64_t n) {
  if (out.dtype == storage_dtype_of<T>()) {
    T* po = out.as<T>() + at;
    if (r.splat) std::fill_n(po, n, *r.p);
    else std::copy(r.p, r.p + n, po);
    return;
  }
  if (out.dtype == DType::BFloat16) {
    // After a rounding step (widen.h), so every value is a bfloat16 already (a NaN among
    // them quiet): its top 16 bits are the bfloat16, and the loop is a shift and a narrowing
    // store. (A float64 fusion rounds through float32, where the value is exact too.)
    bfloat16* po = out.as<bfloat16>() + at;
    if (r.splat) {
      std::fill_n(po, n, bfloat16(static_cast<float>(*r.p)));
    } else if constexpr (std::is_same_v<T, float>) {
      uint16_t* bits = reinterpret_cast<uint16_t*>(po);
      for (int64_t i = 0; i < n; ++i)
        bits[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(r.p[i]) >> 16);
    } else {
      for (int64_t i = 0; i < n; ++i) po[i] = bfloat16(static_cast<float>(r.p[i]));
    }
    return;
  }
  assert(out.dtype == DType::Bool && "elementwise: bad result dtype");
  BoolStorage* po = out.as<BoolStorage>() + at;
  if (r.splat) {
    std::fill_n(po, n, static_cast<BoolStorage>(*r.p != T(0)));
    return;
  }
  for (int64_t i = 0; i < n; ++i) po[i] = r.p[i] != T(0);
}

// True when the result is written over one of its operands (a donated buffer,
// memory_plan.cpp): its last step must then not write where operands are read directly (and
// run_step writes through a __restrict pointer; GeluTanh rereads its operand).
bool overlaps_operand(std::span<const TensorView> in, const TensorView& out) {
  return std::any_of(in.begin(), in.end(), [&](const TensorView& v) { return v.data == out.data; });
}

// The blocks a task of the fused kernel takes at least: a share of kFusedTasksPerThread tasks
// per thread, within [8, kMaxTaskBlocks] blocks. With a fixed grain of 8 blocks TBB's
// partitioner cut every kernel down to it (4,096 elements a task: 128 tasks over a 2 MiB float
// tensor), and each task sets up its evaluator and writes out its pattern loads anew (a
// per-channel operand's period, 4 to 64 KiB), or, covering fewer than four periods, reads them
// run by run (an NCHW tensor's per-channel operand over 8x8 planes: period C x 64). Tasks of
// up to 64 blocks (32,768 elements) cover four such periods up to C = 128; larger tasks gained
// nothing more and balance less well. On the 2-core AVX2 EPYC (best of 600-1,000 calls,
// settings alternated): an NCHW float32 batch norm + ReLU over [128,64,8,8] 192-242 us ->
// 77-100 us, its channels-last bfloat16 form over [128,8,8,64] 137-167 us -> 105-142 us, over
// [32,64,32,32] (planes long enough for splats: no patterns) unchanged within noise.
constexpr int64_t kFusedTasksPerThread = 4;
constexpr int64_t kMaxTaskBlocks = 64;

int64_t fused_task_blocks(int64_t blocks) {
  const int64_t threads = std::max(1, tbb::this_task_arena::max_concurrency());
  return std::clamp<int64_t>(blocks / (kFusedTasksPerThread * threads), 8, kMaxTaskBlocks);
}

template <class T>
void run_fusion(const Fusion& f, std::span<const TensorView> in, const TensorView& out,
                const FusedCode* code) {
  const int64_t n = out.numel();
  // A result over an operand (donation) is one the operand's loads all read element for element
  // (memory_plan.cpp): the code may write it there, the steps may not.
  const bool overlaps = overlaps_operand(in, out);
  Target<T> to;
  if (out.dtype == f.compute) (overlaps ? to.code : to.direct) = out.as<T>();
  if (code && code->narrows() && out.dtype == code->narrow_dtype()) {
    to.narrow = static_cast<char*>(out.data);
    to.width = static_cast<int64_t>(dtype_size(out.dtype));
  }
  const int64_t blocks = (n + kFusedBlock - 1) / kFusedBlock;
  parallel_range(blocks, fused_task_blocks(blocks), [&](int64_t b0, int64_t b1) {
    BlockEvaluator<T> eval(f, in, code);
    const int64_t begin = b0 * kFusedBlock, len = std::min(b1 * kFusedBlock, n) - begin;
    eval.eval(begin, len, to.at(begin),
              [&](int64_t at, int64_t m, Operand<T> r) { store_result(r, out, at, m); });
  });
}

// One elementwise op alone (elementwise_kernel): the operands are contiguous and of the
// result's shape, so each block runs run_step on them in place. A Where's bool condition is
// converted to T per block, as a fusion's load converts it.
template <class T>
void run_alone(Op op, std::span<const TensorView> in, const TensorView& out) {
  const int64_t n = out.numel();
  const bool where = op == Op::Where;
  const bool direct_out = out.dtype == storage_dtype_of<T>() && !overlaps_operand(in, out);
  const FusedStep step{op, -1, -1, -1, 0, out.dtype};
  const int64_t blocks = (n + kFusedBlock - 1) / kFusedBlock;
  parallel_range(blocks, 8, [&](int64_t b0, int64_t b1) {
    T* scratch = thread_scratch<T, Alone>(2 * kFusedBlock);
    T* cond = scratch + kFusedBlock;
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t begin = blk * kFusedBlock, len = std::min(kFusedBlock, n - begin);
      const T* operand[3] = {nullptr, nullptr, nullptr};
      for (std::size_t k = 0; k < in.size(); ++k)
        if (!(where && k == 0)) operand[k] = in[k].as<const T>() + begin;
      if (where) {
        const BoolStorage* pc = in[0].as<const BoolStorage>() + begin;
        for (int64_t i = 0; i < len; ++i) cond[i] = static_cast<T>(pc[i]);
        operand[0] = cond;
      }
      T* d = direct_out ? out.as<T>() + begin : scratch;
      run_step<T>(step, operand[0], operand[1], operand[2], d, len);
      if (!direct_out) store_result(Operand<T>{d}, out, begin, len);
    }
  });
}

// How the code reads each of the fusion's loads: a load is a splat over a sub-block where
// load_all reads it as one (a broadcast whose runs are long enough to cut sub-blocks at,
// kMinRun, or one value throughout); a contiguous bfloat16 or bool operand is read in place by
// code that takes it.
std::vector<FusedCode::Load> code_loads(const ir::Fusion& fusion) {
  using Load = FusedCode::Load;
  std::vector<Load> loads;
  for (const auto& l : fusion.loads) {
    if (!is_flat(l) && l.strides.back() == 0 && (l.sizes.size() == 1 || l.sizes.back() >= kMinRun))
      loads.push_back(Load::Splat);
    else if (is_flat(l) && l.dtype == DType::BFloat16)
      loads.push_back(Load::BFloat16Elements);
    else if (is_flat(l) && l.dtype == DType::Bool)
      loads.push_back(Load::BoolElements);
    else
      loads.push_back(Load::Elements);
  }
  return loads;
}

}  // namespace

void fused_kernel(const ir::Fusion& fusion, std::span<const TensorView> in,
                  const TensorView& out, const FusedCode* code) {
  visit_float("fused elementwise", fusion.compute, [&](auto tag) {
    run_fusion<typename decltype(tag)::type>(fusion, in, out, code);
  });
}

std::unique_ptr<const FusedCode> compile_fused_code(const ir::Fusion& fusion, DType out,
                                                   std::optional<FusedIsa> isa, int fold_width) {
  if (!isa && !fused_jit_available()) return nullptr;
  return FusedCode::compile(fusion, code_loads(fusion), out, isa ? *isa : fused_isas().back(),
                            fold_width);
}

void fold_row_groups(const float* v, int64_t len, int64_t width, double* sums) {
  auto fold = [&]<int W>() {
    for (int64_t i = 0; i < len; i += kGroupRows * W) add_row_group<W>(v + i, sums);
  };
  switch (width) {
    case 8: return fold.template operator()<8>();
    case 16: return fold.template operator()<16>();
    case 32: return fold.template operator()<32>();
    case 64: return fold.template operator()<64>();
    default: LOOM_UNREACHABLE("fold_row_groups: not a fixed row width");
  }
}

std::unique_ptr<const StackedFold> compile_stacked_fold(
    std::span<const ir::Fusion* const> prologues, int width) {
  if (prologues.empty() || !fused_jit_available()) return nullptr;
  auto fold = std::make_unique<StackedFold>();
  ir::Fusion& m = fold->fusion;
  m.compute = prologues[0]->compute;
  m.shape = prologues[0]->shape;
  std::vector<std::vector<int>> value_of;  // per prologue: its values' indices in m
  for (const ir::Fusion* p : prologues) {
    if (p->compute != m.compute || p->shape != m.shape) return nullptr;
    auto& map = value_of.emplace_back();
    for (const auto& l : p->loads) {
      auto same = [&](const FusedLoad& o) {
        return o.arg == l.arg && o.dtype == l.dtype && o.sizes == l.sizes &&
               o.strides == l.strides && o.offset == l.offset;
      };
      const auto at = std::find_if(m.loads.begin(), m.loads.end(), same);
      map.push_back(static_cast<int>(at - m.loads.begin()));
      if (at == m.loads.end()) m.loads.push_back(l);
    }
  }
  // The steps after all the loads, their operands renumbered.
  const auto n_loads = static_cast<int>(m.loads.size());
  for (std::size_t j = 0; j < prologues.size(); ++j) {
    const ir::Fusion& p = *prologues[j];
    auto& map = value_of[j];
    for (const auto& step : p.steps) {
      FusedStep s = step;
      for (int* u : {&s.a, &s.b, &s.c})
        if (*u >= 0) *u = map[static_cast<std::size_t>(*u)];
      map.push_back(n_loads + static_cast<int>(m.steps.size()));
      m.steps.push_back(s);
    }
    fold->results.push_back(map.back());
  }
  // A register for every value the evaluator cannot read in place (as fuse_elementwise.cpp
  // assigns them, without reuse).
  const int n_values = n_loads + static_cast<int>(m.steps.size());
  for (int v = 0; v < n_values; ++v) {
    const bool direct = v < n_loads && m.loads[v].dtype == m.compute && is_flat(m.loads[v]);
    m.register_of.push_back(direct ? -1 : m.num_registers++);
  }
  fold->code = FusedCode::compile_fold(m, code_loads(m), fused_isas().back(), width, fold->results);
  if (!fold->code) return nullptr;
  return fold;
}

int64_t fold_stacked_rows(const StackedFold& fold, std::span<const TensorView> in, int64_t begin,
                          int64_t len, int64_t width, double* sums) {
  BlockEvaluator<float> eval(fold.fusion, in, fold.code.get());
  return eval.fold_rows_together(begin, len, width, sums);
}

void fold_fusion_rows(const ir::Fusion& fusion, std::span<const TensorView> in, int64_t begin,
                      int64_t len, int64_t width, double* sums, const FusedCode* code) {
  assert(fusion.compute == DType::Float32 && fixed_rows(width) && "fold_fusion_rows: bad fold");
  BlockEvaluator<float> eval(fusion, in, code);
  eval.fold_rows(begin, len, width, sums);
}

template <class T>
void eval_fusion(const ir::Fusion& fusion, std::span<const TensorView> in, int64_t begin,
                 int64_t len, T* dst, const FusedCode* code) {
  assert(fusion.compute == (sizeof(T) == 4 ? DType::Float32 : DType::Float64) &&
         "eval_fusion: wrong compute type");
  BlockEvaluator<T> eval(fusion, in, code);
  eval.eval(begin, len, Target<T>{.direct = dst}, [](int64_t, int64_t, Operand<T>) {});
}

template void eval_fusion<float>(const ir::Fusion&, std::span<const TensorView>, int64_t,
                                 int64_t, float*, const FusedCode*);
template void eval_fusion<double>(const ir::Fusion&, std::span<const TensorView>, int64_t,
                                  int64_t, double*, const FusedCode*);

template <class T>
void unary_step(ir::Op op, const T* a, T* d, int64_t n) {
  const FusedStep s{op, -1, -1, -1, 0, std::is_same_v<T, float> ? DType::Float32 : DType::Float64};
  for (int64_t i = 0; i < n; i += kFusedBlock)
    run_step<T>(s, a + i, nullptr, nullptr, d + i, std::min(kFusedBlock, n - i));
}

template void unary_step<float>(ir::Op, const float*, float*, int64_t);
template void unary_step<double>(ir::Op, const double*, double*, int64_t);

void elementwise_kernel(ir::Op op, std::span<const TensorView> in, const TensorView& out) {
  assert(in.size() == static_cast<std::size_t>(ir::op_info(op).arity) && "elementwise: operands");
  const DType t = in[op == Op::Where ? 1 : 0].dtype;  // a Where computes in its values' dtype
  // Bool operands only meet tests and selection; shape inference rejects arithmetic on them.
  if (t == DType::Bool && op != Op::Eq && op != Op::Ne && op != Op::LogicalNot && op != Op::Where)
    unsupported_dtype(ir::op_name(op), t);
  visit_dtype(t, [&](auto tag) { run_alone<typename decltype(tag)::type>(op, in, out); });
}

}  // namespace loom::runtime
