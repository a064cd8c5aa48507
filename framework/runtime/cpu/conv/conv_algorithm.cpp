// The conv algorithm choice (conv_algorithm.h), with the measurements behind each threshold.
#include "runtime/cpu/conv/conv_algorithm.h"

#include "ir/setting.h"
#include "runtime/cpu/conv/conv_direct.h"
#include "runtime/cpu/conv/conv_matmul.h"
#include "runtime/cpu/conv/conv_weight_bf16.h"
#include "runtime/cpu/conv/conv_winograd.h"
#include "runtime/cpu/conv/conv_winograd_bf16.h"
#include "runtime/cpu/conv/conv_winograd_f32.h"
#include "runtime/cpu/onednn.h"

#include <loom/error.h>
#include <loom/lazy.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace loom::runtime {
namespace {

// kTuned: the rules below as for kNone; conv_tuning.h times the alternatives on top.
enum class Forced { kNone, kTuned, kOneDnn, kDirect, kGemm, kWinograd };

Forced forced_choice() {
  static const Forced forced = [] {
    const char* v = std::getenv("LOOM_CONV");
    if (!v) return Forced::kNone;
    if (std::strcmp(v, "onednn") == 0) return Forced::kOneDnn;
    if (std::strcmp(v, "direct") == 0) return Forced::kDirect;
    if (std::strcmp(v, "gemm") == 0) return Forced::kGemm;
    if (std::strcmp(v, "winograd") == 0) return Forced::kWinograd;
    if (std::strcmp(v, "tuned") == 0) return Forced::kTuned;
    throw Error(std::string("LOOM_CONV: expected onednn, direct, gemm, winograd or tuned, got '") +
                v + "'");
  }();
  return forced;
}

// Where the direct kernels beat im2col + GEMM (kernel_bench at the ResNet-20 and ResNet-18
// shapes, both forced with LOOM_CONV). The forward and the input gradient (a transposed conv)
// tile output positions by whole vectors, so planes under 8x8 leave lanes idle while the
// GEMM packs them densely. The weight gradient's register tile is channels x channels, so its
// direct kernel loses once both channel counts are wide (a GEMM with both dimensions past 64
// runs near peak).
constexpr int64_t kDirectMinPositions = 64;
constexpr int64_t kDirectMaxWeightChannels = 64 * 64;

bool direct_wins(const ConvGeometry& g, ConvPass pass) {
  switch (pass) {
    case ConvPass::kForward:
    case ConvPass::kGradInput: return g.oh * g.ow >= kDirectMinPositions;
    case ConvPass::kGradWeight:
      return (g.c / g.groups) * (g.o / g.groups) <= kDirectMaxWeightChannels;
  }
  return true;
}

// Where Winograd beats the direct kernels and im2col + GEMM: from 64 channels on both sides,
// in a build with AVX-512, whose 16-lane loops the kernel is written in. Without it (an
// AVX2-only EPYC, 2026-11-28, kernel_bench, float32, ms, forward / input gradient / weight
// gradient) its plain loops lose to oneDNN's channels-last kernels at ResNet-18's 64-channel
// 32x32 convs (32.3 / 39.1 / 45.2 against 22.8 / 24.4 / 39.0) and 128-channel 16x16 ones
// (23.9 / 32.3 / 42.0 against 25.1 / 21.2 / 29.3), and to im2col + GEMM at ResNet-20's
// 64-channel 8x8 ones (9.27 / 9.82 / 12.3 against 7.95 / 7.32 / 9.49): it is not chosen
// there (its weight gradient on 4x4 planes still is: winograd_weight_grad_chosen).
#ifdef __AVX512F__
constexpr bool kWinogradVectorised = true;
#else
constexpr bool kWinogradVectorised = false;
#endif
constexpr int64_t kWinogradMinChannels = 64;

bool winograd_wins(const ConvGeometry& g, ConvPass) {
  return kWinogradVectorised && std::min(g.c, g.o) >= kWinogradMinChannels;
}

// Where oneDNN beats loom's own kernels: kernel_bench on the 2-core development machine (AMD
// EPYC, AVX-512 with AVX512_BF16, shared with other jobs), every ResNet-20 (batch 128) and
// ResNet-18 CIFAR (batch 32) shape, each pass, oneDNN in both layouts against each of loom's
// algorithms forced, the best of 5 rounds. Ratios of loom's best time to oneDNN's best (above
// 1: oneDNN faster):
//   float32, stride 1: loom's direct kernels and Winograd keep the 3x3 convs, most of the
//     work: ResNet-20 0.74 to 0.89, ResNet-18 0.63 to 0.87 (its 256-channel weight gradient:
//     1.05), the stems 0.43 to 0.79 (ResNet-18's forward: 1.08); oneDNN's blocked kernels pay
//     for the reorders in and out. Only the 4x4 planes of ResNet-18's last stage (512
//     channels) go to oneDNN: 1.23 forward, 1.38 input gradient (weight gradient 0.96).
//   float32, strided: oneDNN's forward and input gradient of 3x3 convs: 1.12 to 1.72. The
//     1x1 projections and the weight gradients from 32x64 channels on: 1.06 to 2.72 (the
//     32-to-64 projection's input gradient 0.99). Below, loom's strided kernels (the direct
//     ones by phases) keep ResNet-20's 16-to-32 projection and its stage-2 entry's weight
//     gradient: best-of-5 ratios 1.23, 1.11 (projection forward and input gradient), 0.84,
//     0.85 (weight gradients), but the projection's medians over three alternating runs of
//     each were 0.44 and 0.97: oneDNN's threads split the work statically, and when another
//     process takes a core its calls on these small, memory-bound convs slow 2 to 3x (0.97 to
//     3.8 ms across runs, loom's 1.4 to 1.7 ms).
//   bfloat16: oneDNN's bfloat16 kernels against loom's float32 ones on widened operands: the
//     forward and input gradient 1.28 to 3.65 at every shape. The weight gradient too, in
//     oneDNN's blocked layout (onednn.cpp's conv_layout), re-measured on the idle machine
//     (2026-11-23, kernel_bench best of 0.2 s): 1.3 to 3.4 at every 3x3 shape (ResNet-20's
//     32-channel stage 7.85 against 2.32 ms, ResNet-18's 128-channel one 15.4 against 6.5 ms),
//     and about even on the strided 1x1 projections (0.75 against 0.81 ms). With a busy loop
//     taking one of the two cores it still won (7.1 against 7.8 ms at 32 channels).
constexpr int64_t kOneDnnMinProjection = 32 * 64;  // in x out channels: strided 1x1, weight grad
constexpr int64_t kOneDnnMaxPositions = 16;         // a stride-1 conv's output plane: 4x4
constexpr int64_t kOneDnnMinChannels = 256;         // ... and its channels, on both sides

bool strided(const ConvGeometry& g) { return g.sh > 1 || g.sw > 1; }

bool onednn_wins(const ConvGeometry& g, ConvPass pass, DType dtype) {
  const bool small_planes = g.oh * g.ow <= kOneDnnMaxPositions;
  if (dtype == DType::BFloat16) return true;
  if (strided(g)) {
    const bool pointwise_kernel = g.kh == 1 && g.kw == 1;
    if (pass == ConvPass::kGradWeight || pointwise_kernel)
      return (g.c / g.groups) * (g.o / g.groups) >= kOneDnnMinProjection;
    return true;
  }
  return pass != ConvPass::kGradWeight && small_planes &&
         std::min(g.c, g.o) >= kOneDnnMinChannels;
}

}  // namespace

ConvAlgorithm own_conv_algorithm(const ConvGeometry& g, ConvPass pass) {
  // LOOM_CONV=onednn leaves loom's own choice (where oneDNN does not run) as it is.
  const Forced forced = forced_choice();
  const bool choose =
      forced == Forced::kNone || forced == Forced::kTuned || forced == Forced::kOneDnn;
  if (winograd_applies(g) &&
      (forced == Forced::kWinograd || (choose && winograd_wins(g, pass))))
    return ConvAlgorithm::kWinograd;
  return direct_chosen(g, pass) ? ConvAlgorithm::kDirect : ConvAlgorithm::kGemm;
}

bool direct_chosen(const ConvGeometry& g, ConvPass pass) {
  if (!direct_applies(g)) return false;
  switch (forced_choice()) {
    case Forced::kDirect: return true;
    case Forced::kGemm: return false;
    case Forced::kOneDnn:
    case Forced::kWinograd:
    case Forced::kNone:
    case Forced::kTuned: break;
  }
  return direct_wins(g, pass);
}

// Where loom's bfloat16 weight gradient beats oneDNN's on channels-last activations
// (kernel_bench's Bf16WeightGrad rows, both back to back, medians of 3, 2026-11-24, a shared
// 2-core machine): oneDNN's time over loom's 1.3 (16 channels), 2.2 (16 to 32, stride 2), 1.3
// (32), 2.5 (32 to 64, stride 2) and 1.3 (64) at ResNet-20's shapes, 1.19 (64 channels),
// 1.15 (64 to 128, stride 2), 1.4 (128 to 256) and 1.55 (256 to 512) at ResNet-18's. At
// stride 1 from 128 channels on oneDNN's runs near the peak and the two are even: 1.02 and
// 0.97 (128 channels, two runs), 0.95 (256), 0.93 (512; oneDNN's own time varies by 30%
// between runs there). Those stay on oneDNN, except under deterministic algorithms, where the
// alternative is loom's float32 kernels on widened copies.
constexpr int64_t kOwnMaxWeightChannels = 64 * 64;  // in x out channels at stride 1

bool bf16_weight_grad_chosen(const ConvGeometry& g) {
  if (forced_choice() == Forced::kOneDnn || !bf16_weight_grad_applies(g)) return false;
  if (are_deterministic_algorithms_enabled()) return true;
  if (onednn::amx_bfloat16()) return false;  // oneDNN's AMX kernels win everywhere but one shape
  return strided(g) || g.c * g.o <= kOwnMaxWeightChannels;
}

// Where loom's float32 Winograd weight gradient, on [N,C,H,W] copies of the channels-last
// operands, beats oneDNN's on channels-last activations (2026-11-25, the 2-core Sapphire
// Rapids machine, float32, oneDNN's time over loom's, copies included). kernel_bench's
// WinogradWeightGrad rows at ResNet's shapes: 1.63 at ResNet-18's 512-channel 4x4 stage (10.7
// against 6.56 ms), 1.08 at its 256-channel 8x8 one, 0.65 to 0.91 at 64 and 128 channels. A
// scratch program, best of 20, 512 channels on 4x4 planes by batch: 0.31 (1), 0.81 (4), 1.03
// (8), 1.29 to 1.30 (16, 32), 1.54 (64), 1.70 (128); 256 channels on 4x4: 0.28 to 0.91; 512
// and 1024 channels at batch 16 and 32 on 2x2, 3x3, 4x4 and 7x7 planes: 1.48 to 2.45, 1.02 to
// 1.37, 1.28 to 1.68, and 0.92 to 1.13. In ResNet-18 training steps (loom_bench captured,
// batch 32) the 512-channel weight gradient took 7.8 ms against oneDNN's 10.6, while the
// 256-channel one took 7.8 against 6.6: it stays on oneDNN. On an AVX2-only EPYC (2026-11-28,
// Winograd's plain loops) the 512-channel one still won, 28.1 against 52.1 ms, and the
// 256-channel one was even (28.8 against 31.5).
constexpr int64_t kWinogradGradMaxPositions = 16;   // the output plane: 4x4
constexpr int64_t kWinogradGradMinChannels = 512;   // on both sides
constexpr int64_t kWinogradGradMinBatch = 16;

bool winograd_weight_grad_chosen(const ConvGeometry& g, DType dtype) {
  if (dtype != DType::Float32 || !winograd_applies(g)) return false;
  switch (forced_choice()) {
    case Forced::kWinograd: return true;
    case Forced::kNone:
    case Forced::kTuned: break;
    case Forced::kOneDnn:
    case Forced::kDirect:
    case Forced::kGemm: return false;
  }
  // Below AVX-512 im2col and a matmul take it first (conv_matmul_chosen: 26.0 against 27.3 ms
  // in kernel_bench, 23.0 against 27.1 in ResNet-18 steps).
  return g.oh * g.ow <= kWinogradGradMaxPositions && g.n >= kWinogradGradMinBatch &&
         std::min(g.c, g.o) >= kWinogradGradMinChannels &&
         !conv_matmul_chosen(g, ConvPass::kGradWeight, dtype) &&
         !f32_winograd_chosen(g, ConvPass::kGradWeight);
}

// Where loom's bfloat16 Winograd beats oneDNN's direct bfloat16 kernels on channels-last
// activations (kernel_bench's Bf16Winograd rows, both back to back, 2026-11-24, the shared
// 2-core machine, two runs): oneDNN's time over loom's, forward and input gradient, 1.41 and
// 1.42 / 1.41 and 1.15 at ResNet-20's 64 channels (8x8), 1.44 and 1.38 / 1.44 and 1.37 at
// ResNet-18's 64 (32x32), 1.84 and 1.40 / 1.50 and 1.46 at 128 (16x16), 1.69 and 1.70 / 1.65
// and 1.57 at 256 (8x8), and at 512 (4x4) 1.28 and 1.01 / 1.23 and 0.89: that input gradient,
// four tiles per image, stays on oneDNN. At 32 channels the two are even or oneDNN is ahead
// (0.99 to 1.03, one 0.81) and at 16 loom's is 1.7 to 2.2x slower: its GEMMs' inner
// dimension is too short for the transforms they carry.
constexpr int64_t kBf16WinogradMinChannels = 64;     // on both sides
constexpr int64_t kBf16WinogradMinGradPositions = 17;  // the input gradient's plane: over 4x4

// LOOM_BF16_WINOGRAD=0 keeps the passes the bfloat16 Winograd would take (forward, input
// gradient) on oneDNN's direct kernels; the weight gradient's choice does not read it.
// Winograd rounds its transformed operands to bfloat16, a few times a direct conv's rounding
// error (conv_winograd_bf16.h).
bool bf16_winograd_allowed() {
  static const bool allowed = ir::env_setting("LOOM_BF16_WINOGRAD", "1", {"0", "1"}) == "1";
  return allowed;
}

// What LOOM_CONV says of a channels-last Winograd that applies: chosen (winograd), not (another
// algorithm), or nothing (unset: the measured rule decides).
std::optional<bool> channels_last_winograd_forced() {
  switch (forced_choice()) {
    case Forced::kWinograd: return true;
    case Forced::kNone:
    case Forced::kTuned: return std::nullopt;
    case Forced::kOneDnn:
    case Forced::kDirect:
    case Forced::kGemm: return false;
  }
  return std::nullopt;
}

bool bf16_winograd_chosen(const ConvGeometry& g, ConvPass pass) {
  if (pass == ConvPass::kGradWeight || !bf16_winograd_applies(g) || !bf16_winograd_allowed())
    return false;
  if (const auto forced = channels_last_winograd_forced()) return *forced;
  if (onednn::amx_bfloat16()) return false;  // oneDNN's AMX kernels are 3.2 to 6.7x faster
  return std::min(g.c, g.o) >= kBf16WinogradMinChannels &&
         (pass == ConvPass::kForward || g.h * g.w >= kBf16WinogradMinGradPositions);
}

// Where loom's float32 channels-last Winograd on AVX2 (conv_winograd_f32.h) beats oneDNN's
// 8-lane kernels, below AVX-512 (an AVX2-only EPYC, 2026-11-28, kernel_bench's F32Winograd
// rows, oneDNN in the layout loom gives it against the Winograd, back to back, best of three
// or four interleaved runs, ms, forward / input gradient): ResNet-18's 64-channel 32x32 convs
// 21.3 vs 9.7 / 21.1 vs 9.7, its 128-channel 16x16 ones 22.5 vs 8.4 / 18.6 vs 9.3, 256-channel
// 8x8 21.5 vs 10.7 / 18.5 vs 11.3, 512-channel 4x4 22.6 vs 14.7 / 22.4 vs 16.5; ResNet-20's
// 64-channel 8x8 stage 4.8 vs 2.1 / 4.6 vs 2.1, its 32-channel 16x16 5.9 vs 2.9 / 4.9 vs 2.7
// and its 16-channel 32x32 6.0 vs 4.7 / 5.3 vs 5.1. The weight gradient by F(3x3, 2x2), against
// oneDNN's and im2col + matmul (the rule below AVX-512 before it), same run conditions: 64
// channels 32x32 15.5 vs 36.3 and 27.7, 128 16x16 14.0 vs 28.0 and 24.9, 256 8x8 15.1 vs 26.0
// and 24.1, 512 4x4 16.9 vs 40.7 and 23.2; ResNet-20's 16, 32 and 64 channels 6.8, 4.2 and 3.7
// vs 8.0, 7.2 and 6.7 (oneDNN; the matmul 21.0, 9.9 and 6.9). Its sums go in fixed groups of
// tiles, so it also runs under deterministic algorithms. Planes under 4x4 were not measured;
// nor was AVX-512, where oneDNN's 16-lane kernels and loom's other Winograds run.
// At ResNet-20's 16 channels a direct conv was tried too (2026-11-29, not kept): 16 output
// channels are two vectors, so a register tile of 6 positions x 16 channels (12 sums, one
// broadcast input per two FMAs) over zero-padded row copies; kernel_bench's F32Winograd rows
// in one run: forward 4.47 against the Winograd's 4.08 ms, input gradient 4.14 against 4.15,
// weight gradient 5.36 against 5.01 (the direct conv at 113-146 GFLOP/s, 59-76% of the FMA
// loop). Those figures are the first version's, in 2x2 output tiles; the 4x4 tiles it takes
// now (f32_winograd_tile) are faster still: oneDNN's time over theirs 1.3 to 3.8x in the runs
// below.
constexpr int64_t kF32WinogradMinPlane = 4 * 4;  // output positions of the pass's conv

// LOOM_F32_WINOGRAD: 1 (the default: the tile by the rule in f32_winograd_tile), 4x4 or 2x2
// (those tiles everywhere), or 0 (off).
const std::string& f32_winograd_setting() {
  static const std::string setting =
      ir::env_setting("LOOM_F32_WINOGRAD", "1", {"0", "1", "4x4", "2x2"});
  return setting;
}

bool f32_winograd_allowed() { return f32_winograd_setting() != "0"; }

// The pass's output plane; Winograd runs it from 4x4 up.
int64_t f32_winograd_plane(const ConvGeometry& g, ConvPass pass) {
  return pass == ConvPass::kGradInput ? g.h * g.w : g.oh * g.ow;
}

bool f32_winograd_chosen(const ConvGeometry& g, ConvPass pass) {
  if (!f32_winograd_applies(g) || !f32_winograd_allowed()) return false;
  if (const auto forced = channels_last_winograd_forced()) return *forced;
  return !onednn::avx512_core() && f32_winograd_plane(g, pass) >= kF32WinogradMinPlane;
}

// 4x4 output tiles against 2x2 (kernel_bench's F32Winograd rows, kernels 1 and 3, two
// interleaved runs, 2026-11-29, the AVX2 EPYC; the 2x2 tiles' time over the 4x4's, forward /
// input gradient / weight gradient): ResNet-20's 16 channels 32x32 1.35, 0.84 (a disturbed
// pair) / 1.25, 1.34 / 1.18, 1.44, 32 channels 16x16 1.34, 1.20 / 1.37, 1.25 / 1.36, 1.45, 64
// channels 8x8 1.15, 1.48 / 1.58, 1.81 / 1.37, 1.48; ResNet-18's 64 channels 32x32 1.14, 1.27 /
// 1.35, 1.29 / 1.30, 1.45, 128 16x16 1.16, 1.28 / 1.45, 2.09 / 1.57, 1.68, 256 8x8 1.44, 1.38 /
// 1.15, 1.33 / 1.34, 1.30, but 512 4x4 (one 4x4 tile per image, 20 of its 36 inputs padding)
// 1.17, 0.99 / 0.87, 1.14 / 0.93, 0.96: even, so there the 2x2 tiles, whose error is smaller.
int f32_winograd_tile(const ConvGeometry& g, ConvPass pass) {
  const std::string& setting = f32_winograd_setting();
  if (setting == "2x2") return 2;
  if (setting == "4x4") return 4;
  return f32_winograd_plane(g, pass) > kF32WinogradMinPlane ? 4 : 2;
}

// Where im2col + one oneDNN matmul beats oneDNN's direct kernels on channels-last activations
// (kernel_bench's ConvMatmul rows, both back to back, 2026-11-24, the 2-core Sapphire Rapids
// development machine, best of 0.2 s; oneDNN's time over the matmul's):
//   bfloat16 (AMX, two runs): ResNet-18's 512-channel 4x4 convs 1.5 to 1.7 (forward), 1.8
//     (input gradient) and 4.0 to 4.6 (weight gradient); its strided 3x3 convs' weight
//     gradients 1.3 (64 to 128), 2.6 to 3.6 (128 to 256) and 5.5 to 6.4 (256 to 512), and the
//     8x8 256-channel one's 1.26 to 1.35; the strided 1x1 projections 1.5 to 1.7 forward and 4
//     to 10 weight gradient (from 32 to 64 channels on). Elsewhere the direct kernels win: the
//     stems and ResNet-20's 16-to-32 convs (0.15 to 0.7), stride-1 convs on 8x8 planes and
//     larger below 256 channels (0.27 to 0.77; the matmul's im2col grows with the plane while a
//     direct kernel reads its input once), and the strided 3x3 forward below 256 output
//     channels (0.68 to 0.8).
//   float32 (two runs): the forward of the convs onto 4x4 planes from 256 channels, 1.31 and
//     1.40 (512 channels), 1.33 and 1.58 (256 to 512, stride 2), 1.46 and 1.30 (its 1x1
//     projection), and those two strided convs' weight gradients, 1.20 and 1.31, 1.25 and
//     1.27. oneDNN's float32 matmul with a transposed operand runs at 180 GFLOP/s, so the
//     512-channel weight gradient (0.77, 0.80) and input gradient (0.74, 0.82) stay direct, as
//     does every stride-1 conv on 8x8 planes and larger (0.15 to 0.88). The strided 1x1
//     projections onto 8x8 planes win by 1.1 to 1.47 (0.92 once) at a few hundredths of a
//     millisecond each; they stay direct too.
// Below AVX-512 (an AVX2-only EPYC, 2026-11-28, the same rows, float32, medians of two
// interleaved runs, oneDNN's channels-last time over the matmul's) the weight gradient goes
// the other way at most shapes: oneDNN's 8-lane kernels ran it at 57 to 80 GFLOP/s, its GEMM
// faster. 1.49 (ResNet-20's 32-to-64 strided conv), 1.08 (its 64-channel 8x8 stage), 1.31
// (ResNet-18's 64-channel 32x32), 1.58 (64 to 128, strided), 1.09 (128 channels, 16x16), 1.31
// (128 to 256), 1.38 (256, 8x8), 2.03 (256 to 512) and 1.96 (512, 4x4; 26.0 against loom's
// Winograd's 27.3 ms); it lost with fewer than 32 input or 64 output channels (0.20 to 0.95:
// the stems, ResNet-20's 16- and 32-channel stages), and the forward and input gradient
// stayed on oneDNN's kernels nearly everywhere (the forward runs blocked there:
// onednn::channels_last_layout). So below AVX-512 the float32 weight gradient of every conv
// with a window (not 1x1) from 32 input and 64 output channels, on output planes up to the
// measured 32x32, that the float32 Winograd does not take (since 2026-11-28 it takes the 3x3
// stride-1 ones, f32_winograd_chosen: here the strided ones stay) runs as im2col and matmuls
// (groups of images within kWeightGradColumnBytes, conv_matmul.h: ResNet-18's 64-channel convs
// need 75 MB for all 32 images). In ResNet-18 b32
// training steps (loom_bench --profile, captured, old and new binaries alternated three times)
// the weight gradients took 2545 to 2728 ms over five steps before, 1917 to 2006 after, and
// the steps 1.32, 1.42 and 1.36 s before, 1.16, 1.13 and 1.24 after; ResNet-20 b128 moved
// within noise (weight gradients 1031 and 1354 ms before, 952 and 1335 after).
constexpr int64_t kAvx2GemmWeightGradMinIn = 32;
constexpr int64_t kAvx2GemmWeightGradMinOut = 64;
constexpr int64_t kAvx2GemmWeightGradMaxPlane = 32 * 32;
constexpr int64_t kGemmMaxSmallPlane = 16;        // output positions: 4x4
constexpr int64_t kGemmMaxWeightGradPlane = 64;   // ... 8x8, for the bfloat16 weight gradient
constexpr int64_t kGemmMinChannels = 256;         // on both sides, at those planes
constexpr int64_t kGemmMinProjection = 32 * 64;   // in x out channels: bfloat16 strided convs
// im2col's buffer (kept per thread for the next call) at most this size: the measured shapes
// need 0.5 to 9.4 MB, and a strided conv on a larger image would otherwise take hundreds.
constexpr int64_t kGemmMaxColumnBytes = int64_t{32} << 20;

// The bytes of im2col's buffer for pass `pass` of `g` (the input gradient's im2col reads
// grad_out at the input's plane; a 1x1 stride-1 unpadded conv needs none; a float32 weight
// gradient's, one group of images).
int64_t column_bytes(const ConvGeometry& g, ConvPass pass, DType dtype) {
  if (pointwise(g)) return 0;
  const int64_t positions = pass == ConvPass::kGradInput ? g.h * g.w : g.oh * g.ow;
  const int64_t depth = g.kh * g.kw * (pass == ConvPass::kGradInput ? g.o : g.c);
  // A float32 weight gradient takes its images in groups (conv_matmul.h).
  const int64_t images = pass == ConvPass::kGradWeight ? weight_grad_images(g, dtype) : g.n;
  return images * positions * depth * static_cast<int64_t>(dtype_size(dtype));
}

bool conv_matmul_chosen(const ConvGeometry& g, ConvPass pass, DType dtype) {
  if (!conv_matmul_applies(g, pass, dtype) || are_deterministic_algorithms_enabled())
    return false;
  switch (forced_choice()) {
    case Forced::kGemm: return true;
    case Forced::kNone:
    case Forced::kTuned: break;
    case Forced::kOneDnn:
    case Forced::kDirect:
    case Forced::kWinograd: return false;
  }
  if (column_bytes(g, pass, dtype) > kGemmMaxColumnBytes) return false;
  // Below AVX-512 the float32 Winograd beats it wherever that applies (f32_winograd_chosen).
  if (dtype == DType::Float32 && f32_winograd_chosen(g, pass)) return false;
  const int64_t plane = g.oh * g.ow, channels = std::min(g.c, g.o);
  const bool wide = channels >= kGemmMinChannels;
  if (dtype == DType::Float32) {
    const bool small = wide && plane <= kGemmMaxSmallPlane;
    if (small && (pass == ConvPass::kForward || (pass == ConvPass::kGradWeight && strided(g))))
      return true;
    return pass == ConvPass::kGradWeight && !onednn::avx512_core() && g.kh * g.kw > 1 &&
           g.c >= kAvx2GemmWeightGradMinIn && g.o >= kAvx2GemmWeightGradMinOut &&
           plane <= kAvx2GemmWeightGradMaxPlane;
  }
  const bool projection = strided(g) && g.c * g.o >= kGemmMinProjection;
  switch (pass) {
    case ConvPass::kForward:
      return (wide && plane <= kGemmMaxSmallPlane) || (projection && g.kh == 1 && g.kw == 1);
    case ConvPass::kGradInput: return wide && plane <= kGemmMaxSmallPlane;
    case ConvPass::kGradWeight: return (wide && plane <= kGemmMaxWeightGradPlane) || projection;
  }
  return false;
}

bool own_algorithm_forced() {
  const Forced forced = forced_choice();
  return forced != Forced::kNone && forced != Forced::kTuned && forced != Forced::kOneDnn;
}

bool conv_tuning_requested() { return forced_choice() == Forced::kTuned; }

bool f32_winograd_available(const ConvGeometry& g) {
  return f32_winograd_applies(g) && f32_winograd_allowed();
}

bool bf16_winograd_available(const ConvGeometry& g, ConvPass pass) {
  return pass != ConvPass::kGradWeight && bf16_winograd_applies(g) && bf16_winograd_allowed();
}

bool conv_matmul_available(const ConvGeometry& g, ConvPass pass, DType dtype) {
  return conv_matmul_applies(g, pass, dtype) &&
         column_bytes(g, pass, dtype) <= kGemmMaxColumnBytes;
}

ConvAlgorithm conv_algorithm(const ConvGeometry& g, ConvPass pass, DType dtype) {
  const Forced forced = forced_choice();
  // oneDNN's weight gradient splits its sum over images by the thread count; below AVX-512
  // oneDNN has no bfloat16 convs (the kernels widen them to loom's float32 ones).
  const bool onednn_allowed =
      !(pass == ConvPass::kGradWeight && are_deterministic_algorithms_enabled()) &&
      (dtype != DType::BFloat16 || onednn::bfloat16_supported());
  if (onednn_allowed) {
    if (forced == Forced::kOneDnn) return ConvAlgorithm::kOneDnn;
    if ((forced == Forced::kNone || forced == Forced::kTuned) && onednn_wins(g, pass, dtype))
      return ConvAlgorithm::kOneDnn;
  }
  return own_conv_algorithm(g, pass);
}

}  // namespace loom::runtime
