// Spans whose times the caller measured itself, on a named track: a row of its own in the
// trace, beside the threads' rows and on the same time axis. For work timed elsewhere than on a
// host thread's clock, such as kernels timed by CUDA events:
//
//   const int row = profiler::track("cuda:0 stream");
//   profiler::add_span(row, "conv2d", start_ns, end_ns);   // times on now_ns()'s clock
#pragma once

#include <cstdint>
#include <string>

namespace loom::profiler {

// The profiler's clock (std::chrono::steady_clock) in nanoseconds: every span's time axis.
int64_t now_ns();

// The track named `name`, made at its first use; the same name gives the same track.
int track(const std::string& name);

// Records a span on `track` from `start_ns` to `end_ns` (now_ns()'s clock). Recorded even if the
// profiler has stopped since: as with Trace, the caller checks is_running() when the work it
// times begins. `name` must live until the spans are saved (a literal or an op's name).
void add_span(int track, const char* name, int64_t start_ns, int64_t end_ns);

}  // namespace loom::profiler
