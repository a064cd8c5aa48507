// ValueRange checks: check_values() and the piecewise RangeCheck behind it.
#include "value_range.h"

#include <loom/error.h>

namespace loom::data {
namespace detail {
namespace {

std::string expected_of(const ValueRange& r) {
  return r.what + " in [" + std::to_string(r.low) + ", " + std::to_string(r.high) + ")";
}

}  // namespace

RangeCheck::RangeCheck(ValueRange range, HostDType dtype, int64_t row_elements, std::string source, std::string unit)
    : range_(std::move(range)), dtype_(dtype), row_elements_(row_elements), source_(std::move(source)),
      unit_(std::move(unit)) {
  if (range_.high <= range_.low) throw Error(source_ + ": an empty range of values, " + expected_of(range_));
  if (is_floating(dtype_) || dtype_ == HostDType::Bool)
    throw Error(source_ + ": expected integers (" + expected_of(range_) + "), got " + host_dtype_name(dtype_) +
                " values");
}

void RangeCheck::scan(const unsigned char* data, int64_t first_row, int64_t rows) {
  const int64_t n = rows * row_elements_, base = first_row * row_elements_;
  auto run = [&](const auto* p) {
    for (int64_t i = 0; i < n; ++i) {
      const auto v = static_cast<int64_t>(p[i]);
      if (v >= range_.low && v < range_.high) continue;
      if (bad_++ == 0) {
        first_bad_ = base + i;
        first_value_ = v;
      }
    }
  };
  switch (dtype_) {
    case HostDType::UInt8: run(reinterpret_cast<const uint8_t*>(data)); break;
    case HostDType::Int32: run(reinterpret_cast<const int32_t*>(data)); break;
    case HostDType::Int64: run(reinterpret_cast<const int64_t*>(data)); break;
    case HostDType::Float32:
    case HostDType::Float64:
    case HostDType::Bool: break;  // rejected by the constructor
  }
  scanned_ += n;
}

void RangeCheck::finish() const {
  if (bad_ == 0) return;
  const bool per_value = row_elements_ != 1;
  std::string where = unit_ + " " + std::to_string(row_elements_ > 0 ? first_bad_ / row_elements_ : first_bad_);
  if (per_value) where += " element " + std::to_string(first_bad_ % row_elements_);
  throw Error(source_ + ": " + where + " is " + std::to_string(first_value_) + ", expected " + expected_of(range_) +
              " (out of range: " + std::to_string(bad_) + " of " + std::to_string(scanned_) + " " +
              (per_value ? "values" : unit_ + "s") + ")");
}

}  // namespace detail

void check_values(const HostArray& values, const ValueRange& range, const std::string& source, int64_t first_sample,
                  const std::string& unit) {
  const int64_t rows = values.shape.empty() ? 1 : values.shape[0];
  const int64_t row_elements = rows > 0 ? values.numel() / rows : 0;
  detail::RangeCheck check(range, values.dtype, row_elements, source, unit);
  check.scan(values.bytes.data(), first_sample, rows);
  check.finish();
}

}  // namespace loom::data
