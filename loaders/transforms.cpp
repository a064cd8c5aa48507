// Built-in host transforms. Each checks its field's dtype and rank and names itself, the field
// and what it got in a loom::Error.
#include "random.h"

#include <loom/data/transforms.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace loom::data {

uint64_t SampleContext::random(uint64_t stream) const {
  return detail::hash_words({seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index), stream});
}

double SampleContext::uniform(uint64_t stream) const {
  return static_cast<double>(random(stream) >> 11) * 0x1.0p-53;
}

int64_t SampleContext::uniform_int(uint64_t stream, int64_t n) const {
  if (n <= 0) throw Error("SampleContext::uniform_int: expected n > 0, got " + std::to_string(n));
  return static_cast<int64_t>(detail::bounded(random(stream), static_cast<uint64_t>(n)));
}

std::mt19937_64 SampleContext::generator(uint64_t stream) const { return std::mt19937_64(random(stream)); }

uint64_t stream_id(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return detail::mix64(h);
}

Transform compose(std::vector<Transform> transforms) {
  return [transforms = std::move(transforms)](Example& e, const SampleContext& ctx) {
    for (const auto& t : transforms) t(e, ctx);
  };
}

namespace {

// Calls fn(T{}) with the C++ element type of `dtype` (bool as uint8_t).
template <class Fn>
void visit_typed(HostDType dtype, Fn&& fn) {
  switch (dtype) {
    case HostDType::UInt8: fn(uint8_t{}); break;
    case HostDType::Int32: fn(int32_t{}); break;
    case HostDType::Int64: fn(int64_t{}); break;
    case HostDType::Float32: fn(float{}); break;
    case HostDType::Float64: fn(double{}); break;
    case HostDType::Bool: fn(uint8_t{}); break;
  }
}

template <class Fn>
void visit_numeric(const HostArray& a, Fn&& fn) {
  switch (a.dtype) {
    case HostDType::UInt8: fn(a.data<uint8_t>()); break;
    case HostDType::Int32: fn(a.data<int32_t>()); break;
    case HostDType::Int64: fn(a.data<int64_t>()); break;
    case HostDType::Float32: fn(a.data<float>()); break;
    case HostDType::Float64: fn(a.data<double>()); break;
    case HostDType::Bool: fn(a.bytes.data()); break;
  }
}

// `a` converted to `to`; floating-point results are multiplied by `scale`.
HostArray converted(const HostArray& a, HostDType to, double scale) {
  HostArray out(to, a.shape);
  const int64_t n = a.numel();
  auto fill = [&](auto* dst) {
    using T = std::remove_pointer_t<decltype(dst)>;
    visit_numeric(a, [&](const auto* src) {
      using S = std::remove_cv_t<std::remove_pointer_t<decltype(src)>>;
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_floating_point_v<T>) {
          dst[i] = static_cast<T>(src[i] * scale);
        } else {
          if constexpr (std::is_floating_point_v<S>) {
            // A float whose truncation T cannot hold (NaN, out of range) has no defined
            // conversion.
            using D = std::remove_reference_t<decltype(dst[0])>;  // T, as GCC 12 takes it here
            const double v = static_cast<double>(src[i]);
            constexpr double lo = static_cast<double>(std::numeric_limits<D>::lowest());
            constexpr double hi = static_cast<double>(std::numeric_limits<D>::max()) + 1.0;
            if (!(v < hi && (v >= lo || v > lo - 1.0)))
              throw Error("the value " + std::to_string(v) + " (element " + std::to_string(i) +
                          ") does not fit in " + host_dtype_name(to));
          }
          dst[i] = static_cast<T>(src[i]);
        }
      }
    });
  };
  switch (to) {
    case HostDType::UInt8: fill(out.data<uint8_t>()); break;
    case HostDType::Int32: fill(out.data<int32_t>()); break;
    case HostDType::Int64: fill(out.data<int64_t>()); break;
    case HostDType::Float32: fill(out.data<float>()); break;
    case HostDType::Float64: fill(out.data<double>()); break;
    case HostDType::Bool: {
      unsigned char* dst = out.bytes.data();
      visit_numeric(a, [&](const auto* src) {
        for (int64_t i = 0; i < n; ++i) dst[i] = src[i] != 0;
      });
      break;
    }
  }
  return out;
}

}  // namespace

Transform to_float(std::string field) {
  return [field = std::move(field)](Example& e, const SampleContext&) {
    HostArray& a = e.at(field);
    if (a.dtype == HostDType::Float32) return;
    a = converted(a, HostDType::Float32, a.dtype == HostDType::UInt8 ? 1.0 / 255.0 : 1.0);
  };
}

Transform cast(std::string field, HostDType dtype) {
  return [field = std::move(field), dtype](Example& e, const SampleContext&) {
    HostArray& a = e.at(field);
    if (a.dtype == dtype) return;
    try {
      a = converted(a, dtype, 1.0);
    } catch (const Error& err) {
      throw Error("cast: field '" + field + "' " + a.str() + ": " + err.what());
    }
  };
}

Transform normalize(std::vector<double> mean, std::vector<double> std, std::string field,
                    int64_t channel_dim) {
  if (mean.empty() || mean.size() != std.size())
    throw Error("normalize: expected mean and std of one equal, non-zero length, got " +
                std::to_string(mean.size()) + " and " + std::to_string(std.size()));
  for (double s : std)
    if (!(s > 0)) throw Error("normalize: expected positive std values, got " + std::to_string(s));
  return [mean = std::move(mean), std = std::move(std), field = std::move(field),
          channel_dim](Example& e, const SampleContext&) {
    HostArray& a = e.at(field);
    if (!is_floating(a.dtype))
      throw Error("normalize: field '" + field + "' is " + a.str() +
                  ", expected float32 or float64 (apply to_float first)");
    const auto rank = static_cast<int64_t>(a.shape.size());
    const int64_t dim = channel_dim < 0 ? channel_dim + rank : channel_dim;
    int64_t channels = 1, inner = 1, outer = 1;
    if (mean.size() > 1) {
      if (dim < 0 || dim >= rank)
        throw Error("normalize: channel dimension " + std::to_string(channel_dim) +
                    " out of range for field '" + field + "' " + a.str());
      channels = a.shape[static_cast<std::size_t>(dim)];
      if (channels != static_cast<int64_t>(mean.size()))
        throw Error("normalize: field '" + field + "' " + a.str() + " has " + std::to_string(channels) +
                    " channels, got mean/std for " + std::to_string(mean.size()));
      for (int64_t d = dim + 1; d < rank; ++d) inner *= a.shape[static_cast<std::size_t>(d)];
      for (int64_t d = 0; d < dim; ++d) outer *= a.shape[static_cast<std::size_t>(d)];
    } else {
      inner = a.numel();
    }
    auto apply = [&](auto* p) {
      using T = std::remove_pointer_t<decltype(p)>;
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t c = 0; c < channels; ++c) {
          const T m = static_cast<T>(mean[static_cast<std::size_t>(c)]);
          const T inv = static_cast<T>(1.0 / std[static_cast<std::size_t>(c)]);
          T* q = p + (o * channels + c) * inner;
          for (int64_t i = 0; i < inner; ++i) q[i] = (q[i] - m) * inv;
        }
    };
    if (a.dtype == HostDType::Float32) apply(a.data<float>());
    else apply(a.data<double>());
  };
}

Transform random_crop(std::array<int64_t, 2> size, int64_t padding, std::string field, double fill) {
  if (size[0] < 1 || size[1] < 1 || padding < 0)
    throw Error("random_crop: expected a positive size and padding >= 0, got [" +
                std::to_string(size[0]) + "," + std::to_string(size[1]) + "] and " +
                std::to_string(padding));
  const uint64_t stream = stream_id("random_crop:" + field);
  return [size, padding, field = std::move(field), fill, stream](Example& e, const SampleContext& ctx) {
    HostArray& a = e.at(field);
    if (a.shape.size() < 2)
      throw Error("random_crop: field '" + field + "' is " + a.str() + ", expected [..., H, W]");
    const std::size_t r = a.shape.size();
    const int64_t h = a.shape[r - 2], w = a.shape[r - 1];
    if (h == 0 || w == 0)
      throw Error("random_crop: field '" + field + "' " + a.str() + " has an empty image");
    const int64_t ph = h + 2 * padding, pw = w + 2 * padding;
    if (size[0] > ph || size[1] > pw)
      throw Error("random_crop: crop [" + std::to_string(size[0]) + "," + std::to_string(size[1]) +
                  "] is larger than field '" + field + "' " + a.str() + " padded by " +
                  std::to_string(padding));
    const int64_t top = ctx.uniform_int(stream, ph - size[0] + 1);
    const int64_t left = ctx.uniform_int(stream + 1, pw - size[1] + 1);
    // Offsets of the crop window in the unpadded image.
    const int64_t y0 = top - padding, x0 = left - padding;
    const int64_t planes = a.numel() / (h * w);
    Shape shape = a.shape;
    shape[r - 2] = size[0];
    shape[r - 1] = size[1];
    HostArray out(a.dtype, shape);
    const std::size_t es = a.element_size();
    // The fill value in this dtype, as bytes.
    unsigned char fill_bytes[8] = {};
    visit_typed(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_floating_point_v<T>) {
        // An integer image holds the fill exactly, or it is no fill for it.
        constexpr double lo = static_cast<double>(std::numeric_limits<T>::lowest());
        constexpr double hi = static_cast<double>(std::numeric_limits<T>::max()) + 1.0;
        const bool fits = a.dtype == HostDType::Bool ? (fill == 0 || fill == 1)
                                                     : fill >= lo && fill < hi && fill == std::trunc(fill);
        if (!fits)
          throw Error("random_crop: fill " + std::to_string(fill) + " is not a value of field '" + field + "' (" +
                      a.str() + ")");
      }
      const T v = static_cast<T>(fill);
      std::memcpy(fill_bytes, &v, sizeof v);
    });
    for (int64_t p = 0; p < planes; ++p) {
      const unsigned char* src = a.bytes.data() + static_cast<std::size_t>(p * h * w) * es;
      unsigned char* dst = out.bytes.data() + static_cast<std::size_t>(p * size[0] * size[1]) * es;
      for (int64_t y = 0; y < size[0]; ++y) {
        unsigned char* row = dst + static_cast<std::size_t>(y * size[1]) * es;
        const int64_t sy = y + y0;
        const int64_t xs = std::max<int64_t>(0, -x0), xe = std::min<int64_t>(size[1], w - x0);
        const bool inside = sy >= 0 && sy < h && xs < xe;
        for (int64_t x = 0; x < size[1]; ++x)
          if (!inside || x < xs || x >= xe)
            std::memcpy(row + static_cast<std::size_t>(x) * es, fill_bytes, es);
        if (inside)
          std::memcpy(row + static_cast<std::size_t>(xs) * es,
                      src + static_cast<std::size_t>(sy * w + xs + x0) * es,
                      static_cast<std::size_t>(xe - xs) * es);
      }
    }
    a = std::move(out);
  };
}

Transform random_horizontal_flip(double p, std::string field) {
  if (!(p >= 0 && p <= 1))
    throw Error("random_horizontal_flip: expected 0 <= p <= 1, got " + std::to_string(p));
  const uint64_t stream = stream_id("random_horizontal_flip:" + field);
  return [p, field = std::move(field), stream](Example& e, const SampleContext& ctx) {
    HostArray& a = e.at(field);
    if (a.shape.empty())
      throw Error("random_horizontal_flip: field '" + field + "' is " + a.str() + ", expected [..., W]");
    if (!(ctx.uniform(stream) < p)) return;
    const int64_t w = a.shape.back();
    const int64_t rows = w > 0 ? a.numel() / w : 0;
    visit_typed(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      auto* p = reinterpret_cast<T*>(a.bytes.data());
      for (int64_t r = 0; r < rows; ++r) std::reverse(p + r * w, p + (r + 1) * w);
    });
  };
}

}  // namespace loom::data
