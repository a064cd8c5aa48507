// A Llama-style decoder-only transformer with Hugging Face LlamaForCausalLM's module layout.
//
//   loom::models::DecoderConfig cfg{.vocab_size = 256, .hidden_size = 64, .num_layers = 2,
//                                   .num_heads = 4, .num_kv_heads = 2,
//                                   .intermediate_size = 172, .max_seq_len = 128};
//   auto lm = std::make_shared<loom::models::Decoder>(cfg);
//   auto logits = lm->forward(tokens);                        // [B, T] int64 -> [B, T, vocab]
//   auto loss = loom::nn::functional::cross_entropy(
//       logits.reshape({-1, cfg.vocab_size}), targets.reshape({-1}));
//
// state_dict() keys equal the HF ones:
//   model.embed_tokens.weight
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight       (no biases)
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight          (SwiGLU)
//   model.layers.{i}.input_layernorm.weight, model.layers.{i}.post_attention_layernorm.weight
//   model.norm.weight, lm_head.weight                        (lm_head not tied)
//
// Each layer: h = x + o_proj(attention(rope(q), rope(k), v, causal)) on input_layernorm(x),
// out = h + down_proj(silu(gate_proj(n)) · up_proj(n)) with n = post_attention_layernorm(h).
// Grouped-query attention: num_kv_heads divides num_heads and each kv head serves
// num_heads / num_kv_heads query heads. Rotary tables are built in the graph from iota.
//
// Initialisation follows HF's LlamaPreTrainedModel._init_weights: every Linear and the
// embedding N(0, initializer_range²), RMSNorm weights 1.
#pragma once

#include <loom/nn/layers.h>

#include <memory>

namespace loom::models {

struct DecoderConfig {
  int64_t vocab_size = 32000;
  int64_t hidden_size = 512;
  int64_t num_layers = 8;
  int64_t num_heads = 8;
  int64_t num_kv_heads = 8;
  int64_t intermediate_size = 1376;
  int64_t max_seq_len = 1024;
  double rms_eps = 1e-6;
  double rope_theta = 10000;
  double initializer_range = 0.02;

  // Throws loom::Error for non-positive sizes, hidden_size not divisible by num_heads,
  // num_heads not divisible by num_kv_heads, or an odd head dimension.
  void validate() const;
  int64_t head_dim() const { return hidden_size / num_heads; }
};

// HF LlamaAttention (q/k/v/o projections, rotary embeddings, causal GQA softmax attention).
class DecoderAttention : public nn::Module {
 public:
  explicit DecoderAttention(const DecoderConfig& config);
  // [B, T, hidden] -> [B, T, hidden]
  Tensor forward(const Tensor& x) override;

  DecoderConfig config;
  std::shared_ptr<nn::Linear> q_proj, k_proj, v_proj, o_proj;
};

// HF LlamaMLP: down_proj(silu(gate_proj(x)) · up_proj(x)).
class DecoderMLP : public nn::Module {
 public:
  explicit DecoderMLP(const DecoderConfig& config);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<nn::Linear> gate_proj, up_proj, down_proj;
};

// HF LlamaDecoderLayer (pre-norm residual block).
class DecoderLayer : public nn::Module {
 public:
  explicit DecoderLayer(const DecoderConfig& config);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<DecoderAttention> self_attn;
  std::shared_ptr<DecoderMLP> mlp;
  std::shared_ptr<nn::RMSNorm> input_layernorm, post_attention_layernorm;
};

// HF LlamaModel: tokens [B, T] -> final hidden states [B, T, hidden] (after `norm`).
class DecoderModel : public nn::Module {
 public:
  explicit DecoderModel(const DecoderConfig& config);
  Tensor forward(const Tensor& tokens) override;

  DecoderConfig config;
  std::shared_ptr<nn::Embedding> embed_tokens;
  std::shared_ptr<nn::Sequential> layers;  // of DecoderLayer, named "0", "1", ...
  std::shared_ptr<nn::RMSNorm> norm;
};

// HF LlamaForCausalLM: tokens [B, T] (int64) -> logits [B, T, vocab_size].
class Decoder : public nn::Module {
 public:
  // Validates the config (DecoderConfig::validate).
  explicit Decoder(const DecoderConfig& config);
  // Throws loom::Error unless tokens is int64 [B, T] with T <= max_seq_len.
  Tensor forward(const Tensor& tokens) override;

  DecoderConfig config;
  std::shared_ptr<DecoderModel> model;
  std::shared_ptr<nn::Linear> lm_head;
};

}  // namespace loom::models
