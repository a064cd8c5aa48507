// The conv algorithm choice (conv_algorithm.h), with the measurements behind each threshold.
#include "runtime/cpu/conv/conv_algorithm.h"

#include "runtime/cpu/conv/conv_direct.h"
#include "runtime/cpu/conv/conv_winograd.h"

#include <loom/error.h>
#include <loom/lazy.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

namespace loom::runtime {
namespace {

enum class Forced { kNone, kOneDnn, kDirect, kGemm, kWinograd };

Forced forced_choice() {
  static const Forced forced = [] {
    const char* v = std::getenv("LOOM_CONV");
    if (!v) return Forced::kNone;
    if (std::strcmp(v, "onednn") == 0) return Forced::kOneDnn;
    if (std::strcmp(v, "direct") == 0) return Forced::kDirect;
    if (std::strcmp(v, "gemm") == 0) return Forced::kGemm;
    if (std::strcmp(v, "winograd") == 0) return Forced::kWinograd;
    throw Error(std::string("LOOM_CONV: expected onednn, direct, gemm or winograd, got '") + v +
                "'");
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

// Where Winograd beats the direct kernels and im2col + GEMM: from 64 channels on both sides.
constexpr int64_t kWinogradMinChannels = 64;

bool winograd_wins(const ConvGeometry& g, ConvPass) {
  return std::min(g.c, g.o) >= kWinogradMinChannels;
}

// Where oneDNN beats loom's own kernels in float32 (to be measured).
bool onednn_wins(const ConvGeometry& g, ConvPass) { return g.sh > 1 || g.sw > 1; }

}  // namespace

ConvAlgorithm own_conv_algorithm(const ConvGeometry& g, ConvPass pass) {
  // LOOM_CONV=onednn leaves loom's own choice (where oneDNN does not run) as it is.
  const Forced forced = forced_choice();
  const bool choose = forced == Forced::kNone || forced == Forced::kOneDnn;
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
    case Forced::kNone: break;
  }
  return direct_wins(g, pass);
}

ConvAlgorithm conv_algorithm(const ConvGeometry& g, ConvPass pass, DType dtype) {
  const Forced forced = forced_choice();
  // oneDNN's weight gradient splits its sum over images by the thread count.
  const bool onednn_allowed =
      !(pass == ConvPass::kGradWeight && are_deterministic_algorithms_enabled());
  if (onednn_allowed) {
    if (forced == Forced::kOneDnn) return ConvAlgorithm::kOneDnn;
    if (forced == Forced::kNone && (dtype == DType::BFloat16 || onednn_wins(g, pass)))
      return ConvAlgorithm::kOneDnn;
  }
  return own_conv_algorithm(g, pass);
}

}  // namespace loom::runtime
