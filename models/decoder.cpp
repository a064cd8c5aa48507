#include <loom/models/decoder.h>

#include <loom/error.h>
#include <loom/nn/functional.h>
#include <loom/nn/init.h>

#include <string>

namespace loom::models {
namespace {

namespace F = nn::functional;

std::shared_ptr<nn::Linear> linear(int64_t in, int64_t out) {
  return std::make_shared<nn::Linear>(in, out, /*bias=*/false);
}

void check_positive(const char* what, int64_t v) {
  if (v <= 0) throw Error(std::string("DecoderConfig: expected ") + what + " > 0, got " + std::to_string(v));
}

}  // namespace

void DecoderConfig::validate() const {
  check_positive("vocab_size", vocab_size);
  check_positive("hidden_size", hidden_size);
  check_positive("num_layers", num_layers);
  check_positive("num_heads", num_heads);
  check_positive("num_kv_heads", num_kv_heads);
  check_positive("intermediate_size", intermediate_size);
  check_positive("max_seq_len", max_seq_len);
  if (hidden_size % num_heads != 0)
    throw Error("DecoderConfig: expected hidden_size divisible by num_heads, got hidden_size " +
                std::to_string(hidden_size) + " and num_heads " + std::to_string(num_heads));
  if (num_heads % num_kv_heads != 0)
    throw Error("DecoderConfig: expected num_heads divisible by num_kv_heads, got num_heads " +
                std::to_string(num_heads) + " and num_kv_heads " + std::to_string(num_kv_heads));
  if (head_dim() % 2 != 0)
    throw Error("DecoderConfig: expected an even head dimension (hidden_size / num_heads) for rotary "
                "embeddings, got " + std::to_string(head_dim()));
  if (!(rms_eps >= 0)) throw Error("DecoderConfig: expected rms_eps >= 0, got " + std::to_string(rms_eps));
  if (!(rope_theta > 0)) throw Error("DecoderConfig: expected rope_theta > 0, got " + std::to_string(rope_theta));
  if (!(initializer_range >= 0))
    throw Error("DecoderConfig: expected initializer_range >= 0, got " + std::to_string(initializer_range));
}

DecoderAttention::DecoderAttention(const DecoderConfig& c) : config(c) {
  c.validate();
  const int64_t hd = c.head_dim();
  q_proj = register_module("q_proj", linear(c.hidden_size, c.num_heads * hd));
  k_proj = register_module("k_proj", linear(c.hidden_size, c.num_kv_heads * hd));
  v_proj = register_module("v_proj", linear(c.hidden_size, c.num_kv_heads * hd));
  o_proj = register_module("o_proj", linear(c.num_heads * hd, c.hidden_size));
}

Tensor DecoderAttention::forward(const Tensor& x) {
  if (!x.defined() || x.dim() != 3 || x.size(2) != config.hidden_size)
    throw Error("DecoderAttention: expected an input [B,T," + std::to_string(config.hidden_size) + "], got " +
                (x.defined() ? shape_str(x.shape()) : std::string("an empty handle")));
  const int64_t b = x.size(0), t = x.size(1), hd = config.head_dim();
  auto heads = [&](const Tensor& y, int64_t n) { return y.reshape({b, t, n, hd}).transpose(1, 2); };
  auto q = heads(q_proj->forward(x), config.num_heads);
  auto k = heads(k_proj->forward(x), config.num_kv_heads);
  auto v = heads(v_proj->forward(x), config.num_kv_heads);
  auto [cos, sin] = F::rotary_cos_sin(t, hd, config.rope_theta, x.dtype(), 0, x.device());
  q = F::apply_rotary_pos_emb(q, cos, sin);
  k = F::apply_rotary_pos_emb(k, cos, sin);
  auto o = F::scaled_dot_product_attention(q, k, v, /*is_causal=*/true);  // [B,H,T,hd]
  return o_proj->forward(o.transpose(1, 2).reshape({b, t, config.num_heads * hd}));
}

DecoderMLP::DecoderMLP(const DecoderConfig& c) {
  gate_proj = register_module("gate_proj", linear(c.hidden_size, c.intermediate_size));
  up_proj = register_module("up_proj", linear(c.hidden_size, c.intermediate_size));
  down_proj = register_module("down_proj", linear(c.intermediate_size, c.hidden_size));
}

Tensor DecoderMLP::forward(const Tensor& x) {
  return down_proj->forward(silu(gate_proj->forward(x)) * up_proj->forward(x));
}

DecoderLayer::DecoderLayer(const DecoderConfig& c) {
  self_attn = register_module("self_attn", std::make_shared<DecoderAttention>(c));
  mlp = register_module("mlp", std::make_shared<DecoderMLP>(c));
  input_layernorm = register_module("input_layernorm", std::make_shared<nn::RMSNorm>(c.hidden_size, c.rms_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", std::make_shared<nn::RMSNorm>(c.hidden_size, c.rms_eps));
}

Tensor DecoderLayer::forward(const Tensor& x) {
  auto h = x + self_attn->forward(input_layernorm->forward(x));
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

DecoderModel::DecoderModel(const DecoderConfig& c) : config(c) {
  c.validate();
  embed_tokens = register_module("embed_tokens", std::make_shared<nn::Embedding>(c.vocab_size, c.hidden_size));
  layers = register_module("layers", std::make_shared<nn::Sequential>());
  for (int64_t i = 0; i < c.num_layers; ++i) layers->push_back(std::make_shared<DecoderLayer>(c));
  norm = register_module("norm", std::make_shared<nn::RMSNorm>(c.hidden_size, c.rms_eps));
}

Tensor DecoderModel::forward(const Tensor& tokens) {
  if (!tokens.defined() || tokens.dtype() != DType::Int64 || tokens.dim() != 2)
    throw Error("Decoder: expected int64 tokens [B,T], got " +
                (tokens.defined() ? std::string(dtype_name(tokens.dtype())) + shape_str(tokens.shape())
                                  : std::string("an empty handle")));
  if (tokens.size(1) > config.max_seq_len)
    throw Error("Decoder: expected at most max_seq_len = " + std::to_string(config.max_seq_len) +
                " tokens per sequence, got " + shape_str(tokens.shape()));
  return norm->forward(layers->forward(embed_tokens->forward(tokens)));
}

Decoder::Decoder(const DecoderConfig& c) : config(c) {
  c.validate();
  model = register_module("model", std::make_shared<DecoderModel>(c));
  lm_head = register_module("lm_head", linear(c.hidden_size, c.vocab_size));
  // HF LlamaPreTrainedModel._init_weights.
  for (auto& [name, m] : named_modules()) {
    if (auto l = std::dynamic_pointer_cast<nn::Linear>(m)) {
      nn::init::normal_(l->weight, 0, c.initializer_range);
      if (l->bias.defined()) nn::init::zeros_(l->bias);
    } else if (auto e = std::dynamic_pointer_cast<nn::Embedding>(m)) {
      nn::init::normal_(e->weight, 0, c.initializer_range);
    }
  }
}

Tensor Decoder::forward(const Tensor& tokens) { return lm_head->forward(model->forward(tokens)); }

}  // namespace loom::models
