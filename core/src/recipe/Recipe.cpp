// Recipe parsing (TOML++) and validation against declared keys. Every error
// names the file, the line and column (or --set), the section and the key.
// One file: reading, overriding, validating and resolving share the table
// walk and the error context, and read only together.
#include "recipe/Recipe.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <toml++/toml.h>
#include <cmath>
#include <filesystem>
#include <functional>

#include "recipe/TomlText.h"
#include "trainer/Errors.h"
#include "util/Hash.h"

namespace trainer {

namespace {

using VT = ValueType;

const char* kPluginSections[] = {"model", "dataset", "strategy", "logger"};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string suggestion(const std::string& key, const std::vector<std::string>& candidates) {
  const std::string close = closest_key(key, candidates);
  return close.empty() ? fmt::format(" (valid keys: {})", fmt::join(candidates, ", "))
                       : fmt::format(" (did you mean '{}'?)", close);
}

std::string show(const toml::node& node) {
  std::ostringstream out;
  node.visit([&](const auto& value) { out << value; });
  return out.str();
}

// Where each value came from: a line of the file, or a --set argument.
class Origins {
 public:
  explicit Origins(std::string file) : file_(std::move(file)) {}
  void set_override(const std::string& path, const std::string& argument) { overrides_[path] = argument; }
  std::string of(const std::string& path, const toml::node& node) const { return of(path, node.source()); }
  std::string of(const std::string& path, const toml::source_region& source) const {
    auto it = overrides_.find(path);
    if (it != overrides_.end()) return fmt::format("--set {}", it->second);
    const auto& begin = source.begin;
    return fmt::format("{}:{}:{}", file_, begin.line, begin.column);
  }
  const std::string& file() const { return file_; }

 private:
  std::string file_;
  std::map<std::string, std::string> overrides_;
};

std::string expected_text(const KeySpec& spec) {
  switch (spec.type) {
    case VT::Bool:
      return "a boolean";
    case VT::String:
      return spec.choices ? fmt::format("one of {}", std::string(spec.choices)) : "a string";
    case VT::Int:
    case VT::Float: {
      const char* what = spec.type == VT::Int ? "an integer" : "a finite number";
      // An unbounded side is infinite (Options.h's defaults).
      if (std::isinf(spec.min) && std::isinf(spec.max)) return what;
      if (std::isinf(spec.max)) return fmt::format("{} >= {}", what, spec.min);
      if (std::isinf(spec.min)) return fmt::format("{} <= {}", what, spec.max);
      return fmt::format("{} in [{}, {}]", what, spec.min, spec.max);
    }
  }
  return "a value";
}

bool in_choices(const std::string& value, const char* choices) {
  std::string all = choices;
  size_t start = 0;
  while (start <= all.size()) {
    const size_t end = std::min(all.find('|', start), all.size());
    if (all.compare(start, end - start, value) == 0 && end - start == value.size()) return true;
    start = end + 1;
  }
  return false;
}

// Converts one TOML node to the declared type, or says what was expected.
Value convert(const KeySpec& spec, const toml::node& node, const std::string& where) {
  auto fail = [&]() -> InputError {
    return InputError(fmt::format("{} = {}: expected {}", where, show(node), expected_text(spec)));
  };
  switch (spec.type) {
    case VT::Bool:
      if (!node.is_boolean()) throw fail();
      return node.as_boolean()->get();
    case VT::String: {
      if (!node.is_string()) throw fail();
      std::string value = node.as_string()->get();
      if (spec.choices && !in_choices(value, spec.choices)) throw fail();
      return value;
    }
    case VT::Int: {
      if (!node.is_integer()) throw fail();
      const int64_t value = node.as_integer()->get();
      if (static_cast<double>(value) < spec.min || static_cast<double>(value) > spec.max) throw fail();
      return value;
    }
    case VT::Float: {
      double value = 0;
      if (node.is_floating_point())
        value = node.as_floating_point()->get();
      else if (node.is_integer())
        value = static_cast<double>(node.as_integer()->get());
      else
        throw fail();
      // No key takes an infinite or NaN value (lr = inf would train NaNs).
      if (!std::isfinite(value) || !(value >= spec.min && value <= spec.max)) throw fail();
      return value;
    }
  }
  throw fail();
}

toml::table parse_literal(const std::string& literal) { return parse_toml("v = " + literal, "--set"); }

// Validates one table against its declared keys. `path` is "training" or
// "logger.1"; `skip_name` leaves the plugin-choosing key alone.
Options validate(const toml::table& table, const std::string& path, const std::string& label, const KeySpec* keys,
                 size_t num_keys, const Origins& origins, bool skip_name) {
  std::vector<std::string> names;
  for (size_t i = 0; i < num_keys; ++i) names.push_back(keys[i].name);
  for (const auto& [key, node] : table) {
    const std::string name(key.str());
    if (skip_name && name == "name") continue;
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      std::vector<std::string> valid = names;
      if (skip_name) valid.insert(valid.begin(), "name");
      throw InputError(fmt::format("{}: [{}] unknown key '{}'{}", origins.of(path + "." + name, key.source()), label,
                                   name, suggestion(name, valid)));
    }
  }
  std::vector<Options::Entry> entries;
  for (size_t i = 0; i < num_keys; ++i) {
    const KeySpec& spec = keys[i];
    if (const toml::node* node = table.get(spec.name)) {
      const std::string origin = origins.of(path + "." + spec.name, *node);
      entries.push_back(
          {spec.name, convert(spec, *node, fmt::format("{}: [{}] {}", origin, label, spec.name)), origin});
    } else if (spec.default_value == nullptr) {
      throw InputError(fmt::format("{}: [{}] missing required key '{}': expected {} ({})", origins.file(), label,
                                   spec.name, expected_text(spec), spec.help));
    } else {
      const toml::table literal = parse_literal(spec.default_value);
      entries.push_back({spec.name,
                         convert(spec, *literal.get("v"), fmt::format("default of [{}] {}", label, spec.name)),
                         "default"});
    }
  }
  return Options(label, origins.file(), std::move(entries));
}

void apply_override(toml::table& root, const std::string& argument, Origins& origins) {
  const size_t equals = argument.find('=');
  std::vector<std::string> parts;
  if (equals != std::string::npos) {
    std::stringstream path(argument.substr(0, equals));
    for (std::string part; std::getline(path, part, '.');) parts.push_back(part);
  }
  const bool indexed = parts.size() == 3 && parts[0] == "logger";
  if (parts.size() != 2 && !indexed) {
    throw InputError(fmt::format("--set {}: expected section.key=value (or logger.N.key=value)", argument));
  }
  const std::string raw = argument.substr(equals + 1);
  toml::table parsed;
  bool literal = true;
  try {
    parsed = parse_literal(raw);
  } catch (const toml::parse_error&) {
    literal = false;
  } catch (const InputError&) {  // non-ASCII outside quotes: never a TOML literal
    literal = false;
  }
  if (!literal) parsed.insert("v", raw);  // a bare string, e.g. --set model.name=qwen2
  toml::table* target = nullptr;
  if (indexed) {
    toml::array* loggers = root["logger"].as_array();
    size_t index = 0;
    try {
      index = std::stoul(parts[1]);
    } catch (const std::exception&) {
      index = SIZE_MAX;
    }
    if (!loggers || index >= loggers->size() || !loggers->get(index)->is_table()) {
      throw InputError(fmt::format("--set {}: the recipe has no [[logger]] number {} (0-based)", argument, parts[1]));
    }
    target = loggers->get(index)->as_table();
  } else {
    if (!root.contains(parts[0])) {  // a section --set makes: its errors name the --set (an unknown section)
      root.insert(parts[0], toml::table{});
      origins.set_override(parts[0], argument);
    }
    target = root[parts[0]].as_table();
    if (!target) throw InputError(fmt::format("--set {}: '{}' is not a table in the recipe", argument, parts[0]));
  }
  const std::string key = parts.back();
  parsed.get("v")->visit([&](const auto& value) { target->insert_or_assign(key, value); });
  origins.set_override(indexed ? parts[0] + "." + parts[1] + "." + key : parts[0] + "." + key, argument);
}

const toml::table& table_or_empty(const toml::table& root, const char* name, const Origins& origins) {
  static const toml::table empty;
  const toml::node* node = root.get(name);
  if (!node) return empty;
  if (!node->is_table()) {
    throw InputError(fmt::format("{}: '{}' must be a table ([{}])", origins.of(name, *node), name, name));
  }
  return *node->as_table();
}

// The plugin a table's `name` key chooses (or `default_name`).
const LoadedPlugin& chosen_plugin(const toml::table& table, const std::string& path, PluginKind kind,
                                  const char* default_name, PluginRegistry& registry, const Origins& origins) {
  std::string name;
  if (const toml::node* node = table.get("name")) {
    if (!node->is_string()) {
      throw InputError(fmt::format("{}: [{}] name = {}: expected a plugin name (a string)",
                                   origins.of(path + ".name", *node), path, show(*node)));
    }
    name = node->as_string()->get();
  } else if (default_name) {
    name = default_name;
  } else {
    throw InputError(fmt::format("{}: [{}] missing required key 'name': expected the {} plugin to use", origins.file(),
                                 path, kind_name(kind)));
  }
  const LoadedPlugin* plugin = nullptr;
  try {
    plugin = &registry.find(kind, name);
  } catch (const InputError& error) {
    const toml::node* node = table.get("name");
    throw InputError(
        fmt::format("{}: [{}] {}", node ? origins.of(path + ".name", *node) : origins.file(), path, error.what()));
  }
  return *plugin;
}

ComponentChoice choose(const toml::table& table, const std::string& path, PluginKind kind, const char* default_name,
                       PluginRegistry& registry, const Origins& origins) {
  const LoadedPlugin& plugin = chosen_plugin(table, path, kind, default_name, registry, origins);
  const PluginDescriptor& d = *plugin.descriptor;
  return ComponentChoice{&plugin, validate(table, path, path, d.keys, d.num_keys, origins, true)};
}

// [optimizer]: the core's keys and the chosen plugin's in one table (recipes
// keep writing lr beside beta1), split again for the plugin.
void choose_optimizer(Recipe& recipe, const toml::table& table, const SectionSpec& core, PluginRegistry& registry,
                      const Origins& origins) {
  // A named path, not a literal: a reference bound to the result of a call
  // with a temporary argument is what GCC 13's -Wdangling-reference flags.
  const std::string path = "optimizer";
  const LoadedPlugin& plugin = chosen_plugin(table, path, PluginKind::Optimizer, "adamw", registry, origins);
  const PluginDescriptor& d = *plugin.descriptor;
  std::vector<KeySpec> keys(core.keys, core.keys + core.num_keys);
  std::vector<std::string> own;
  for (size_t i = 0; i < d.num_keys; ++i) {
    for (size_t k = 0; k < core.num_keys; ++k) {
      if (std::string(d.keys[i].name) == core.keys[k].name) {
        throw InputError(
            fmt::format("{}: optimizer plugin '{}' declares the key '{}', which [optimizer] keeps for "
                        "the core; rename it in the plugin",
                        plugin.file, d.name, d.keys[i].name));
      }
    }
    keys.push_back(d.keys[i]);
    own.push_back(d.keys[i].name);
  }
  recipe.optimizer = validate(table, "optimizer", "optimizer", keys.data(), keys.size(), origins, false);
  std::vector<Options::Entry> entries;
  for (const Options::Entry& e : recipe.optimizer.entries()) {
    if (std::find(own.begin(), own.end(), e.key) != own.end()) entries.push_back(e);
  }
  recipe.optimizer_plugin = ComponentChoice{&plugin, Options("optimizer", origins.file(), std::move(entries))};
}

void insert_options(toml::table& out, const Options& options) {
  for (const Options::Entry& entry : options.entries()) {
    std::visit([&](const auto& value) { out.insert_or_assign(entry.key, value); }, entry.value);
  }
}

toml::table component_table(const ComponentChoice& choice) {
  toml::table out;
  out.insert("name", std::string(choice.plugin->descriptor->name));
  insert_options(out, choice.options);
  return out;
}

}  // namespace

Options plugin_options(const LoadedPlugin& plugin, const std::string& table_text) {
  const toml::table table = parse_toml(table_text, plugin.file);
  const PluginDescriptor& d = *plugin.descriptor;
  return validate(table, d.name, d.name, d.keys, d.num_keys, Origins(plugin.file), false);
}

std::string closest_key(const std::string& key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, key.size() / 3) + 1;
  for (const std::string& candidate : candidates) {
    size_t distance = edit_distance(key, candidate);
    // A key that is a prefix of a valid one ("micro_batch") is a near miss too.
    if (candidate.rfind(key, 0) == 0 || key.rfind(candidate, 0) == 0) distance = std::min<size_t>(distance, 1);
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

namespace {

// A dataset key `tokenizer` left unset takes the model's Hugging Face
// directory when that holds a tokenizer.json: fine-tuning a checkpoint reads
// its text with its own tokenizer unless the recipe says otherwise.
void default_tokenizer_from_model(Recipe& recipe) {
  const auto has = [](const Options& o, const char* key) {
    return std::any_of(o.entries().begin(), o.entries().end(), [&](const Options::Entry& e) { return e.key == key; });
  };
  Options& dataset = recipe.dataset.options;
  const Options& model = recipe.model.options;
  if (!has(dataset, "tokenizer") || dataset.is_set("tokenizer") || !has(model, "hf_dir")) return;
  const std::string& hf_dir = model.text("hf_dir");
  if (hf_dir.empty() || !std::filesystem::is_regular_file(std::filesystem::path(hf_dir) / "tokenizer.json")) return;
  std::vector<Options::Entry> entries = dataset.entries();
  for (Options::Entry& e : entries) {
    if (e.key == "tokenizer") e = Options::Entry{e.key, hf_dir, "model.hf_dir"};
  }
  dataset = Options(dataset.section(), dataset.file(), std::move(entries));
}

}  // namespace

Recipe load_recipe(const std::string& file, const std::vector<std::string>& overrides, PluginRegistry& registry) {
  toml::table root;
  std::error_code kind_error;
  if (!std::filesystem::is_regular_file(file, kind_error)) {
    throw InputError(fmt::format("{}: {}; a recipe is a TOML file", file,
                                 std::filesystem::exists(file, kind_error) ? "not a regular file" : "no such file"));
  }
  try {
    root = parse_toml_file(file, "recipe");
  } catch (const toml::parse_error& error) {
    const auto& begin = error.source().begin;
    if (begin.line == 0) throw InputError(fmt::format("{}: cannot read recipe: {}", file, error.description()));
    throw InputError(
        fmt::format("{}:{}:{}: TOML syntax error: {}", file, begin.line, begin.column, error.description()));
  }
  Origins origins(file);
  for (const std::string& argument : overrides) apply_override(root, argument, origins);

  std::vector<std::string> known;
  for (const SectionSpec& s : core_sections()) known.push_back(s.name);
  for (const char* s : kPluginSections) known.push_back(s);
  for (const auto& [key, node] : root) {
    const std::string name(key.str());
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      throw InputError(
          fmt::format("{}: unknown section [{}]{}", origins.of(name, key.source()), name, suggestion(name, known)));
    }
  }

  Recipe recipe;
  recipe.file = file;
  for (const SectionSpec& s : core_sections()) {
    if (std::string(s.name) == "optimizer") {
      choose_optimizer(recipe, table_or_empty(root, s.name, origins), s, registry, origins);
    } else {
      recipe.*s.options =
          validate(table_or_empty(root, s.name, origins), s.name, s.name, s.keys, s.num_keys, origins, false);
    }
  }
  recipe.model = choose(table_or_empty(root, "model", origins), "model", PluginKind::Model, nullptr, registry, origins);
  recipe.dataset =
      choose(table_or_empty(root, "dataset", origins), "dataset", PluginKind::Dataset, nullptr, registry, origins);
  recipe.strategy =
      choose(table_or_empty(root, "strategy", origins), "strategy", PluginKind::Strategy, "ddp", registry, origins);
  default_tokenizer_from_model(recipe);

  // The recipe's own array, never a copy: toml++ copies a node without its
  // source, and an error in a [[logger]] table names its line.
  toml::array console_only;
  const toml::array* loggers = &console_only;
  if (const toml::node* node = root.get("logger")) {
    if (!node->is_array_of_tables()) {
      throw InputError(
          fmt::format("{}: 'logger' must be an array of tables ([[logger]])", origins.of("logger", *node)));
    }
    loggers = node->as_array();
  } else {
    console_only.push_back(toml::table{{"name", "console"}});
  }
  bool has_jsonl = false;
  for (size_t i = 0; i < loggers->size(); ++i) {
    const toml::table& table = *loggers->get(i)->as_table();
    recipe.loggers.push_back(
        choose(table, fmt::format("logger.{}", i), PluginKind::Logger, nullptr, registry, origins));
    has_jsonl = has_jsonl || std::string(recipe.loggers.back().plugin->descriptor->name) == "jsonl";
  }
  if (!has_jsonl) {  // metrics.jsonl is the run's record: always written
    recipe.loggers.push_back(choose(toml::table{{"name", "jsonl"}}, fmt::format("logger.{}", loggers->size()),
                                    PluginKind::Logger, nullptr, registry, origins));
  }
  return recipe;
}

namespace {

toml::table resolved_table(const Recipe& recipe) {
  toml::table out;
  for (const SectionSpec& s : core_sections()) {
    toml::table section;
    insert_options(section, recipe.*s.options);
    out.insert(s.name, std::move(section));
  }
  out.insert("model", component_table(recipe.model));
  out.insert("dataset", component_table(recipe.dataset));
  out.insert("strategy", component_table(recipe.strategy));
  toml::array logger_array;
  for (const ComponentChoice& logger : recipe.loggers) logger_array.push_back(component_table(logger));
  out.insert("logger", std::move(logger_array));
  return out;
}

// The recipe's tables outside [[logger]]: the core sections, then the
// components' (the optimizer's own keys again, as its plugin sees them).
std::vector<const Options*> tables_of(const Recipe& recipe) {
  std::vector<const Options*> tables;
  for (const SectionSpec& s : core_sections()) tables.push_back(&(recipe.*s.options));
  for (const ComponentChoice* c : {&recipe.model, &recipe.dataset, &recipe.strategy, &recipe.optimizer_plugin}) {
    tables.push_back(&c->options);
  }
  return tables;
}

// `key` of the recipe's table `section` took its default value.
bool took_default(const Recipe& recipe, const std::string& section, const std::string& key) {
  for (const Options* options : tables_of(recipe)) {
    if (options->section() != section) continue;
    for (const Options::Entry& e : options->entries()) {
      if (e.key == key) return e.origin == "default";
    }
  }
  return false;
}

std::string node_text(const toml::node* node) {
  if (!node) return "absent";
  if (const auto* real = node->as_floating_point()) return fmt::format("{}", real->get());  // shortest form
  std::ostringstream text;
  text << toml::node_view<const toml::node>(node);
  return text.str();
}

}  // namespace

std::string Recipe::resolved_toml() const {
  std::ostringstream text;
  text << kResolvedHeader << "\n" << resolved_table(*this) << "\n";
  return text.str();
}

std::string Recipe::result_difference(const std::string& earlier) const {
  toml::table there;
  try {
    there = toml::parse(earlier);
  } catch (const toml::parse_error& error) {
    return fmt::format("not TOML ({})", error.description());
  }
  const toml::table here = resolved_table(*this);
  // Where the outputs go, what is logged, checkpointed and profiled, how
  // MFU is reported and how long a collective may wait: none changes the
  // weights or the losses.
  const auto ignored = [](const std::string& section, const std::string& key) {
    static const std::pair<const char*, const char*> kIgnored[] = {
        {"run", "name"},          {"run", "output_dir"},  {"run", "overwrite"},        {"run", "profile_start"},
        {"run", "profile_steps"}, {"run", "peak_tflops"}, {"run", "datasheet_tflops"}, {"distributed", "timeout_s"}};
    if (section == "logger" || section == "checkpoint") return true;
    return std::any_of(std::begin(kIgnored), std::end(kIgnored),
                       [&](const auto& k) { return section == k.first && key == k.second; });
  };
  std::vector<std::string> sections;
  for (const toml::table* table : std::initializer_list<const toml::table*>{&here, &there}) {
    for (const auto& [name, node] : *table) {
      if (std::find(sections.begin(), sections.end(), name.str()) == sections.end()) sections.emplace_back(name.str());
    }
  }
  for (const std::string& section : sections) {
    if (ignored(section, "")) continue;
    const toml::table* a = there[section].as_table();
    const toml::table* b = here[section].as_table();
    if (!a || !b) {
      return fmt::format("[{}]: {} there, {} here", section, a ? "a table" : node_text(there.get(section)),
                         b ? "a table" : node_text(here.get(section)));
    }
    std::vector<std::string> keys;
    for (const toml::table* table : std::initializer_list<const toml::table*>{b, a}) {
      for (const auto& [key, node] : *table) {
        if (std::find(keys.begin(), keys.end(), key.str()) == keys.end()) keys.emplace_back(key.str());
      }
    }
    for (const std::string& key : keys) {
      if (ignored(section, key)) continue;
      // A key added since the earlier run's version, at its default here
      // (which keeps the earlier behaviour), is no difference.
      if (!a->get(key) && took_default(*this, section, key)) continue;
      const std::string was = node_text(a->get(key));
      const std::string is = node_text(b->get(key));
      if (was != is) return fmt::format("[{}] {}: {} there, {} here", section, key, was, is);
    }
  }
  return "";
}

namespace {

// The string keys outside [[logger]] whose value names an existing path
// that `wanted` accepts, as ("[section] key", path).
std::vector<std::pair<std::string, std::string>> keys_naming(
    const Recipe& recipe,
    const std::function<bool(const Options&, const Options::Entry&, const std::string&)>& wanted) {
  std::vector<std::pair<std::string, std::string>> named;
  for (const Options* options : tables_of(recipe)) {
    for (const Options::Entry& e : options->entries()) {
      const auto* text = std::get_if<std::string>(&e.value);
      if (text && !text->empty() && wanted(*options, e, *text)) {
        named.emplace_back(fmt::format("[{}] {}", options->section(), e.key), *text);
      }
    }
  }
  return named;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> Recipe::input_files() const {
  std::vector<std::pair<std::string, std::string>> inputs{{"the recipe", file}};
  for (auto& named : keys_naming(*this, [](const Options&, const Options::Entry&, const std::string& path) {
         std::error_code error;
         return std::filesystem::is_regular_file(path, error);
       })) {
    inputs.push_back(std::move(named));
  }
  return inputs;
}

std::vector<std::pair<std::string, std::string>> Recipe::input_directories() const {
  return keys_naming(*this, [this](const Options& options, const Options::Entry& e, const std::string& path) {
    // Not paths: [run]'s keys (output_dir is where the run writes; a run
    // named as its output directory is not reading it), the plugin choices
    // (`name = "qwen2"` beside a directory qwen2), defaults.
    if (&options == &run || e.key == "name" || e.origin == "default") return false;
    if (&options == &checkpoint && e.key == "dir") return false;
    std::error_code error;
    return std::filesystem::is_directory(path, error);
  });
}

std::string Recipe::fingerprint(int64_t global_batch_size) const {
  toml::table out;
  out.insert("model", component_table(model));
  out.insert("dataset", component_table(dataset));
  // Optimizer keys added since checkpoints carried a fingerprint, at the
  // value that keeps the earlier behaviour, are left out: a checkpoint of
  // before them still resumes (its fingerprint never saw them).
  static const std::pair<const char*, const char*> kAddedKeys[] = {{"state_dtype", "fp32"}};
  std::vector<Options::Entry> kept;
  for (const Options::Entry& e : optimizer.entries()) {
    const bool neutral = std::any_of(std::begin(kAddedKeys), std::end(kAddedKeys), [&](const auto& added) {
      const auto* text = std::get_if<std::string>(&e.value);
      return e.key == added.first && text && *text == added.second;
    });
    if (!neutral) kept.push_back(e);
  }
  toml::table optimizer_table;
  insert_options(optimizer_table, Options(optimizer.section(), optimizer.file(), std::move(kept)));
  out.insert("optimizer", std::move(optimizer_table));
  out.insert("global_batch_size", global_batch_size);
  std::ostringstream text;
  text << out;
  return fmt::format("{:016x}", fnv1a(text.str()));
}

BatchShape batch_shape(const Recipe& recipe, int world_size) {
  BatchShape shape;
  shape.world_size = world_size;
  shape.micro_batch_size = recipe.training.integer("micro_batch_size");
  shape.grad_accum_steps = recipe.training.integer("grad_accum_steps");
  const int64_t atom = recipe.training.integer("reproducible_atom");
  if (recipe.training.boolean("reproducible") && shape.micro_batch_size % atom != 0) {
    // Atoms are aligned blocks of global positions only when they tile every micro-batch.
    recipe.training.fail("reproducible_atom", fmt::format("a divisor of training.micro_batch_size = {}, got {}",
                                                          shape.micro_batch_size, atom));
  }
  const int64_t global = recipe.training.integer("global_batch_size");
  if (global == 0) return shape;
  const int64_t per_accum = shape.micro_batch_size * world_size;
  if (global % per_accum != 0) {
    recipe.training.fail("global_batch_size",
                         fmt::format("a multiple of micro_batch_size x world size = {}, got {}", per_accum, global));
  }
  const int64_t accum = global / per_accum;
  bool accum_given = false;
  for (const Options::Entry& entry : recipe.training.entries()) {
    accum_given = accum_given || (entry.key == "grad_accum_steps" && entry.origin != "default");
  }
  if (accum_given && accum != shape.grad_accum_steps) {
    recipe.training.fail("grad_accum_steps",
                         fmt::format("{} (global_batch_size {} / (micro_batch_size {} x world size {})), got {}", accum,
                                     global, shape.micro_batch_size, world_size, shape.grad_accum_steps));
  }
  shape.grad_accum_steps = accum;
  return shape;
}

void check_backend(const Recipe& recipe, PluginRegistry& registry, int world_size) {
  if (world_size <= 1) return;
  try {  // any comm plugin, found as the others are; it takes no keys
    (void)registry.find(PluginKind::Comm, recipe.distributed.text("backend"));
  } catch (const InputError& error) {
    recipe.distributed.fail("backend", fmt::format("a comm plugin for world size {}: {}", world_size, error.what()));
  }
}

}  // namespace trainer
