#include <loom/nn/functional.h>

#include <loom/error.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>

namespace loom::nn::functional {
namespace {

void check_defined(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const auto* t : ts)
    if (!t->defined()) throw Error(std::string(op) + ": expected defined tensors, got an empty handle");
}

void check_class_targets(const char* op, const Tensor& logits, const Tensor& target) {
  if (logits.dim() != 2 || !is_floating(logits.dtype()))
    throw Error(std::string(op) + ": expected floating-point logits [N, C], got " +
                dtype_name(logits.dtype()) + shape_str(logits.shape()));
  if (target.dtype() != DType::Int64 || target.shape() != Shape{logits.size(0)})
    throw Error(std::string(op) + ": expected int64 targets [" + std::to_string(logits.size(0)) +
                "] for logits " + shape_str(logits.shape()) + ", got " + dtype_name(target.dtype()) +
                shape_str(target.shape()));
}

Tensor reduce(const Tensor& x, Reduction reduction) {
  switch (reduction) {
    case Reduction::None: return x;
    case Reduction::Mean: return x.mean();
    case Reduction::Sum: return x.sum();
  }
  throw Error("reduce: unknown reduction");
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing,
                     int64_t ignore_index, Reduction reduction) {
  check_defined("cross_entropy", {&logits, &target});
  check_class_targets("cross_entropy", logits, target);
  if (!(label_smoothing >= 0 && label_smoothing <= 1))
    throw Error("cross_entropy: expected label_smoothing in [0, 1], got " + std::to_string(label_smoothing));
  const int64_t n = logits.size(0), c = logits.size(1);
  const DType dt = logits.dtype();
  auto logp = log_softmax(logits, 1);
  // Ignored rows gather class 0 (always valid) and are then zeroed by the mask.
  // The index as int64 data: through a double, indices past 2^53 would round.
  auto valid = ne(target, from_vector<int64_t>({ignore_index}, {}, target.device()));
  auto safe_target = where(valid, target, zeros({}, DType::Int64, target.device()));
  auto nll = -reshape(gather(logp, 1, reshape(safe_target, {n, 1})), {n});
  Tensor loss = nll;
  if (label_smoothing > 0) {
    auto smooth = -logp.sum({1});
    loss = nll * (1 - label_smoothing) + smooth * (label_smoothing / static_cast<double>(c));
  }
  // A select, not a product with the mask: an ignored row's loss may be Inf (a -Inf logit in
  // class 0 or in any class with smoothing), and Inf * 0 would make the sum NaN.
  const Device dev = logits.device();
  loss = where(valid, loss, zeros({}, dt, dev));
  switch (reduction) {
    case Reduction::None: return loss;
    case Reduction::Sum: return loss.sum();
    // Every target ignored: 0 / 0 = NaN, as in PyTorch, and a zero gradient, as the select
    // above passes none of the division's Inf back (a product with the mask passed Inf * 0 =
    // NaN to every gradient: one all-padding batch wrecked the parameters).
    case Reduction::Mean: return loss.sum() / valid.to(dt).sum();
  }
  throw Error("cross_entropy: unknown reduction");
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_defined("mse_loss", {&input, &target});
  if (input.shape() != target.shape() || input.dtype() != target.dtype())
    throw Error("mse_loss: expected input and target of one dtype and shape, got " +
                std::string(dtype_name(input.dtype())) + shape_str(input.shape()) + " and " +
                dtype_name(target.dtype()) + shape_str(target.shape()));
  auto d = input - target;
  return reduce(d * d, reduction);
}

Tensor accuracy(const Tensor& logits, const Tensor& target) {
  check_defined("accuracy", {&logits, &target});
  check_class_targets("accuracy", logits, target);
  return eq(argmax(logits, 1), target).to(logits.dtype()).mean();
}

Tensor repeat_kv(const Tensor& x, int64_t n_rep) {
  check_defined("repeat_kv", {&x});
  if (x.dim() != 4) throw Error("repeat_kv: expected a 4-D tensor [B,Hkv,S,D], got " + shape_str(x.shape()));
  if (n_rep <= 0) throw Error("repeat_kv: expected n_rep > 0, got " + std::to_string(n_rep));
  if (n_rep == 1) return x;
  const auto& s = x.shape();
  auto wide = expand(unsqueeze(x, 2), {s[0], s[1], n_rep, s[2], s[3]});
  return reshape(wide, {s[0], s[1] * n_rep, s[2], s[3]});
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                                    std::optional<double> scale) {
  check_defined("scaled_dot_product_attention", {&q, &k, &v});
  auto shapes = [&] {
    return shape_str(q.shape()) + ", " + shape_str(k.shape()) + ", " + shape_str(v.shape());
  };
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    throw Error("scaled_dot_product_attention: expected 4-D q [B,H,T,D], k and v [B,Hkv,S,D], got " + shapes());
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype() || !is_floating(q.dtype()))
    throw Error(std::string("scaled_dot_product_attention: expected floating q, k, v of one dtype, got ") +
                dtype_name(q.dtype()) + ", " + dtype_name(k.dtype()) + ", " + dtype_name(v.dtype()));
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t hkv = k.size(1), s = k.size(2);
  if (k.size(0) != b || v.size(0) != b || v.size(1) != hkv || v.size(2) != s || k.size(3) != d ||
      h % hkv != 0)
    throw Error("scaled_dot_product_attention: expected q [B,H,T,D], k [B,Hkv,S,D], v [B,Hkv,S,Dv] "
                "with H divisible by Hkv, got " + shapes());
  auto kk = repeat_kv(k, h / hkv);
  auto vv = repeat_kv(v, h / hkv);
  const double sc = scale ? *scale : 1 / std::sqrt(static_cast<double>(d));
  auto scores = matmul(q, transpose(kk, -1, -2)) * sc;  // [B,H,T,S]
  if (is_causal) {
    auto keep = ge(iota({t, s}, 0, DType::Int64, q.device()), iota({t, s}, 1, DType::Int64, q.device()));
    scores = where(keep, scores,
                   scalar_tensor(-std::numeric_limits<double>::infinity(), q.dtype(), q.device()));
  }
  return matmul(softmax(scores, -1), vv);
}

std::pair<Tensor, Tensor> rotary_cos_sin(int64_t seq_len, int64_t head_dim, double theta, DType dtype,
                                         int64_t start_pos, Device device) {
  if (seq_len <= 0 || head_dim <= 0 || head_dim % 2 != 0)
    throw Error("rotary_cos_sin: expected seq_len > 0 and an even head_dim > 0, got seq_len " +
                std::to_string(seq_len) + ", head_dim " + std::to_string(head_dim));
  if (!is_floating(dtype))
    throw Error(std::string("rotary_cos_sin: expected a floating-point dtype, got ") + dtype_name(dtype));
  if (!(theta > 0)) throw Error("rotary_cos_sin: expected theta > 0, got " + std::to_string(theta));
  const int64_t half = head_dim / 2;
  // The angles in float32 (float64 for float64 tables), the tables rounded to `dtype` at the
  // end, as HF computes them: a bfloat16 position or angle would be off by up to half a unit
  // in its 8th bit (positions from 257 on, angles of about 0.5 radian at position 200).
  const DType angles = dtype == DType::Float64 ? DType::Float64 : DType::Float32;
  // inv_freq = 1 / theta^((2i) / head_dim), as HF computes it.
  auto exponent = iota({1, half}, 1, angles, device) * 2.0 / static_cast<double>(head_dim);
  auto inv_freq = 1.0 / pow(scalar_tensor(theta, angles, device), exponent);  // [1, half]
  auto pos = iota({seq_len, 1}, 0, angles, device);
  if (start_pos != 0) pos = pos + static_cast<double>(start_pos);
  auto freqs = pos * inv_freq;  // [T, half]
  auto angle = concat({freqs, freqs}, 1);
  auto c = cos(angle), s = sin(angle);
  if (dtype == angles) return {c, s};
  return {c.to(dtype), s.to(dtype)};
}

Tensor rotate_half(const Tensor& x) {
  check_defined("rotate_half", {&x});
  if (x.dim() == 0 || x.size(-1) % 2 != 0)
    throw Error("rotate_half: expected an even last dimension, got " + shape_str(x.shape()));
  const int64_t half = x.size(-1) / 2;
  return concat({-slice(x, -1, half, 2 * half), slice(x, -1, 0, half)}, -1);
}

Tensor apply_rotary_pos_emb(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  check_defined("apply_rotary_pos_emb", {&x, &cos, &sin});
  if (x.dim() < 2 || cos.shape() != Shape{x.size(-2), x.size(-1)} || sin.shape() != cos.shape())
    throw Error("apply_rotary_pos_emb: expected x [..., T, D] with cos and sin [T, D], got " +
                shape_str(x.shape()) + ", " + shape_str(cos.shape()) + ", " + shape_str(sin.shape()));
  return x * cos + rotate_half(x) * sin;
}

}  // namespace loom::nn::functional
