// Op attributes: a list of integers and one scalar, with per-op meaning documented in op.h.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::ir {

struct Attr {
  std::vector<int64_t> ints;
  double scalar = 0;
  bool operator==(const Attr&) const = default;
};

}  // namespace loom::ir
