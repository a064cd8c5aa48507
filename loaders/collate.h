// collate() with the batch's memory chosen by the caller: the public collate() stacks into
// HostArrays, the DeviceLoader into host memory of the device it feeds (loom::alloc_host), so
// that the copy to the device reads the bytes where collation wrote them.
#pragma once

#include <loom/data/dataset.h>

#include <functional>
#include <span>
#include <string>
#include <vector>

namespace loom::data::detail {

// Where one field of the batch goes: `bytes` writable bytes (may be nullptr when bytes is 0)
// for the field `name`, of `dtype` and `shape` (the batch dimension first).
using PlaceField = std::function<unsigned char*(const std::string& name, HostDType dtype,
                                                const Shape& shape, std::size_t bytes)>;

// Asks `place` for every field of examples[0], in name order, then writes sample i's bytes
// at row i of each field: every byte of what `place` gave is written. Throws collate()'s
// errors (no examples; a sample whose fields, dtypes or shapes differ from sample 0's), which
// name each sample by `ids[i]` when given (the dataset's indices), else by its position i.
void collate_into(const std::vector<Example>& examples, const PlaceField& place,
                  std::span<const int64_t> ids = {});

}  // namespace loom::data::detail
