// Model `qwen2`: a decoder-only transformer of the Qwen2/Llama family:
// RMSNorm, rotary position embeddings (Llama 3's scaling optional),
// grouped-query attention with q/k/v bias (Qwen2) or without (Llama),
// SwiGLU MLP, optional tied embeddings. Parameter names and arithmetic
// follow Hugging Face's Qwen2ForCausalLM and LlamaForCausalLM. Returns the
// loss sum.
#include <cmath>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string_view>

#include <fmt/ranges.h>

#include "trainer/Errors.h"
#include "trainer/Model.h"
#include "trainer/ops/Attention.h"
#include "trainer/ops/Embedding.h"
#include "trainer/ops/Linear.h"
#include "trainer/ops/LinearCrossEntropy.h"
#include "trainer/ops/Recompute.h"
#include "trainer/ops/RmsNorm.h"
#include "trainer/ops/Rotary.h"
#include "trainer/ops/SwiGlu.h"
#include "trainer/util/CheckingOnly.h"
#include "trainer/util/JsonSupport.h"
#include "trainer/util/Safetensors.h"
#include "trainer/util/TorchCompat.h"

#include "Qwen2Config.h"

namespace {

using namespace trainer;
using qwen2::Config;
using torch::Tensor;

struct Layer {
  Tensor q_weight, q_bias, k_weight, k_bias, v_weight, v_bias, o_weight;
  Tensor gate_weight, up_weight, down_weight;
  Tensor input_norm, post_attention_norm;
};

// model.init_from: "" or a regular file (checked; read by the caller).
std::string init_from(const Options& options) {
  const std::string& from = options.text("init_from");
  if (!from.empty() && !std::filesystem::is_regular_file(from)) {
    options.fail("init_from", fmt::format("a .safetensors file; {} {}", from,
                                          std::filesystem::exists(from) ? "is not a regular file" : "does not exist"));
  }
  return from;
}

class Qwen2Model final : public Model {
 public:
  Qwen2Model(const Options& options, const Context& context)
      : config_(qwen2::read_config(options)),
        checkpointing_(options.text("activation_checkpointing") == "full"),
        keep_elementwise_(options.text("activation_checkpointing") == "no_recompute") {
    if (checking_only()) {  // trainer validate: the configuration is checked; the weight files are found, not read
      if (!options.text("hf_dir").empty()) qwen2::weight_files(options);
      init_from(options);
      return;
    }
    at::Generator generator = compat::cpu_generator(context.seed);
    const Config& c = config_;
    const int64_t kv = c.num_kv_heads * c.head_dim();
    embed_ = weight("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, generator);
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string p = fmt::format("model.layers.{}.", i);
      Layer l;
      l.q_weight = weight(p + "self_attn.q_proj.weight", {c.hidden_size, c.hidden_size}, generator);
      if (c.attention_bias) l.q_bias = zeros(p + "self_attn.q_proj.bias", {c.hidden_size});
      l.k_weight = weight(p + "self_attn.k_proj.weight", {kv, c.hidden_size}, generator);
      if (c.attention_bias) l.k_bias = zeros(p + "self_attn.k_proj.bias", {kv});
      l.v_weight = weight(p + "self_attn.v_proj.weight", {kv, c.hidden_size}, generator);
      if (c.attention_bias) l.v_bias = zeros(p + "self_attn.v_proj.bias", {kv});
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
    // With tied embeddings a checkpoint's lm_head.weight, if present, is the
    // embedding again and is not read.
    if (!options.text("hf_dir").empty()) load_weights(options.text("hf_dir"), qwen2::weight_files(options));
    if (const std::string& from = init_from(options); !from.empty()) load_weights("model.init_from", {from});
  }

  std::vector<NamedParameter> parameters() override { return parameters_; }

  std::vector<ParameterUnit> units() override {
    // By name: the embedding, each block's "model.layers.i." parameters,
    // and the head (the final norm and lm_head).
    std::vector<ParameterUnit> units;
    ParameterUnit embedding{"embedding", {}};
    std::vector<ParameterUnit> blocks(layers_.size());
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i].name = fmt::format("layer{}", i);
    std::vector<size_t> head;
    for (size_t p = 0; p < parameters_.size(); ++p) {
      const std::string& name = parameters_[p].name;
      if (name == "model.embed_tokens.weight") {
        embedding.parameters.push_back(p);
      } else if (name.rfind("model.layers.", 0) == 0) {
        blocks.at(std::stoul(name.substr(13))).parameters.push_back(p);
      } else {
        head.push_back(p);
      }
    }
    for (ParameterUnit& block : blocks) units.push_back(std::move(block));
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
    const int64_t rows = batch.input_ids.numel();
    // The head and the loss in one op: no full logits, the loss *sum*.
    const Tensor loss_sum =
        run(batch.input_ids,
            Documents{batch.position_ids, {batch.document_ids, batch.document_offsets, batch.longest_document}},
            [&](const Tensor& x) {
              return ops::linear_cross_entropy_sum(x.reshape({rows, config_.hidden_size}), lm_head_,
                                                   batch.labels.reshape({rows}), /*chunk_rows=*/0, batch.target_tokens);
            });
    return LossSum{loss_sum, batch.target_tokens};
  }

  Tensor logits(const Tensor& input_ids) override {
    return run(input_ids, Documents{}, [&](const Tensor& x) { return torch::linear(x, lm_head_); });
  }

  // Packed documents: positions from each document's start (RoPE) and
  // attention within a document.
  bool separates_documents() const override { return true; }

  // Per input token: 6 N for the blocks' matrices (the embedding is a
  // lookup; norms and biases left out). Per attended pair: attention's 12 L
  // H (PaLM, appendix B: a token attending over T positions costs 12 L H T,
  // no causal halving, the field's convention), so a full window of T
  // costs 12 L H T per token as before and a packed window its documents'
  // own lengths. Per target token: the head's 6 V H, since the fused head
  // computes logits for target rows only.
  TrainingFlops training_flops() const override {
    const Config& c = config_;
    const double h = c.hidden_size, kv = static_cast<double>(c.num_kv_heads * c.head_dim());
    const double per_layer = 2 * h * h + 2 * h * kv + 3 * h * c.intermediate_size;
    return {6 * c.num_layers * per_layer, 6.0 * c.vocab_size * h, 12.0 * c.num_layers * h};
  }

  std::string hf_config() const override {
    const Config& c = config_;
    Json config{{"architectures", {c.is_llama() ? "LlamaForCausalLM" : "Qwen2ForCausalLM"}},
                {"model_type", c.is_llama() ? "llama" : "qwen2"},
                {"hidden_act", "silu"},
                {"vocab_size", c.vocab_size},
                {"hidden_size", c.hidden_size},
                {"intermediate_size", c.intermediate_size},
                {"num_hidden_layers", c.num_layers},
                {"num_attention_heads", c.num_heads},
                {"num_key_value_heads", c.num_kv_heads},
                {"rope_theta", c.rope_theta},
                {"rms_norm_eps", c.rms_norm_eps},
                {"initializer_range", c.initializer_range},
                {"tie_word_embeddings", c.tie_word_embeddings},
                {"max_position_embeddings", c.max_positions},
                {"attention_dropout", 0.0},
                {"torch_dtype", "float32"}};
    if (c.is_llama()) {
      config["attention_bias"] = c.attention_bias;
      config["mlp_bias"] = false;
      config["head_dim"] = c.head_dim();
      if (c.rope_scaling.factor != 1.0) {
        config["rope_scaling"] = Json{{"rope_type", "llama3"},
                                      {"factor", c.rope_scaling.factor},
                                      {"low_freq_factor", c.rope_scaling.low_freq_factor},
                                      {"high_freq_factor", c.rope_scaling.high_freq_factor},
                                      {"original_max_position_embeddings", c.rope_scaling.original_max_positions}};
      }
    } else {
      config["use_sliding_window"] = false;
    }
    return config.dump(2) + "\n";
  }

 private:
  // Embedding, blocks, final norm, then `head` on the normed hidden states.
  // Units: the embedding, each block, the head. Tied embeddings put the head
  // into the embedding's unit, which then stays entered until the end.
  // Batch::position_ids and the documents' layout; undefined for unpacked rows.
  struct Documents {
    Tensor positions;
    ops::DocumentLayout layout;
  };

  Tensor run(const Tensor& input_ids, const Documents& documents, const std::function<Tensor(const Tensor&)>& head) {
    const Config& c = config_;
    const bool tied = c.tie_word_embeddings;
    enter_unit(0);
    Tensor x = ops::embedding(embed_, input_ids);
    if (!tied) x = leave_unit(0, x);
    // Packed rows: the rows of each token's own position (the tables then
    // cover seq_len positions, the most a document can have). Captured by
    // value: activation checkpointing runs the blocks again in backward.
    const ops::RotaryTables tables = documents.positions.defined()
                                         ? rotary_tables(input_ids.size(1), x).at_positions(documents.positions)
                                         : rotary_tables(input_ids.size(1), x);
    const ops::DocumentLayout layout = documents.layout;
    for (size_t i = 0; i < layers_.size(); ++i) {
      enter_unit(i + 1);
      auto step = [this, i, tables, layout](const Tensor& input) { return block(layers_[i], tables, layout, input); };
      x = checkpointing_ ? ops::recompute(step, x) : step(x);
      x = leave_unit(i + 1, x);
    }
    const size_t unit = tied ? 0 : layers_.size() + 1;
    if (!tied) enter_unit(unit);
    return leave_unit(unit, head(ops::rms_norm(x, final_norm_, c.rms_norm_eps)));
  }

  // One decoder block: q/k/v as one GEMM (the projections lie back to back
  // in the flat parameter buffers), RoPE fused into the split into heads,
  // grouped-query attention without repeating k/v, gate/up as one GEMM and
  // a fused SwiGLU. By default (activation_checkpointing 'none') the
  // norms' and SwiGLU's outputs are not kept for backward but recomputed
  // from their inputs (linear_of), which are kept anyway: per token and
  // layer that saves 2 hidden + 1 intermediate width of activations for
  // three elementwise passes; 'no_recompute' keeps them (the same kernels
  // on the same inputs: the same bits).
  Tensor block(const Layer& l, const ops::RotaryTables& tables, const ops::DocumentLayout& documents,
               const Tensor& x) const {
    const Config& c = config_;
    const int64_t b = x.size(0), t = x.size(1);
    const double eps = c.rms_norm_eps;
    const ops::InputFunction norm = [eps](const Tensor& s, const std::vector<Tensor>& w) {
      return ops::rms_norm(s, w[0], eps);
    };
    const ops::InputFunction swiglu = [](const Tensor& s, const std::vector<Tensor>&) { return ops::swiglu(s); };
    const std::vector<Tensor> qkv_biases =
        c.attention_bias ? std::vector<Tensor>{l.q_bias, l.k_bias, l.v_bias} : std::vector<Tensor>{};
    // f(s) in front of a linear layer: recomputed in backward, or kept (f
    // recorded by autograd, its output handed to linear_of through an
    // identity: the same linear backward either way). f reads s through a
    // view, so that the gradients of its several uses of s (the CPU norm's
    // composite has two) add up before the residual's joins them, as they
    // do in the recomputation: the same sums in the same order, the same bits.
    auto linear_of = [this](const ops::InputFunction& f, const Tensor& s, const std::vector<Tensor>& f_params,
                            const std::vector<Tensor>& weights, const std::vector<Tensor>& biases) {
      if (!keep_elementwise_) return ops::linear_of(f, s, f_params, weights, biases);
      static const ops::InputFunction identity = [](const Tensor& h, const std::vector<Tensor>&) { return h; };
      return ops::linear_of(identity, f(s.view_as(s), f_params), {}, weights, biases);
    };
    // Recomputed, the norms' outputs go straight into the FP8 weight
    // gradients' operands (norm_linear), as SwiGLU's does (swiglu_linear).
    auto norm_linear = [&](const Tensor& s, const Tensor& norm_weight, const std::vector<Tensor>& weights,
                           const std::vector<Tensor>& biases) {
      return keep_elementwise_ ? linear_of(norm, s, {norm_weight}, weights, biases)
                               : ops::norm_linear(s, norm_weight, eps, weights, biases);
    };
    const Tensor qkv = norm_linear(x, l.input_norm, {l.q_weight, l.k_weight, l.v_weight}, qkv_biases);
    const ops::QkvHeads heads = ops::split_qkv_rotary(qkv, c.num_heads, c.num_kv_heads, tables);
    const Tensor attention = ops::document_causal_attention(heads.q.transpose(1, 2), heads.k.transpose(1, 2),
                                                            heads.v.transpose(1, 2), documents)
                                 .transpose(1, 2)
                                 .reshape({b, t, c.hidden_size});
    const Tensor y = x + ops::linear(attention, {l.o_weight});
    const Tensor gate_up = norm_linear(y, l.post_attention_norm, {l.gate_weight, l.up_weight}, {});
    return y + (keep_elementwise_ ? linear_of(swiglu, gate_up, {}, {l.down_weight}, {})
                                  : ops::swiglu_linear(gate_up, {l.down_weight}));
  }

  // Built once per sequence length, device and dtype, reused by every block and step.
  const ops::RotaryTables& rotary_tables(int64_t t, const Tensor& x) {
    const auto dtype = x.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    if (!tables_.cos.defined() || tables_.cos.size(0) != t || tables_.cos.device() != x.device() ||
        tables_.cos.scalar_type() != dtype) {
      const qwen2::RopeScalingConfig& r = config_.rope_scaling;
      tables_ = ops::RotaryTables::make(t, config_.head_dim(), config_.rope_theta, dtype, x.device(),
                                        ops::RopeScaling{r.factor, r.low_freq_factor, r.high_freq_factor,
                                                         static_cast<double>(r.original_max_positions)});
    }
    return tables_;
  }

  // Weights by Hugging Face name from one safetensors file or the shards an
  // index names. Every parameter must be found with its exact shape.
  void load_weights(const std::string& where, const std::vector<std::string>& files) {
    std::vector<std::unique_ptr<SafetensorsReader>> readers;
    for (const std::string& f : files) readers.push_back(std::make_unique<SafetensorsReader>(f));
    torch::NoGradGuard no_grad;
    for (NamedParameter& p : parameters_) {
      const SafetensorsReader* reader = nullptr;
      for (const auto& r : readers) {
        if (r->contains(p.name)) reader = r.get();
      }
      if (!reader) throw InputError(fmt::format("{}: no tensor '{}' in {}", where, p.name, fmt::join(files, ", ")));
      const Tensor value = reader->read(p.name);
      if (value.sizes() != p.tensor.sizes()) {
        throw InputError(fmt::format("{}: tensor '{}' has shape [{}], the model expects [{}]", reader->path(), p.name,
                                     fmt::join(value.sizes(), ", "), fmt::join(p.tensor.sizes(), ", ")));
      }
      if (!value.is_floating_point()) {
        throw InputError(fmt::format("{}: tensor '{}' has dtype {}, expected a floating-point dtype", reader->path(),
                                     p.name, c10::toString(value.scalar_type())));
      }
      p.tensor.copy_(value);
    }
    // Every tensor must be one the model has: a config.json with fewer
    // layers than the weights, or weights of another architecture, would
    // otherwise load in part and train silently on what is left.
    std::set<std::string> known;
    for (const NamedParameter& p : parameters_) known.insert(p.name);
    if (config_.tie_word_embeddings) known.insert("lm_head.weight");  // the embedding again
    std::vector<std::string> unknown;
    for (const auto& r : readers) {
      for (const std::string& name : r->names()) {
        if (!known.count(name)) unknown.push_back(name);
      }
    }
    if (!unknown.empty()) {
      std::sort(unknown.begin(), unknown.end());
      const size_t shown = std::min<size_t>(unknown.size(), 4);
      throw InputError(fmt::format("{}: {} tensor(s) the model (num_hidden_layers = {}) does not have, e.g. {}", where,
                                   unknown.size(), config_.num_layers,
                                   fmt::join(unknown.begin(), unknown.begin() + shown, ", ")));
    }
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
  bool checkpointing_;     // activation_checkpointing 'full'
  bool keep_elementwise_;  // 'no_recompute'

  ops::RotaryTables tables_;
  std::vector<NamedParameter> parameters_;
  Tensor embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Model, Qwen2Model, "qwen2", "0.1.0", "Qwen2/Llama-family decoder-only transformer", qwen2::keys())
