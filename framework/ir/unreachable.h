// LOOM_UNREACHABLE("message"): marks a point the code can never reach, such as the end of
// a function whose switch over ir::Op returns from every case.
//
//   switch (op) {
//     case Op::Add: return ...;
//     ...                          // every Op listed, no default: (-Werror=switch)
//   }
//   LOOM_UNREACHABLE("run_kernel: op out of range");
//
// Reaching it means memory holds an invalid enum value or an invariant is broken, so it
// prints the message with its file and line and aborts, in Release builds too: a silent
// fall-through would return garbage or leave a buffer unwritten. Never use it for what a
// user can cause; that throws loom::Error.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace loom::detail {

[[noreturn]] inline void unreachable(const char* message, const char* file, int line) noexcept {
  std::fprintf(stderr, "%s:%d: unreachable: %s\n", file, line, message);
  std::fflush(stderr);
  std::abort();
}

}  // namespace loom::detail

#define LOOM_UNREACHABLE(message) ::loom::detail::unreachable((message), __FILE__, __LINE__)
