// Losses, attention and rotary position embeddings as functions of tensors, with the
// semantics of torch.nn.functional (and Hugging Face's Llama for the rotary helpers).
//
//   namespace F = loom::nn::functional;
//   auto loss = F::cross_entropy(logits, targets, /*label_smoothing=*/0.1);
//   auto acc = F::accuracy(logits, targets);                 // 0-d, pending
//
//   auto [cos, sin] = F::rotary_cos_sin(T, head_dim, 10000.0, q.dtype());
//   q = F::apply_rotary_pos_emb(q, cos, sin);
//   k = F::apply_rotary_pos_emb(k, cos, sin);
//   auto out = F::scaled_dot_product_attention(q, k, v, /*is_causal=*/true);
//
// Everything is built from loom ops, so autograd differentiates it and nothing reads device
// values: masks and rotary tables come from loom::iota, never from host data.
#pragma once

#include <loom/tensor.h>

#include <cstdint>
#include <optional>
#include <utility>

namespace loom::nn::functional {

enum class Reduction { None, Mean, Sum };

// torch.nn.functional.cross_entropy for logits [N, C] and int64 class targets [N]:
//   loss_i = (1 - ε)·(-log p_i[y_i]) + (ε / C)·Σ_c (-log p_i[c]),   ε = label_smoothing,
// loss_i = 0 where y_i == ignore_index; Mean divides the sum by the number of targets that
// are not ignored (NaN when all are, with a zero gradient, as in PyTorch); None returns [N].
// Targets outside [0, C) other than ignore_index are not checked (that needs a device read).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing = 0,
                     int64_t ignore_index = -100, Reduction reduction = Reduction::Mean);

// torch.nn.functional.mse_loss: (input - target)², reduced; shapes must match.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

// Fraction of rows of logits [N, C] whose argmax equals target [N] (int64): a 0-d tensor of
// the logits' dtype.
Tensor accuracy(const Tensor& logits, const Tensor& target);

// [B, Hkv, S, D] -> [B, Hkv·n_rep, S, D], each kv head repeated n_rep times in place
// (Hugging Face's repeat_kv: query head h reads kv head h / n_rep).
Tensor repeat_kv(const Tensor& x, int64_t n_rep);

// softmax(q·kᵀ·scale [+ causal mask])·v for q [B, H, T, D] and k, v [B, Hkv, S, D] with
// H % Hkv == 0 (grouped-query attention repeats the kv heads). scale defaults to 1/sqrt(D).
// The causal mask keeps key j for query i when j <= i (PyTorch's is_causal: top-left aligned).
// The softmax runs in q's dtype.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool is_causal = false, std::optional<double> scale = std::nullopt);

// Rotary tables cos, sin of shape [seq_len, head_dim] (Llama / Hugging Face convention):
//   inv_freq[i] = 1 / theta^(2i / head_dim),  i < head_dim/2
//   angle[t, i] = angle[t, i + head_dim/2] = (start_pos + t) · inv_freq[i]
// Built from loom::iota, so a training step transfers nothing for them. head_dim must be even.
std::pair<Tensor, Tensor> rotary_cos_sin(int64_t seq_len, int64_t head_dim, double theta = 10000.0,
                                         DType dtype = DType::Float32, int64_t start_pos = 0,
                                         Device device = {});
// Concatenates (-x2, x1) where x1, x2 are the halves of the last dim.
Tensor rotate_half(const Tensor& x);
// x·cos + rotate_half(x)·sin for x [..., T, D] and tables [T, D] from rotary_cos_sin.
Tensor apply_rotary_pos_emb(const Tensor& x, const Tensor& cos, const Tensor& sin);

}  // namespace loom::nn::functional
