#include "ir/attr.h"

#include "ir/node.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace loom::ir {
namespace {

// ---- hashing: each field mixed in declaration order ----

uint64_t mix(uint64_t h, int64_t v) { return hash_combine(h, static_cast<uint64_t>(v)); }
uint64_t mix(uint64_t h, bool v) { return hash_combine(h, v ? 1 : 0); }
uint64_t mix(uint64_t h, DType v) { return hash_combine(h, static_cast<uint64_t>(v)); }
uint64_t mix(uint64_t h, double v) {
  uint64_t bits = 0;
  static_assert(sizeof(bits) == sizeof(v));
  std::memcpy(&bits, &v, sizeof(bits));
  return hash_combine(h, bits);
}
uint64_t mix(uint64_t h, const Pair& v) { return mix(mix(h, v[0]), v[1]); }
uint64_t mix(uint64_t h, const std::vector<int64_t>& v) {
  h = hash_combine(h, v.size());  // so {1},{2,3} and {1,2},{3} differ
  for (auto x : v) h = mix(h, x);
  return h;
}

// One overload per struct. The structured binding names every field: adding a field to a
// struct without adding it here fails to compile.
uint64_t mix(uint64_t h, const NoAttr&) { return h; }
uint64_t mix(uint64_t h, const ScalarAttr& a) { const auto& [value] = a; return mix(h, value); }
uint64_t mix(uint64_t h, const CastAttr& a) { const auto& [to] = a; return mix(h, to); }
uint64_t mix(uint64_t h, const RandomAttr& a) {
  const auto& [shape, dtype] = a;
  return mix(mix(h, shape), dtype);
}
uint64_t mix(uint64_t h, const DimAttr& a) { const auto& [dim] = a; return mix(h, dim); }
uint64_t mix(uint64_t h, const AxesAttr& a) { const auto& [axes] = a; return mix(h, axes); }
uint64_t mix(uint64_t h, const ShapeAttr& a) { const auto& [shape] = a; return mix(h, shape); }
uint64_t mix(uint64_t h, const PermuteAttr& a) { const auto& [perm] = a; return mix(h, perm); }
uint64_t mix(uint64_t h, const SliceAttr& a) {
  const auto& [starts, steps, sizes] = a;
  return mix(mix(mix(h, starts), steps), sizes);
}
uint64_t mix(uint64_t h, const PadAttr& a) {
  const auto& [lo, hi, value] = a;
  return mix(mix(mix(h, lo), hi), value);
}
uint64_t mix(uint64_t h, const MatmulAttr& a) {
  const auto& [transpose_a, transpose_b] = a;
  return mix(mix(h, transpose_a), transpose_b);
}
uint64_t mix(uint64_t h, const Conv2dAttr& a) {
  const auto& [stride, padding, dilation, groups, channels_last] = a;
  return mix(mix(mix(mix(mix(h, stride), padding), dilation), groups), channels_last);
}
uint64_t mix(uint64_t h, const Conv2dGradAttr& a) {
  const auto& [conv, size] = a;
  return mix(mix(h, conv), size);
}
uint64_t mix(uint64_t h, const Pool2dAttr& a) {
  const auto& [kernel, stride, padding, count_include_pad] = a;
  return mix(mix(mix(mix(h, kernel), stride), padding), count_include_pad);
}
uint64_t mix(uint64_t h, const Pool2dGradAttr& a) {
  const auto& [pool, size] = a;
  return mix(mix(h, pool), size);
}
uint64_t mix(uint64_t h, const OneHotAttr& a) { const auto& [num_classes] = a; return mix(h, num_classes); }

// ---- printing: name=value pairs, in declaration order ----

void put(std::ostream& os, int64_t v) { os << v; }
void put(std::ostream& os, bool v) { os << (v ? 1 : 0); }
void put(std::ostream& os, DType v) { os << dtype_name(v); }
void put(std::ostream& os, double v) { os << v; }
void put(std::ostream& os, const Pair& v) { os << v[0] << ',' << v[1]; }
void put(std::ostream& os, const std::vector<int64_t>& v) {
  os << '[';
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  os << ']';
}

struct Printer {
  std::ostream& os;
  const char* sep = "";
  template <class T>
  Printer& operator()(const char* name, const T& v) {
    os << sep << name << '=';
    put(os, v);
    sep = " ";
    return *this;
  }
};

void print(Printer&, const NoAttr&) {}
void print(Printer& p, const ScalarAttr& a) { const auto& [value] = a; p("value", value); }
void print(Printer& p, const CastAttr& a) { const auto& [to] = a; p("to", to); }
void print(Printer& p, const RandomAttr& a) {
  const auto& [shape, dtype] = a;
  p("shape", shape)("dtype", dtype);
}
void print(Printer& p, const DimAttr& a) { const auto& [dim] = a; p("dim", dim); }
void print(Printer& p, const AxesAttr& a) { const auto& [axes] = a; p("axes", axes); }
void print(Printer& p, const ShapeAttr& a) { const auto& [shape] = a; p("shape", shape); }
void print(Printer& p, const PermuteAttr& a) { const auto& [perm] = a; p("perm", perm); }
void print(Printer& p, const SliceAttr& a) {
  const auto& [starts, steps, sizes] = a;
  p("starts", starts)("steps", steps)("sizes", sizes);
}
void print(Printer& p, const PadAttr& a) {
  const auto& [lo, hi, value] = a;
  p("lo", lo)("hi", hi)("value", value);
}
void print(Printer& p, const MatmulAttr& a) {
  const auto& [transpose_a, transpose_b] = a;
  p("transpose_a", transpose_a)("transpose_b", transpose_b);
}
void print(Printer& p, const Conv2dAttr& a) {
  const auto& [stride, padding, dilation, groups, channels_last] = a;
  p("stride", stride)("padding", padding)("dilation", dilation)("groups", groups);
  if (channels_last) p("channels_last", channels_last);
}
void print(Printer& p, const Conv2dGradAttr& a) {
  const auto& [conv, size] = a;
  print(p, conv);
  p("size", size);
}
void print(Printer& p, const Pool2dAttr& a) {
  const auto& [kernel, stride, padding, count_include_pad] = a;
  p("kernel", kernel)("stride", stride)("padding", padding)("count_include_pad", count_include_pad);
}
void print(Printer& p, const Pool2dGradAttr& a) {
  const auto& [pool, size] = a;
  print(p, pool);
  p("size", size);
}
void print(Printer& p, const OneHotAttr& a) { const auto& [num_classes] = a; p("num_classes", num_classes); }

}  // namespace

const char* attr_kind_name(AttrKind kind) {
  switch (kind) {
    case AttrKind::None: return "none";
    case AttrKind::Scalar: return "ScalarAttr";
    case AttrKind::Cast: return "CastAttr";
    case AttrKind::Random: return "RandomAttr";
    case AttrKind::Dim: return "DimAttr";
    case AttrKind::Axes: return "AxesAttr";
    case AttrKind::Shape: return "ShapeAttr";
    case AttrKind::Permute: return "PermuteAttr";
    case AttrKind::Slice: return "SliceAttr";
    case AttrKind::Pad: return "PadAttr";
    case AttrKind::Matmul: return "MatmulAttr";
    case AttrKind::Conv2d: return "Conv2dAttr";
    case AttrKind::Conv2dGrad: return "Conv2dGradAttr";
    case AttrKind::Pool2d: return "Pool2dAttr";
    case AttrKind::Pool2dGrad: return "Pool2dGradAttr";
    case AttrKind::OneHot: return "OneHotAttr";
    case AttrKind::Count_: break;
  }
  return "?";
}

void Attr::wrong_kind(AttrKind wanted) const {
  std::fprintf(stderr, "loom: internal error: read an attribute as %s, but it is %s\n",
               attr_kind_name(wanted), attr_kind_name(kind()));
  std::abort();
}

uint64_t hash_attr(const Attr& attr) {
  const uint64_t h = hash_combine(0x51ED, static_cast<uint64_t>(attr.kind()));
  return std::visit([h](const auto& a) { return mix(h, a); }, attr.variant());
}

std::string attr_str(const Attr& attr) {
  std::ostringstream os;
  Printer p{os};
  std::visit([&p](const auto& a) { print(p, a); }, attr.variant());
  return os.str();
}

}  // namespace loom::ir
