// The test suite's second backend, "guarded": a device that is not the CPU in disguise. It
// has its own memory, registration, device name, device thread and compile target, and
// reaches the CPU's kernels only through the backend contract (runtime/backend.h), the way a
// GPU backend would reach a library.
//
//   Device g = test::guarded_device();        // registers "guarded" on first use
//   auto x = from_vector<float>({1, 2}, {2}).to(g);
//   model->to(g);                             // train as on the CPU
//   EXPECT_EQ(test::guard_violations(), 0);
//
// Memory: every block has guard bands before and after it, and is filled with 0xFF bytes
// (NaN as a float, -1 as an integer) when handed out and when freed, so an engine that reads
// memory it never wrote, writes past what it asked for, or writes after freeing shows up:
// poisoned results, or a violation counted (and printed) when the block is checked. Freed
// blocks wait in a quarantine of recent frees before going back to the system, and are checked
// again then.
//
// Host memory (alloc_host, the blocks the DeviceLoader collates into) is guarded and poisoned
// the same way; copy_in counts the copies whose source lies inside such a block and checks
// its guards first, as the CUDA backend copies its page-locked blocks without staging.
//
// Execution: a program compiles to the CPU backend's executable for the same Program; a run
// copies its inputs into CPU storage (copy_in), queues the CPU run (execute) and copies the
// results back (copy_out), all on the guarded device's own thread.
#pragma once

#include <loom/dtype.h>

#include <cstdint>

namespace loom::test {

// Registers the kind on first call (two devices: guarded:0 and guarded:1).
Device guarded_device(int index = 0);
// Guard bands found overwritten and freed blocks found written, since the process started.
int64_t guard_violations();
// Blocks of guarded memory alive now (not freed).
int64_t guarded_blocks_alive();
// Host blocks (Backend::alloc_host) alive now, and made since the process started.
int64_t guarded_host_blocks_alive();
int64_t guarded_host_blocks_made();
// copy_in calls whose source lay inside a host block alive at the time.
int64_t guarded_copies_from_host_blocks();

}  // namespace loom::test
