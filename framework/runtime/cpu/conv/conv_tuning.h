// Private to the CPU conv kernels: LOOM_CONV=tuned, the conv algorithm measured on this
// machine instead of taken from conv_algorithm.cpp's rules.
//
//   if (conv_tuning_enabled()) {
//     const ConvKernel k = tuned_conv_choice(key, candidates, [&](ConvKernel k) { return run(k); });
//     run(k);
//   }
//
// The rules were measured on three kinds of CPU (AVX-512 with AVX512_BF16, AMX, AVX2 only);
// on another the best algorithm for a shape may differ. With LOOM_CONV=tuned, the first call
// of each conv pass at each shape runs every algorithm that applies on the call's own
// operands (one untimed call, then the best of 2 to 5 timed ones) and the fastest is kept for
// the rest of the process, as torch.backends.cudnn.benchmark does on the GPU. The layout a
// conv runs in is still the compiler's (cpu_backend.cpp); the tuning picks among the
// algorithms of that layout. Under deterministic algorithms (loom::use_deterministic_algorithms)
// nothing is tuned: the rules' deterministic choices stand, whose bits do not depend on
// timings.
#pragma once

#include "runtime/cpu/conv/conv_common.h"

#include <loom/dtype.h>

#include <optional>
#include <span>
#include <string>
#include <vector>

namespace loom::runtime {

// The kernels a conv pass can run on (the candidates of a tuned choice).
enum class ConvKernel {
  kOneDnn,              // oneDNN's conv primitive, in the layout onednn.h picks
  kOwn,                 // [N,C,H,W]: loom's own kernels, as own_conv_algorithm picks them
  kF32Winograd,         // channels-last float32 Winograd (conv_winograd_f32.h)
  kMatmul,              // channels-last im2col + one oneDNN matmul (conv_matmul.h)
  kBf16Winograd,        // channels-last bfloat16 Winograd (conv_winograd_bf16.h)
  kBf16WeightGrad,      // channels-last bfloat16 weight gradient (conv_weight_bf16.h)
  kWinogradWeightGrad,  // float32 Winograd weight gradient on [N,C,H,W] copies (conv_winograd.h)
};

const char* conv_kernel_name(ConvKernel kernel);

// A non-owning reference to the caller's `bool(ConvKernel)` callable, which runs the pass on
// that kernel and says whether it did (no allocation, unlike std::function).
class ConvRunner {
 public:
  template <class F>
  ConvRunner(const F& f)  // NOLINT: implicit, from the caller's lambda
      : object_(&f),
        call_([](const void* o, ConvKernel k) { return (*static_cast<const F*>(o))(k); }) {}
  bool operator()(ConvKernel kernel) const { return call_(object_, kernel); }

 private:
  const void* object_;
  bool (*call_)(const void*, ConvKernel);
};

// One conv pass at one shape: what a tuned choice is remembered by.
struct ConvTuningKey {
  ConvGeometry g;
  int pass;             // ConvPass
  DType dtype;          // of the result
  bool channels_last;   // the activations' layout
  bool epilogue;        // a bias or relu taken by the kernel
};

// Whether LOOM_CONV=tuned and deterministic algorithms are off (read each call: the
// deterministic setting may change while the process runs).
bool conv_tuning_enabled();

// The kernel of `candidates` that `key` chose: the first time `key` is seen, each candidate
// is run through `run(kernel)` and timed, and the fastest kept (LOOM_DEBUG=1 prints each
// choice with the times on stderr); `run` returns false where the kernel declined the shape,
// and a candidate that throws counts as declined (never chosen; if all decline, nullopt). The
// output then holds the last candidate's result: the caller computes it once more with the
// chosen kernel. Thread-safe: one key is timed at a time, and a call that
// finds another thread timing (or its own thread, re-entered from a TBB task stolen while it
// waits) gets nullopt and runs the rules' choice this time, untimed and unremembered.
std::optional<ConvKernel> tuned_conv_choice(const ConvTuningKey& key, std::span<const ConvKernel> candidates,
                             ConvRunner run);

// The kernel of an [N,C,H,W] conv pass in `dtype`: kOneDnn where conv_algorithm picks it,
// kOwn (loom's kernels, bfloat16 widened to them) otherwise; with tuning on, the faster of the
// two where oneDNN runs the pass, timed through `run`. `nonempty`: the pass sums over at
// least one element (oneDNN is not called for empty sums); `epilogue`: a bias or activation
// runs with it.
ConvKernel nchw_conv_kernel(const ConvGeometry& g, ConvPass pass, DType dtype, bool nonempty,
                            bool epilogue, ConvRunner run);

// A tuned choice, with every candidate's best time (seconds; infinity where it declined).
struct ConvTuningRecord {
  ConvTuningKey key;
  std::vector<std::pair<ConvKernel, double>> seconds;  // each candidate's best time
  ConvKernel chosen;
};

// Every choice made so far in this process, in the order they were made.
std::vector<ConvTuningRecord> conv_tuning_records();

// "forward float32 channels-last [N=128 C=16 32x32 -> O=16 32x32, 3x3 s1 p1 g1]", for messages.
std::string conv_tuning_key_name(const ConvTuningKey& key);

}  // namespace loom::runtime
