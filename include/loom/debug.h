// Why did it recompile, and which line reads from the device every step?
//
//   auto causes = loom::debug::recompile_causes();
//   // {site: "train.cpp:42", cause: "input 0 changed from float32[128,1,28,28] to float32[96,1,28,28]"}
//   for (auto& w : loom::debug::warnings()) std::cerr << w << '\n';
//
// Every uncached compile is compared with the last graph compiled at the same call site (the
// line that called mark_step, item(), to_vector(), ...), and the first difference is
// reported. With LOOM_DEBUG=1 each cause is also printed to stderr as it happens.
//
// Per-step analysis (always on): after a warm-up of 3 steps, loom warns (on stderr and in
// warnings()) when compiles or reads from the device happen in more than half of the last 10
// steps: compiles once, naming the last cause and its call site, reads once per call site.
// Reads made inside step closures do not count: that is what closures are for; nor do those
// made under an ExpectedReads.
#pragma once

#include <string>
#include <vector>

namespace loom::debug {

struct RecompileCause {
  std::string site;   // file:line of the call that compiled
  std::string cause;  // the first difference from the last graph compiled there
};

// The causes of the uncached compiles since the last reset, and the replay guards of compiled
// functions that failed ("guard failed: ..."; loom/compile.h): the most recent 100.
std::vector<RecompileCause> recompile_causes();
std::vector<std::string> warnings();
void reset();

// While one lives (on this thread), reads from the device are the loop's purpose, not a
// stall to warn about: the per-step analysis does not count them (sampling a token each step
// to feed it back, as train_decoder --generate does).
class ExpectedReads {
 public:
  ExpectedReads();
  ~ExpectedReads();
  ExpectedReads(const ExpectedReads&) = delete;
  ExpectedReads& operator=(const ExpectedReads&) = delete;
};

}  // namespace loom::debug
