// Buffer donation as every backend's program runner applies it (memory_plan.h decides which
// inputs may hold a result; the runner decides, per run, which actually can): an input whose
// buffer nothing but this run holds is taken over by the first result that lists it among
// its donors and fits in it.
#pragma once

#include "ir/program.h"
#include "runtime/buffer.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace loom::runtime {

// Whether nothing but this run holds input buffer `b`: its tensors are gone (the step
// overwrote them) and no other buffer shares its storage. Only the device thread holds the
// last reference then, so no other thread can take a new one.
inline bool only_this_run_holds(const std::shared_ptr<DeviceBuffer>& b) {
  return b.use_count() == 1 && b->storage && b->storage.use_count() == 1;
}

// The storage of the first donor of `in` that is still donatable this run and holds `bytes`,
// marked used (one result per donor); null when there is none. `donatable` and `owned` are
// per input slot.
inline std::shared_ptr<Storage> take_donor(const ir::Instr& in, std::size_t bytes,
                                           std::vector<uint8_t>& donatable,
                                           const std::vector<std::shared_ptr<Storage>>& owned) {
  for (int d : in.donors) {
    if (!donatable[d] || owned[d]->bytes() < bytes) continue;
    donatable[d] = 0;
    return owned[d];
  }
  return nullptr;
}

}  // namespace loom::runtime
