// The CPU backend's caching allocator: freed blocks go to a free list per size class (powers
// of two) and are handed out again, so a steady training step allocates nothing from the
// system. A block's Storage (bytes(): its size class) returns it to the cache when freed.
#pragma once

#include "runtime/storage.h"

#include <cstddef>
#include <memory>

namespace loom::runtime {

// Thread-safe. Blocks are 64-byte aligned; blocks of 2 MB and more start on a 2 MB boundary
// and are advised for transparent huge pages (LOOM_HUGE_PAGES=0: not).
std::shared_ptr<Storage> allocate(std::size_t bytes);

// Returns cached blocks to the system.
void empty_cache();

}  // namespace loom::runtime
