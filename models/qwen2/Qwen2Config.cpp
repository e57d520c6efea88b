// The qwen2 model's recipe keys and Hugging Face config.json / index
// reading (see Qwen2Config.h).
#include "Qwen2Config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include "trainer/Errors.h"
#include "trainer/util/JsonSupport.h"

namespace trainer::qwen2 {

namespace {

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
    {"max_position_embeddings", ValueType::Int, "32768", "longest sequence (recorded in exported config.json)", 1,
     1 << 30},
    {"attention_bias", ValueType::Bool, "true", "q/k/v projections have biases (Qwen2); false: none (Llama)"},
    {"rope_scaling", ValueType::String, "'none'", "'llama3': Llama 3's frequency-dependent rope scaling", -kNoLimit,
     kNoLimit, "none|llama3"},
    {"rope_scaling_factor", ValueType::Float, "8.0", "llama3 scaling: the stretch of the low frequencies", 1, 1e6},
    {"rope_low_freq_factor", ValueType::Float, "1.0", "llama3 scaling: low_freq_factor", 1e-6, 1e6},
    {"rope_high_freq_factor", ValueType::Float, "4.0", "llama3 scaling: high_freq_factor", 1e-6, 1e6},
    {"rope_original_max_position_embeddings", ValueType::Int, "8192",
     "llama3 scaling: the context length the model was pretrained at", 1, 1 << 30},
    {"hf_dir", ValueType::String, "''",
     "a Hugging Face Qwen2 or Llama directory: config.json sets the sizes, safetensors the weights"},
    {"activation_checkpointing", ValueType::String, "'none'",
     "what backward recomputes: 'none' only the norms' and SwiGLU's outputs (cheap, from inputs kept anyway); "
     "'full' each block from its input; 'no_recompute' nothing (fastest, most memory)",
     -kNoLimit, kNoLimit, "none|full|no_recompute"},
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

}  // namespace

void read_hf_config(const Options& o, Config& c);

const std::vector<KeySpec>& keys() {
  static const std::vector<KeySpec> all(std::begin(kKeys), std::end(kKeys));
  return all;
}

Config read_config(const Options& o) {
  Config c{o.integer("vocab_size"),
           o.integer("hidden_size"),
           o.integer("intermediate_size"),
           o.integer("num_hidden_layers"),
           o.integer("num_attention_heads"),
           o.integer("num_key_value_heads"),
           o.real("rope_theta"),
           o.real("rms_norm_eps"),
           o.real("initializer_range"),
           o.boolean("tie_word_embeddings"),
           o.integer("max_position_embeddings"),
           o.boolean("attention_bias"),
           RopeScalingConfig{}};
  if (o.text("rope_scaling") == "llama3") {
    c.rope_scaling =
        RopeScalingConfig{o.real("rope_scaling_factor"), o.real("rope_low_freq_factor"),
                          o.real("rope_high_freq_factor"), o.integer("rope_original_max_position_embeddings")};
    if (!(c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor)) {
      o.fail("rope_high_freq_factor",
             fmt::format("more than rope_low_freq_factor = {}", c.rope_scaling.low_freq_factor));
    }
  }
  if (!o.text("hf_dir").empty()) read_hf_config(o, c);
  if (c.hidden_size % c.num_heads != 0) {
    o.fail("num_attention_heads", fmt::format("a divisor of hidden_size = {}, got {}", c.hidden_size, c.num_heads));
  }
  if (c.head_dim() % 2 != 0) {
    o.fail("num_attention_heads", fmt::format("a head size hidden_size / heads that is even, got {}", c.head_dim()));
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    o.fail("num_key_value_heads",
           fmt::format("a divisor of num_attention_heads = {}, got {}", c.num_heads, c.num_kv_heads));
  }
  return c;
}

// config.json of a Hugging Face Qwen2 checkpoint. Keys the recipe also
// sets must agree with it: one source of truth per run.
void read_hf_config(const Options& o, Config& c) {
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
  // Qwen2 always has q/k/v biases; Llama has them when attention_bias says so.
  const Json* model_type = json_find(json, "model_type");
  const std::string type = model_type && model_type->is_string() ? model_type->get<std::string>() : "qwen2";
  if (type != "qwen2" && type != "llama") {
    throw InputError(fmt::format("{}: model_type '{}' is not supported (qwen2, llama)", file, type));
  }
  bool bias = true;
  if (type == "llama") {
    const Json* b = json_find(json, "attention_bias");
    bias = b && b->is_boolean() && b->get<bool>();
    if (const Json* mlp = json_find(json, "mlp_bias"); mlp && *mlp == true) {
      throw InputError(fmt::format("{}: mlp_bias = true is not supported", file));
    }
  }
  if (o.is_set("attention_bias") && bias != c.attention_bias) {
    o.fail("attention_bias", fmt::format("{} as in {} (or leave the key out)", bias, file));
  }
  c.attention_bias = bias;
  auto number = [&](const char* key, auto& field, const char* recipe_key) {
    const Json* v = json_find(json, key);
    using T = std::decay_t<decltype(field)>;
    if (!v || !v->is_number() || (std::is_integral_v<T> && !json_is_int64(*v))) {
      throw InputError(
          fmt::format("{}: '{}' must be {}", file, key, std::is_integral_v<T> ? "an integer" : "a number"));
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
  if (json_find(json, "num_key_value_heads"))
    number("num_key_value_heads", c.num_kv_heads, "num_key_value_heads");
  else
    c.num_kv_heads = c.num_heads;
  if (json_find(json, "rope_theta")) number("rope_theta", c.rope_theta, "rope_theta");
  if (json_find(json, "rms_norm_eps")) number("rms_norm_eps", c.rms_norm_eps, "rms_norm_eps");
  if (json_find(json, "max_position_embeddings"))
    number("max_position_embeddings", c.max_positions, "max_position_embeddings");
  if (const Json* tie = json_find(json, "tie_word_embeddings"); tie && tie->is_boolean())
    c.tie_word_embeddings = tie->get<bool>();
  if (const Json* act = json_find(json, "hidden_act"); act && act->is_string() && *act != "silu") {
    throw InputError(
        fmt::format("{}: hidden_act '{}' is not supported (qwen2 implements silu)", file, act->get<std::string>()));
  }
  // transformers 5 keeps the rope settings in rope_parameters (older
  // versions: rope_theta at the top and rope_scaling null).
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const Json* rope = json_find(json, key);
    if (!rope || rope->is_null()) continue;
    const Json* rope_type = json_find(*rope, "rope_type");
    if (!rope_type) rope_type = json_find(*rope, "type");
    if (rope_type && *rope_type == "llama3") {
      auto factor = [&](const char* name, double& field) {
        const Json* v = json_find(*rope, name);
        if (!v || !v->is_number() || !(v->get<double>() > 0)) {
          throw InputError(fmt::format("{}: {}.{} must be a positive number", file, key, name));
        }
        field = v->get<double>();
      };
      RopeScalingConfig r;
      factor("factor", r.factor);
      factor("low_freq_factor", r.low_freq_factor);
      factor("high_freq_factor", r.high_freq_factor);
      double original = 0;
      factor("original_max_position_embeddings", original);
      r.original_max_positions = static_cast<int64_t>(original);
      if (!(r.high_freq_factor > r.low_freq_factor)) {
        throw InputError(fmt::format("{}: {}.high_freq_factor must exceed low_freq_factor", file, key));
      }
      c.rope_scaling = r;
    } else if (rope_type && *rope_type != "default") {
      throw InputError(fmt::format("{}: {} of type '{}' is not supported; expected 'default' or 'llama3'", file, key,
                                   rope_type->is_string() ? rope_type->get<std::string>() : rope_type->dump()));
    }
    if (const Json* theta = json_find(*rope, "rope_theta"); theta && theta->is_number()) {
      const double value = theta->get<double>();
      if (o.is_set("rope_theta") && value != c.rope_theta) {
        o.fail("rope_theta", fmt::format("{} as in {} (or leave the key out)", value, file));
      }
      c.rope_theta = value;
    }
  }
  if (const Json* head_dim = json_find(json, "head_dim");
      head_dim && !head_dim->is_null() && !(json_is_int64(*head_dim) && head_dim->get<int64_t>() == c.head_dim())) {
    throw InputError(fmt::format("{}: head_dim {} other than hidden_size / num_attention_heads = {} is not supported",
                                 file, head_dim->dump(), c.head_dim()));
  }
  if (const Json* window = json_find(json, "use_sliding_window"); window && *window == true) {
    throw InputError(fmt::format("{}: use_sliding_window = true is not supported", file));
  }
}

std::vector<std::string> weight_files(const Options& o) {
  const std::filesystem::path dir = o.text("hf_dir");
  if (std::filesystem::exists(dir / "model.safetensors")) return {(dir / "model.safetensors").string()};
  const std::string index_file = (dir / "model.safetensors.index.json").string();
  std::ifstream in(index_file);
  if (!in)
    o.fail("hf_dir",
           fmt::format("a directory with model.safetensors or model.safetensors.index.json: {}", dir.string()));
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

}  // namespace trainer::qwen2
