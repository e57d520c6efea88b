// Model `qwen2`: a decoder-only transformer of the Qwen2/Llama family:
// RMSNorm, rotary position embeddings, grouped-query attention with q/k/v
// bias, SwiGLU MLP, optional tied embeddings. Parameter names and
// arithmetic follow Hugging Face's Qwen2ForCausalLM. Returns the loss sum.
#include <cmath>

#include <fmt/format.h>

#include <filesystem>
#include <functional>
#include <set>
#include <fstream>
#include <sstream>
#include <string_view>

#include <fmt/ranges.h>

#include "trainer/Errors.h"
#include "trainer/JsonSupport.h"
#include "trainer/Model.h"
#include "trainer/Safetensors.h"
#include "trainer/TorchCompat.h"
#include "trainer/ops/Linear.h"
#include "trainer/ops/LinearCrossEntropy.h"
#include "trainer/ops/Recompute.h"
#include "trainer/ops/RmsNorm.h"
#include "trainer/ops/Rotary.h"
#include "trainer/ops/SwiGlu.h"

namespace {

using namespace trainer;
using torch::Tensor;

struct Config {
  int64_t vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads;
  double rope_theta, rms_norm_eps, initializer_range;
  bool tie_word_embeddings;
  int64_t max_positions;
  int64_t head_dim() const { return hidden_size / num_heads; }
};

struct Layer {
  Tensor q_weight, q_bias, k_weight, k_bias, v_weight, v_bias, o_weight;
  Tensor gate_weight, up_weight, down_weight;
  Tensor input_norm, post_attention_norm;
};

const KeySpec& key_spec(const char* name);

class Qwen2Model final : public Model {
 public:
  Qwen2Model(const Options& options, const Context& context)
      : config_(read_config(options)), checkpointing_(options.text("activation_checkpointing") == "full") {
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
    // With tied embeddings a checkpoint's lm_head.weight, if present, is the
    // embedding again and is not read.
    if (!options.text("hf_dir").empty()) load_weights(options.text("hf_dir"), weight_files(options));
    if (const std::string& from = options.text("init_from"); !from.empty()) {
      if (!std::filesystem::is_regular_file(from)) {
        options.fail("init_from", fmt::format("a .safetensors file; {} {}", from,
                                              std::filesystem::exists(from) ? "is not a regular file" : "does not exist"));
      }
      load_weights("model.init_from", {from});
    }
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
    const int64_t rows = batch.input_ids.numel();
    // The head and the loss in one op: no full logits, the loss *sum*.
    const Tensor loss_sum = run(batch.input_ids, [&](const Tensor& x) {
      return ops::linear_cross_entropy_sum(x.reshape({rows, config_.hidden_size}), lm_head_,
                                           batch.labels.reshape({rows}), /*chunk_rows=*/0, batch.target_tokens);
    });
    return LossSum{loss_sum, batch.target_tokens};
  }

  Tensor logits(const Tensor& input_ids) override {
    return run(input_ids, [&](const Tensor& x) { return torch::linear(x, lm_head_); });
  }

  // 6 N for the matrices the tokens multiply (the blocks' and the head's:
  // the embedding is a lookup; norms and biases left out) plus attention's
  // 12 L H T (PaLM, appendix B).
  double flops_per_token(int64_t seq_len) const override {
    const Config& c = config_;
    const double h = c.hidden_size, kv = static_cast<double>(c.num_kv_heads * c.head_dim());
    const double per_layer = 2 * h * h + 2 * h * kv + 3 * h * c.intermediate_size;
    const double matrices = c.num_layers * per_layer + c.vocab_size * h;
    return 6 * matrices + 12.0 * c.num_layers * h * seq_len;
  }

  std::string hf_config() const override {
    const Config& c = config_;
    const Json config{{"architectures", {"Qwen2ForCausalLM"}},
                      {"model_type", "qwen2"},
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
                      {"use_sliding_window", false},
                      {"attention_dropout", 0.0},
                      {"torch_dtype", "float32"}};
    return config.dump(2) + "\n";
  }


 private:
  // Embedding, blocks, final norm, then `head` on the normed hidden states.
  // Units: the embedding, each block, the head. Tied embeddings put the head
  // into the embedding's unit, which then stays entered until the end.
  Tensor run(const Tensor& input_ids, const std::function<Tensor(const Tensor&)>& head) {
    const Config& c = config_;
    const bool tied = c.tie_word_embeddings;
    enter_unit(0);
    Tensor x = torch::embedding(embed_, input_ids);
    if (!tied) x = leave_unit(0, x);
    const ops::RotaryTables& tables = rotary_tables(input_ids.size(1), x);
    for (size_t i = 0; i < layers_.size(); ++i) {
      enter_unit(i + 1);
      auto step = [this, i, &tables](const Tensor& input) { return block(layers_[i], tables, input); };
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
  // a fused SwiGLU. The norms' and SwiGLU's outputs are not kept for
  // backward but recomputed from their inputs (linear_of), which are kept
  // anyway: per token and layer that saves 2 hidden + 1 intermediate width
  // of activations for three elementwise passes.
  Tensor block(const Layer& l, const ops::RotaryTables& tables, const Tensor& x) const {
    const Config& c = config_;
    const int64_t b = x.size(0), t = x.size(1);
    const double eps = c.rms_norm_eps;
    const ops::InputFunction norm = [eps](const Tensor& s, const std::vector<Tensor>& w) {
      return ops::rms_norm(s, w[0], eps);
    };
    const ops::InputFunction swiglu = [](const Tensor& s, const std::vector<Tensor>&) { return ops::swiglu(s); };
    const Tensor qkv =
        ops::linear_of(norm, x, {l.input_norm}, {l.q_weight, l.k_weight, l.v_weight}, {l.q_bias, l.k_bias, l.v_bias});
    const ops::QkvHeads heads = ops::split_qkv_rotary(qkv, c.num_heads, c.num_kv_heads, tables);
    const Tensor attention = compat::causal_attention(heads.q.transpose(1, 2), heads.k.transpose(1, 2),
                                                      heads.v.transpose(1, 2))
                                 .transpose(1, 2)
                                 .reshape({b, t, c.hidden_size});
    const Tensor y = x + torch::linear(attention, l.o_weight);
    const Tensor gate_up = ops::linear_of(norm, y, {l.post_attention_norm}, {l.gate_weight, l.up_weight});
    return y + ops::linear_of(swiglu, gate_up, {}, {l.down_weight});
  }

  // Built once per sequence length, device and dtype, reused by every block and step.
  const ops::RotaryTables& rotary_tables(int64_t t, const Tensor& x) {
    const auto dtype = x.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    if (!tables_.cos.defined() || tables_.cos.size(0) != t || tables_.cos.device() != x.device() ||
        tables_.cos.scalar_type() != dtype) {
      tables_ = ops::RotaryTables::make(t, config_.head_dim(), config_.rope_theta, dtype, x.device());
    }
    return tables_;
  }

  static Config read_config(const Options& o) {
    Config c{o.integer("vocab_size"), o.integer("hidden_size"), o.integer("intermediate_size"),
             o.integer("num_hidden_layers"), o.integer("num_attention_heads"), o.integer("num_key_value_heads"),
             o.real("rope_theta"), o.real("rms_norm_eps"), o.real("initializer_range"),
             o.boolean("tie_word_embeddings"), o.integer("max_position_embeddings")};
    if (!o.text("hf_dir").empty()) read_hf_config(o, c);
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

  // config.json of a Hugging Face Qwen2 checkpoint. Keys the recipe also
  // sets must agree with it: one source of truth per run.
  static void read_hf_config(const Options& o, Config& c) {
    const std::string file = (std::filesystem::path(o.text("hf_dir")) / "config.json").string();
    std::ifstream in(file);
    if (!in) o.fail("hf_dir", fmt::format("a directory with config.json; cannot read {}", file));
    std::stringstream text;
    text << in.rdbuf();
    Json json;
    try {
      json = json_parse(text.str());
    } catch (const std::exception& error) {
      throw InputError(fmt::format("{}: malformed JSON: {}", file, error.what()));
    }
    if (!json.is_object()) throw InputError(fmt::format("{}: expected a JSON object", file));
    auto number = [&](const char* key, auto& field, const char* recipe_key) {
      const Json* v = json_find(json, key);
      using T = std::decay_t<decltype(field)>;
      if (!v || !v->is_number() || (std::is_integral_v<T> && !json_is_int64(*v))) {
        throw InputError(fmt::format("{}: '{}' must be {}", file, key, std::is_integral_v<T> ? "an integer" : "a number"));
      }
      const T value = std::is_integral_v<T> ? static_cast<T>(v->get<int64_t>()) : static_cast<T>(v->get<double>());
      // The same bounds as the recipe key: config.json is input like the recipe.
      const KeySpec& spec = key_spec(recipe_key);
      if (!std::isfinite(static_cast<double>(value)) || static_cast<double>(value) < spec.min ||
          static_cast<double>(value) > spec.max) {
        throw InputError(fmt::format("{}: '{}' = {} is outside [{}, {}]", file, key, value, spec.min, spec.max));
      }
      if (o.is_set(recipe_key) && value != field) {
        o.fail(recipe_key, fmt::format("{} as in {} (or leave the key out)", value, file));
      }
      field = value;
    };
    number("vocab_size", c.vocab_size, "vocab_size");
    number("hidden_size", c.hidden_size, "hidden_size");
    number("intermediate_size", c.intermediate_size, "intermediate_size");
    number("num_hidden_layers", c.num_layers, "num_hidden_layers");
    number("num_attention_heads", c.num_heads, "num_attention_heads");
    if (json_find(json, "num_key_value_heads")) number("num_key_value_heads", c.num_kv_heads, "num_key_value_heads");
    else c.num_kv_heads = c.num_heads;
    if (json_find(json, "rope_theta")) number("rope_theta", c.rope_theta, "rope_theta");
    if (json_find(json, "rms_norm_eps")) number("rms_norm_eps", c.rms_norm_eps, "rms_norm_eps");
    if (json_find(json, "max_position_embeddings")) number("max_position_embeddings", c.max_positions, "max_position_embeddings");
    if (const Json* tie = json_find(json, "tie_word_embeddings"); tie && tie->is_boolean()) c.tie_word_embeddings = tie->get<bool>();
    if (const Json* act = json_find(json, "hidden_act"); act && act->is_string() && *act != "silu") {
      throw InputError(fmt::format("{}: hidden_act '{}' is not supported (qwen2 implements silu)", file,
                                   act->get<std::string>()));
    }
    // transformers 5 keeps the rope settings in rope_parameters (older
    // versions: rope_theta at the top and rope_scaling null).
    for (const char* key : {"rope_parameters", "rope_scaling"}) {
      const Json* rope = json_find(json, key);
      if (!rope || rope->is_null()) continue;
      const Json* type = json_find(*rope, "rope_type");
      if (!type) type = json_find(*rope, "type");
      if (type && *type != "default") {
        throw InputError(fmt::format("{}: {} of type '{}' is not supported; expected 'default'", file, key,
                                     type->is_string() ? type->get<std::string>() : type->dump()));
      }
      if (const Json* theta = json_find(*rope, "rope_theta"); theta && theta->is_number()) {
        const double value = theta->get<double>();
        if (o.is_set("rope_theta") && value != c.rope_theta) {
          o.fail("rope_theta", fmt::format("{} as in {} (or leave the key out)", value, file));
        }
        c.rope_theta = value;
      }
    }
    if (const Json* window = json_find(json, "use_sliding_window"); window && *window == true) {
      throw InputError(fmt::format("{}: use_sliding_window = true is not supported", file));
    }
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

  static std::vector<std::string> weight_files(const Options& o) {
    const std::filesystem::path dir = o.text("hf_dir");
    if (std::filesystem::exists(dir / "model.safetensors")) return {(dir / "model.safetensors").string()};
    const std::string index_file = (dir / "model.safetensors.index.json").string();
    std::ifstream in(index_file);
    if (!in) o.fail("hf_dir", fmt::format("a directory with model.safetensors or model.safetensors.index.json: {}", dir.string()));
    std::stringstream text;
    text << in.rdbuf();
    std::vector<std::string> files;
    try {
      const Json index = json_parse(text.str());
      const Json* map = json_find(index, "weight_map");
      if (!map || !map->is_object()) throw std::runtime_error("no weight_map object");
      for (const auto& entry : map->items()) {
        const std::string name = entry.value().is_string() ? entry.value().get<std::string>() : "";
        // Shards sit beside the index: a name with a directory part could reach any file.
        if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
          throw std::runtime_error("weight_map['" + entry.key() + "'] must be a file name beside the index, got " +
                                   entry.value().dump());
        }
        const std::string path = (dir / name).string();
        if (std::find(files.begin(), files.end(), path) == files.end()) files.push_back(path);
      }
    } catch (const std::exception& error) {
      throw InputError(fmt::format("{}: malformed index: {}", index_file, error.what()));
    }
    return files;
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
  bool checkpointing_;
  ops::RotaryTables tables_;
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
    {"max_position_embeddings", ValueType::Int, "32768", "longest sequence (recorded in exported config.json)", 1, 1 << 30},
    {"hf_dir", ValueType::String, "''", "a Hugging Face Qwen2 directory: config.json sets the sizes, safetensors the weights"},
    {"activation_checkpointing", ValueType::String, "'none'",
     "'full' recomputes each block in backward, keeping only its input", -kNoLimit, kNoLimit, "none|full"},
    {"init_from", ValueType::String, "''", "a .safetensors file with weights to start from (Hugging Face names)"},
};

// A C string, not a std::string: GCC 13 takes a reference returned for a
// temporary std::string argument for a dangling one.
const KeySpec& key_spec(const char* name) {
  for (const KeySpec& spec : kKeys) {
    if (std::string_view(name) == spec.name) return spec;
  }
  throw std::logic_error(std::string("qwen2: no key ") + name);
}

Component* create(const Options& options, const Context& context) { return new Qwen2Model(options, context); }

const PluginDescriptor* describe() {
  static const PluginDescriptor descriptor{kAbiVersion, PluginKind::Model, "qwen2", "0.1.0",
                                           "Qwen2/Llama-family decoder-only transformer", TRAINER_TORCH_VERSION,
                                           kKeys, std::size(kKeys), &create};
  return &descriptor;
}

}  // namespace

TRAINER_PLUGIN(describe)
