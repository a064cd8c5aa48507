// Op attributes: one typed struct per kind of parameter an op carries, held by ir::Attr.
//
//   auto y = make_node(Op::Conv2d, {x, w}, Conv2dAttr{.stride = {2, 2}, .padding = {1, 1}});
//   const auto& c = y->attr().get<Conv2dAttr>();   // aborts if y's attribute is another kind
//   int64_t sh = c.stride[0];
//
// The op table (op.cpp) names the kind each op takes, and make_node / make_leaf abort on a
// mismatch, so every reader of an op's attribute can name its struct. Hashing, equality and
// printing (attr.cpp) take every field of every struct: they bind each struct with a
// structured binding, so a field added to a struct and not to them fails to compile.
#pragma once

#include <loom/dtype.h>

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace loom::ir {

using Pair = std::array<int64_t, 2>;  // (height, width)

// Ops without parameters: DeviceData, unary and binary ops, Where.
struct NoAttr {
  bool operator==(const NoAttr&) const = default;
};

// Constant: the value filled over the node's shape.
struct ScalarAttr {
  double value = 0;
  bool operator==(const ScalarAttr&) const = default;
};

// Cast: the result's dtype.
struct CastAttr {
  DType to = DType::Float32;
  bool operator==(const CastAttr&) const = default;
};

// RandUniform, RandNormal: the result's dtype and shape. The seed is an operand (a 0-d int64
// tensor), not an attribute, so a new seed never compiles a new program.
struct RandomAttr {
  Shape shape;
  DType dtype = DType::Float32;
  bool operator==(const RandomAttr&) const = default;
};

// One dimension: Iota (the counted one), ArgMax (reduced, kept with size 1), Concat, Gather,
// IndexSelect, ScatterAdd.
struct DimAttr {
  int64_t dim = 0;
  bool operator==(const DimAttr&) const = default;
};

// Sum, Mean, Max: sorted unique reduced axes. The IR always keeps them with size 1 (keepdim);
// the API drops them with a Reshape.
struct AxesAttr {
  std::vector<int64_t> axes;
  bool operator==(const AxesAttr&) const = default;
};

// Reshape, Expand: the result's shape.
struct ShapeAttr {
  Shape shape;
  bool operator==(const ShapeAttr&) const = default;
};

// Permute: out.shape[i] = in.shape[perm[i]].
struct PermuteAttr {
  std::vector<int64_t> perm;
  bool operator==(const PermuteAttr&) const = default;
};

// Slice: per dimension d, out[.., i, ..] = in[.., starts[d] + i*steps[d], ..] for i < sizes[d]
// (steps > 0; sizes is the result's shape).
struct SliceAttr {
  std::vector<int64_t> starts, steps, sizes;
  bool operator==(const SliceAttr&) const = default;
};

// Pad: `lo[d]` and `hi[d]` elements of `value` before and after dimension d (>= 0).
struct PadAttr {
  std::vector<int64_t> lo, hi;
  double value = 0;
  bool operator==(const PadAttr&) const = default;
};

// Matmul: read an operand as the transpose of its last two dimensions. Lowering leaves both
// false; compiler/fold_transpose.cpp sets them.
struct MatmulAttr {
  bool transpose_a = false, transpose_b = false;
  bool operator==(const MatmulAttr&) const = default;
};

// Conv2d, input [N,C,H,W], weight [O,C/groups,kh,kw].
// channels_last is set by the compiler only (compiler/channels_last.h): the activations, the
// input, the result and their gradients, are then stored [N,H,W,C]; the weight keeps
// [O,C/groups,kh,kw].
struct Conv2dAttr {
  Pair stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
  bool channels_last = false;
  bool operator==(const Conv2dAttr&) const = default;
};

// Conv2dGradInput and Conv2dGradWeight: the forward conv's attribute and the result's spatial
// size, which the operands do not determine: (H, W) of the input, or (kh, kw) of the weight.
struct Conv2dGradAttr {
  Conv2dAttr conv;
  Pair size{0, 0};
  bool operator==(const Conv2dGradAttr&) const = default;
};

// MaxPool2d, AvgPool2d, MaxPool2dGrad.
struct Pool2dAttr {
  Pair kernel{1, 1}, stride{1, 1}, padding{0, 0};
  bool count_include_pad = false;  // AvgPool2d only: padding counts in the divisor
  bool operator==(const Pool2dAttr&) const = default;
};

// AvgPool2dGrad: the forward pooling's attribute and the input's spatial size (H, W).
struct Pool2dGradAttr {
  Pool2dAttr pool;
  Pair size{0, 0};
  bool operator==(const Pool2dGradAttr&) const = default;
};

// OneHot: the number of classes, the size of the result's new last dimension.
struct OneHotAttr {
  int64_t num_classes = 0;
  bool operator==(const OneHotAttr&) const = default;
};

// The kinds, in the order of Attr's alternatives.
enum class AttrKind : uint8_t {
  None, Scalar, Cast, Random, Dim, Axes, Shape, Permute, Slice, Pad, Matmul, Conv2d, Conv2dGrad,
  Pool2d, Pool2dGrad, OneHot, Count_
};

const char* attr_kind_name(AttrKind kind);

class Attr {
 public:
  using Variant = std::variant<NoAttr, ScalarAttr, CastAttr, RandomAttr, DimAttr, AxesAttr,
                               ShapeAttr, PermuteAttr, SliceAttr, PadAttr, MatmulAttr, Conv2dAttr,
                               Conv2dGradAttr, Pool2dAttr, Pool2dGradAttr, OneHotAttr>;
  static_assert(std::variant_size_v<Variant> == static_cast<std::size_t>(AttrKind::Count_),
                "one AttrKind per alternative");

  Attr() = default;
  template <class T>
    requires(!std::is_same_v<std::remove_cvref_t<T>, Attr>)
  Attr(T&& value) : value_(std::forward<T>(value)) {}  // NOLINT: implicit from each struct

  AttrKind kind() const { return static_cast<AttrKind>(value_.index()); }
  template <class T>
  bool is() const { return std::holds_alternative<T>(value_); }

  // The struct of kind T; aborts (in Release too) when this attribute is another kind.
  template <class T>
  const T& get() const {
    if (const T* p = std::get_if<T>(&value_)) return *p;
    wrong_kind(kind_of<T>());
  }
  template <class T>
  T& get() {
    if (T* p = std::get_if<T>(&value_)) return *p;
    wrong_kind(kind_of<T>());
  }

  const Variant& variant() const { return value_; }
  bool operator==(const Attr&) const = default;

  template <class T>
  static constexpr AttrKind kind_of() {
    return static_cast<AttrKind>(index_in<T>(static_cast<Variant*>(nullptr)));
  }

 private:
  template <class T, class... Ts>
  static constexpr std::size_t index_in(std::variant<Ts...>*) {
    constexpr bool match[] = {std::is_same_v<T, Ts>...};
    for (std::size_t i = 0; i < sizeof...(Ts); ++i)
      if (match[i]) return i;
    return sizeof...(Ts);
  }
  [[noreturn]] void wrong_kind(AttrKind wanted) const;
  Variant value_;
};

uint64_t hash_attr(const Attr& attr);
// "stride=1,1 padding=0,0 ..."; empty for NoAttr.
std::string attr_str(const Attr& attr);

}  // namespace loom::ir
