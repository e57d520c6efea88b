// Model `qwen2`: a decoder-only transformer of the Qwen2/Llama family:
// RMSNorm, rotary position embeddings, grouped-query attention with q/k/v
// bias, SwiGLU MLP, optional tied embeddings. Parameter names and
// arithmetic follow Hugging Face's Qwen2ForCausalLM. Returns the loss sum.
#include <cmath>

#include <fmt/format.h>

#include "trainer/Model.h"
#include "trainer/TorchCompat.h"

namespace {

using namespace trainer;
using torch::Tensor;

struct Config {
  int64_t vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads;
  double rope_theta, rms_norm_eps, initializer_range;
  bool tie_word_embeddings;
  int64_t head_dim() const { return hidden_size / num_heads; }
};

struct Layer {
  Tensor q_weight, q_bias, k_weight, k_bias, v_weight, v_bias, o_weight;
  Tensor gate_weight, up_weight, down_weight;
  Tensor input_norm, post_attention_norm;
};

// Hugging Face's Qwen2RMSNorm: normalise in at least fp32, scale in the input dtype.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  const Tensor wide = x.scalar_type() == torch::kFloat64 ? x : x.to(torch::kFloat32);
  const Tensor normed = wide * torch::rsqrt(wide.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

Tensor rotate_half(const Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

class Qwen2Model final : public Model {
 public:
  Qwen2Model(const Options& options, const Context& context) : config_(read_config(options)) {
    at::Generator generator = compat::cpu_generator(context.seed);
    const Config& c = config_;
    const int64_t kv = c.num_kv_heads * c.head_dim();
    embed_ = weight("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, generator);
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string p = fmt::format("model.layers.{}.", i);
      Layer l;
      l.q_weight = weight(p + "self_attn.q_proj.weight", {c.hidden_size, c.hidden_size}, generator);
      l.q_bias = zeros(p + "self_attn.q_proj.bias", {c.hidden_size});
      l.k_weight = weight(p + "self_attn.k_proj.weight", {kv, c.hidden_size}, generator);
      l.k_bias = zeros(p + "self_attn.k_proj.bias", {kv});
      l.v_weight = weight(p + "self_attn.v_proj.weight", {kv, c.hidden_size}, generator);
      l.v_bias = zeros(p + "self_attn.v_proj.bias", {kv});
      l.o_weight = weight(p + "self_attn.o_proj.weight", {c.hidden_size, c.hidden_size}, generator);
      l.gate_weight = weight(p + "mlp.gate_proj.weight", {c.intermediate_size, c.hidden_size}, generator);
      l.up_weight = weight(p + "mlp.up_proj.weight", {c.intermediate_size, c.hidden_size}, generator);
      l.down_weight = weight(p + "mlp.down_proj.weight", {c.hidden_size, c.intermediate_size}, generator);
      l.input_norm = ones(p + "input_layernorm.weight", {c.hidden_size});
      l.post_attention_norm = ones(p + "post_attention_layernorm.weight", {c.hidden_size});
      layers_.push_back(std::move(l));
    }
    final_norm_ = ones("model.norm.weight", {c.hidden_size});
    lm_head_ = c.tie_word_embeddings ? embed_ : weight("lm_head.weight", {c.vocab_size, c.hidden_size}, generator);
  }

  std::vector<NamedParameter> parameters() override { return parameters_; }

  std::vector<ParameterUnit> units() override {
    // Parameters were created in forward order: embedding, blocks, head.
    const size_t per_layer = 12;
    std::vector<ParameterUnit> units;
    ParameterUnit embedding{"embedding", {0}};
    for (size_t i = 0; i < layers_.size(); ++i) {
      ParameterUnit block{fmt::format("layer{}", i), {}};
      for (size_t k = 0; k < per_layer; ++k) block.parameters.push_back(1 + i * per_layer + k);
      units.push_back(std::move(block));
    }
    std::vector<size_t> head;
    for (size_t p = 1 + layers_.size() * per_layer; p < parameters_.size(); ++p) head.push_back(p);
    if (config_.tie_word_embeddings) {
      embedding.name = "embedding+head";
      embedding.parameters.insert(embedding.parameters.end(), head.begin(), head.end());
    } else {
      units.push_back(ParameterUnit{"head", head});
    }
    units.insert(units.begin(), std::move(embedding));
    return units;
  }
  int64_t vocab_size() const override { return config_.vocab_size; }

  LossSum forward(const Batch& batch) override {
    const Config& c = config_;
    const int64_t b = batch.input_ids.size(0), t = batch.input_ids.size(1), d = c.head_dim();
    // Units: the embedding, each block, the head. Tied embeddings put the
    // head into the embedding's unit, which then stays entered until the end.
    const bool tied = c.tie_word_embeddings;
    enter_unit(0);
    Tensor x = torch::embedding(embed_, batch.input_ids);
    if (!tied) x = leave_unit(0, x);
    const auto [cos, sin] = rotary_tables(t, x);
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& l = layers_[i];
      enter_unit(i + 1);
      const Tensor h = rms_norm(x, l.input_norm, c.rms_norm_eps);
      Tensor q = torch::linear(h, l.q_weight, l.q_bias).view({b, t, c.num_heads, d}).transpose(1, 2);
      Tensor k = torch::linear(h, l.k_weight, l.k_bias).view({b, t, c.num_kv_heads, d}).transpose(1, 2);
      Tensor v = torch::linear(h, l.v_weight, l.v_bias).view({b, t, c.num_kv_heads, d}).transpose(1, 2);
      q = q * cos + rotate_half(q) * sin;
      k = k * cos + rotate_half(k) * sin;
      const int64_t groups = c.num_heads / c.num_kv_heads;  // grouped-query attention
      if (groups > 1) {
        k = k.repeat_interleave(groups, 1);
        v = v.repeat_interleave(groups, 1);
      }
      const Tensor attention = compat::causal_attention(q, k, v).transpose(1, 2).reshape({b, t, c.hidden_size});
      x = x + torch::linear(attention, l.o_weight);
      const Tensor m = rms_norm(x, l.post_attention_norm, c.rms_norm_eps);
      x = x + torch::linear(torch::silu(torch::linear(m, l.gate_weight)) * torch::linear(m, l.up_weight),
                            l.down_weight);
      x = leave_unit(i + 1, x);
    }
    const size_t head = tied ? 0 : layers_.size() + 1;
    if (!tied) enter_unit(head);
    x = rms_norm(x, final_norm_, c.rms_norm_eps);
    Tensor logits = leave_unit(head, torch::linear(x, lm_head_)).view({b * t, c.vocab_size});
    if (logits.scalar_type() != torch::kFloat64) logits = logits.to(torch::kFloat32);  // the loss is summed in fp32
    const Tensor loss_sum = at::cross_entropy_loss(logits, batch.labels.view({b * t}), /*weight=*/{},
                                                   at::Reduction::Sum, kIgnoreIndex);
    return LossSum{loss_sum, batch.target_tokens};
  }

 private:
  static Config read_config(const Options& o) {
    Config c{o.integer("vocab_size"), o.integer("hidden_size"), o.integer("intermediate_size"),
             o.integer("num_hidden_layers"), o.integer("num_attention_heads"), o.integer("num_key_value_heads"),
             o.real("rope_theta"), o.real("rms_norm_eps"), o.real("initializer_range"),
             o.boolean("tie_word_embeddings")};
    if (c.hidden_size % c.num_heads != 0) {
      o.fail("num_attention_heads", fmt::format("a divisor of hidden_size = {}, got {}", c.hidden_size, c.num_heads));
    }
    if (c.head_dim() % 2 != 0) {
      o.fail("num_attention_heads", fmt::format("a head size hidden_size / heads that is even, got {}", c.head_dim()));
    }
    if (c.num_heads % c.num_kv_heads != 0) {
      o.fail("num_key_value_heads", fmt::format("a divisor of num_attention_heads = {}, got {}", c.num_heads,
                                                c.num_kv_heads));
    }
    return c;
  }

  // cos and sin of Hugging Face's rotary embedding, [1, 1, t, head_dim], in x's dtype.
  std::pair<Tensor, Tensor> rotary_tables(int64_t t, const Tensor& x) const {
    const int64_t d = config_.head_dim();
    // Hugging Face computes the tables in fp32; an fp64 reference gets fp64.
    const auto type = x.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    const auto wide = torch::TensorOptions().dtype(type).device(x.device());
    const Tensor inv_freq =
        1.0 / torch::pow(config_.rope_theta, torch::arange(0, d, 2, wide.dtype(torch::kInt64)).to(type) / d);
    const Tensor freqs = torch::outer(torch::arange(t, wide), inv_freq);
    const Tensor angles = torch::cat({freqs, freqs}, -1).view({1, 1, t, d});
    return {angles.cos().to(x.scalar_type()), angles.sin().to(x.scalar_type())};
  }

  Tensor add(const std::string& name, Tensor tensor, bool decay) {
    tensor.set_requires_grad(true);
    parameters_.push_back(NamedParameter{name, tensor, decay});
    return tensor;
  }
  Tensor weight(const std::string& name, at::IntArrayRef shape, at::Generator& generator) {
    torch::NoGradGuard no_grad;
    return add(name, torch::empty(shape).normal_(0.0, config_.initializer_range, generator), /*decay=*/true);
  }
  Tensor zeros(const std::string& name, at::IntArrayRef shape) { return add(name, torch::zeros(shape), false); }
  Tensor ones(const std::string& name, at::IntArrayRef shape) { return add(name, torch::ones(shape), false); }

  Config config_;
  std::vector<NamedParameter> parameters_;
  Tensor embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
};

constexpr KeySpec kKeys[] = {
    {"vocab_size", ValueType::Int, "64", "token ids the embedding covers", 1, 1 << 30},
    {"hidden_size", ValueType::Int, "64", "width of the residual stream", 2, 1 << 20},
    {"intermediate_size", ValueType::Int, "128", "width of the SwiGLU MLP", 1, 1 << 22},
    {"num_hidden_layers", ValueType::Int, "2", "decoder blocks", 1, 1 << 12},
    {"num_attention_heads", ValueType::Int, "4", "query heads", 1, 1 << 12},
    {"num_key_value_heads", ValueType::Int, "2", "key/value heads (grouped-query attention)", 1, 1 << 12},
    {"rope_theta", ValueType::Float, "10000.0", "rotary embedding base", 1, 1e12},
    {"rms_norm_eps", ValueType::Float, "1e-6", "RMSNorm epsilon", 0, 1},
    {"initializer_range", ValueType::Float, "0.02", "std of the normal init of matrices", 0, 10},
    {"tie_word_embeddings", ValueType::Bool, "false", "lm_head shares the embedding matrix"},
};

Component* create(const Options& options, const Context& context) { return new Qwen2Model(options, context); }

const PluginDescriptor* describe() {
  static const PluginDescriptor descriptor{kAbiVersion, PluginKind::Model, "qwen2", "0.1.0",
                                           "Qwen2/Llama-family decoder-only transformer", TRAINER_TORCH_VERSION,
                                           kKeys, std::size(kKeys), &create};
  return &descriptor;
}

}  // namespace

TRAINER_PLUGIN(describe)
