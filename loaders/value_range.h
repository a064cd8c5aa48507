// Checking integer fields against a ValueRange piece by piece (HDF5 columns are read in
// blocks), with one message for the whole field: the first bad value and how many there are.
#pragma once

#include <loom/data/dataset.h>

#include <cstdint>
#include <string>

namespace loom::data::detail {

class RangeCheck {
 public:
  // Throws loom::Error naming `source` when `dtype` is not an integer type. A row (sample) holds
  // `row_elements` values.
  RangeCheck(ValueRange range, HostDType dtype, int64_t row_elements, std::string source, std::string unit);

  // Scans rows [first_row, first_row + rows), stored at `data`.
  void scan(const unsigned char* data, int64_t first_row, int64_t rows);
  // Throws loom::Error("<source>: sample 17 is 12, expected a class in [0, 10) (out of range: 3
  // of 10000 samples)") when a scanned value was out of range.
  void finish() const;

 private:
  ValueRange range_;
  HostDType dtype_;
  int64_t row_elements_;
  std::string source_, unit_;
  int64_t scanned_ = 0;  // values
  int64_t bad_ = 0;
  int64_t first_bad_ = -1;  // value index
  int64_t first_value_ = 0;
};

}  // namespace loom::data::detail
