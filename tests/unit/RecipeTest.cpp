// Recipe parsing and validation: every bad input is an InputError naming the
// file, the line or --set, the key and what was expected.
#include "recipe/Recipe.h"

#include "run/RunConfig.h"

#include <gtest/gtest.h>

#include "TestSupport.h"

namespace trainer {
namespace {

constexpr const char* kMinimal = R"([model]
name = "qwen2"

[dataset]
name = "synthetic"
)";

class RecipeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.discover({TRAINER_PLUGIN_DIR});
    dir_ = scratch_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }

  std::string recipe_file(const std::string& text) { return write_file(dir_ + "/recipe.toml", text); }

  Recipe load(const std::string& text, const std::vector<std::string>& overrides = {}) {
    return load_recipe(recipe_file(text), overrides, registry_);
  }

  // The message of the InputError that loading throws.
  std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
    try {
      load(text, overrides);
    } catch (const InputError& error) {
      return error.what();
    }
    ADD_FAILURE() << "no InputError for:\n" << text;
    return "";
  }

  PluginRegistry registry_;
  std::string dir_;
};

TEST_F(RecipeTest, DefaultsFillEveryDeclaredKey) {
  const Recipe recipe = load(kMinimal);
  EXPECT_EQ(recipe.training.integer("micro_batch_size"), 8);
  EXPECT_EQ(recipe.training.text("precision"), "fp32");
  EXPECT_EQ(recipe.model.options.integer("hidden_size"), 64);
  EXPECT_EQ(std::string(recipe.strategy.plugin->descriptor->name), "ddp");
  // Without [[logger]]: console, plus the jsonl logger that writes metrics.jsonl.
  ASSERT_EQ(recipe.loggers.size(), 2u);
  EXPECT_EQ(std::string(recipe.loggers[1].plugin->descriptor->name), "jsonl");
  EXPECT_EQ(recipe.loggers[1].options.text("path"), "metrics.jsonl");
}

TEST_F(RecipeTest, ResolvedRecipeLoadsBackToItself) {
  const Recipe recipe = load(std::string(kMinimal) + "[training]\nsteps = 7\n", {"optimizer.lr=0.25"});
  const std::string resolved = recipe.resolved_toml();
  const Recipe again = load(resolved);
  EXPECT_EQ(again.resolved_toml(), resolved);
  EXPECT_EQ(again.training.integer("steps"), 7);
  EXPECT_EQ(again.optimizer.real("lr"), 0.25);
}

TEST_F(RecipeTest, SyntaxErrorNamesLineAndColumn) {
  const std::string message = error_of("[training]\nsteps = = 3\n");
  EXPECT_NE(message.find("recipe.toml:2:"), std::string::npos) << message;
  EXPECT_NE(message.find("TOML syntax error"), std::string::npos) << message;
  // Found by the recipe fuzz target: a table header that starts with a
  // control character (TOML++ asserts on it in builds with assertions).
  const std::string nul = error_of(std::string("[\0me = 1]\n", 10));
  EXPECT_NE(nul.find("recipe.toml:1:2: TOML syntax error"), std::string::npos) << nul;
  // Found by it too: a non-ASCII character outside strings and comments,
  // which TOML++ 3.3 classifies with undefined behaviour, is refused first;
  // inside strings and comments it is fine.
  const std::string bare = error_of("[run]\nname = \"x\" \xC3\xA9\n");
  EXPECT_NE(bare.find("recipe.toml:2:12: a non-ASCII character outside a string or comment"), std::string::npos)
      << bare;
  EXPECT_NE(error_of("\xEF\xBB\xAF = 1\n").find("recipe.toml:1:1: a non-ASCII"), std::string::npos);
  const std::string minimal = "[model]\nname = 'qwen2'\n[dataset]\nname = 'synthetic'\n";
  const Recipe fine = load(minimal + "[run]\nname = \"caf\xC3\xA9\"  # \xC3\xA9t\xC3\xA9\n", {"run.seed=3"});
  EXPECT_EQ(fine.run.text("name"), "caf\xC3\xA9");
  EXPECT_EQ(load(minimal, {"run.name=caf\xC3\xA9"}).run.text("name"), "caf\xC3\xA9")
      << "a bare --set string may be any text";
}

TEST_F(RecipeTest, UnknownKeySuggestsTheClosest) {
  const std::string message = error_of(std::string(kMinimal) + "[training]\nmicro_batch = 4\n");
  EXPECT_NE(message.find("recipe.toml:7:1: [training] unknown key 'micro_batch'"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean 'micro_batch_size'?"), std::string::npos) << message;
}

// [optimizer] holds the core's keys (name, lr) and the chosen optimizer
// plugin's; the plugin is created with its own keys only, and a key of
// another optimizer is refused by name.
TEST_F(RecipeTest, OptimizerSectionTakesThePluginsKeys) {
  const Recipe muon = load(std::string(kMinimal) + "[optimizer]\nname = 'muon'\nlr = 0.02\nmomentum = 0.9\n");
  EXPECT_EQ(std::string(muon.optimizer_plugin.plugin->descriptor->name), "muon");
  EXPECT_EQ(muon.optimizer.real("lr"), 0.02);
  EXPECT_EQ(muon.optimizer_plugin.options.real("momentum"), 0.9);
  EXPECT_EQ(muon.optimizer_plugin.options.real("beta2"), 0.999);  // AdamW's half
  for (const Options::Entry& e : muon.optimizer_plugin.options.entries()) EXPECT_NE(e.key, "lr");
  const std::string message = error_of(std::string(kMinimal) + "[optimizer]\nmomentum = 0.9\n");
  EXPECT_NE(message.find("[optimizer] unknown key 'momentum'"), std::string::npos) << message;
  const std::string unknown = error_of(std::string(kMinimal) + "[optimizer]\nname = 'adam'\n");
  EXPECT_NE(unknown.find("adamw"), std::string::npos) << unknown;
  // The default optimizer's fingerprint is the one checkpoints of before
  // optimizer plugins carry: bf16 state changes it, fp32 (the default) does not.
  const Recipe plain = load(kMinimal);
  EXPECT_EQ(load(kMinimal, {"optimizer.state_dtype='fp32'"}).fingerprint(8), plain.fingerprint(8));
  EXPECT_NE(load(kMinimal, {"optimizer.state_dtype='bf16'"}).fingerprint(8), plain.fingerprint(8));
  EXPECT_NE(load(kMinimal, {"optimizer.name=lion"}).fingerprint(8), plain.fingerprint(8));
}

TEST_F(RecipeTest, UnknownPluginKeySuggestsTheClosest) {
  const std::string message = error_of("[model]\nname = \"qwen2\"\nhiden_size = 8\n[dataset]\nname = \"synthetic\"\n");
  EXPECT_NE(message.find("[model] unknown key 'hiden_size' (did you mean 'hidden_size'?)"), std::string::npos)
      << message;
}

TEST_F(RecipeTest, UnknownSectionSuggestsTheClosest) {
  const std::string message = error_of(std::string(kMinimal) + "[trainig]\nsteps = 3\n");
  EXPECT_NE(message.find("unknown section [trainig] (did you mean 'training'?)"), std::string::npos) << message;
  EXPECT_NE(message.find("recipe.toml:6:2: "), std::string::npos) << message;
  // A section only --set names is named by the --set (it read "recipe.toml:0:0").
  const std::string set = error_of(kMinimal, {"trainig.steps=3"});
  EXPECT_EQ(set.rfind("--set trainig.steps=3: unknown section [trainig] (did you mean 'training'?)", 0), 0u) << set;
}

TEST_F(RecipeTest, WrongTypeNamesKeyValueAndExpectation) {
  const std::string message = error_of(std::string(kMinimal) + "[training]\nsteps = \"ten\"\n");
  EXPECT_NE(message.find("recipe.toml:7:9: [training] steps = 'ten': expected an integer"), std::string::npos)
      << message;
}

TEST_F(RecipeTest, OutOfRangeNamesTheRange) {
  const std::string message = error_of(std::string(kMinimal) + "[training]\nmicro_batch_size = 0\n");
  EXPECT_NE(message.find("[training] micro_batch_size = 0: expected an integer in [1, "), std::string::npos) << message;
}

TEST_F(RecipeTest, ChoiceListsTheAllowedValues) {
  const std::string message = error_of(std::string(kMinimal) + "[lr_schedule]\nname = \"step\"\n");
  EXPECT_NE(message.find("[lr_schedule] name = 'step': expected one of constant|linear|cosine"), std::string::npos)
      << message;
}

// A [[logger]] table's errors name their line like any section's (the
// array was once copied, and toml++ copies a node without its source: 0:0).
TEST_F(RecipeTest, LoggerErrorsNameTheirLine) {
  const std::string logger = std::string(kMinimal) + "[[logger]]\nname = 'console'\n";
  const std::string range = error_of(logger + "interval = 0\n");
  EXPECT_NE(range.find("recipe.toml:8:12: [logger.0] interval = 0: expected an integer in [1, "), std::string::npos)
      << range;
  const std::string unknown = error_of(logger + "[[logger]]\nname = 'csv'\nintervl = 3\n");
  EXPECT_NE(unknown.find("recipe.toml:10:1: [logger.1] unknown key 'intervl'"), std::string::npos) << unknown;
  const std::string plugin = error_of(logger + "[[logger]]\nname = 'consol'\n");
  EXPECT_NE(plugin.find("recipe.toml:9:8"), std::string::npos) << plugin;
}

TEST_F(RecipeTest, UnknownPluginListsTheAvailableOnes) {
  const std::string message = error_of(std::string(kMinimal) + "[strategy]\nname = \"zero9\"\n");
  EXPECT_NE(message.find("unknown strategy plugin 'zero9'; available: ddp"), std::string::npos) << message;
  EXPECT_NE(message.find("recipe.toml:7:8"), std::string::npos) << message;
}

// distributed.backend takes any comm plugin (a third party's too), checked
// when the recipe loads rather than when the workers connect.
TEST_F(RecipeTest, BackendIsAnyCommPluginWhenTheWorldHasMoreThanOneRank) {
  const Recipe mpi = load(std::string(kMinimal) + "[distributed]\nbackend = \"mpi\"\n");
  EXPECT_NO_THROW(check_backend(mpi, registry_, 1));  // one process connects to no one
  std::string message;
  try {
    check_backend(mpi, registry_, 2);
  } catch (const InputError& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("recipe.toml:7:11: [distributed] backend"), std::string::npos) << message;
  EXPECT_NE(message.find("world size 2: unknown comm plugin 'mpi'; available: "), std::string::npos) << message;
  // Whatever this build has is accepted, by name and by path.
  int comms = 0;
  for (const LoadedPlugin& plugin : registry_.plugins()) {
    if (plugin.descriptor->kind != PluginKind::Comm) continue;
    ++comms;
    const std::string name = plugin.descriptor->name;
    EXPECT_NO_THROW(check_backend(load(kMinimal, {"distributed.backend=" + name}), registry_, 4)) << name;
    EXPECT_NO_THROW(check_backend(load(kMinimal, {"distributed.backend=" + plugin.file}), registry_, 4)) << name;
  }
  EXPECT_GT(comms, 0);
}

TEST_F(RecipeTest, MissingModelIsNamed) {
  const std::string message = error_of("[dataset]\nname = \"synthetic\"\n");
  EXPECT_NE(message.find("[model] missing required key 'name'"), std::string::npos) << message;
}

TEST_F(RecipeTest, OverridesWinAndErrorsNameThem) {
  EXPECT_EQ(load(kMinimal, {"training.steps=5"}).training.integer("steps"), 5);
  EXPECT_EQ(load(kMinimal, {"run.name=bare-string"}).run.text("name"), "bare-string");
  const Recipe with_logger = load(std::string(kMinimal) + "[[logger]]\nname = 'console'\n", {"logger.0.interval=3"});
  EXPECT_EQ(with_logger.loggers[0].options.integer("interval"), 3);
  EXPECT_NE(error_of(kMinimal, {"logger.0.interval=3"}).find("the recipe has no [[logger]] number 0"),
            std::string::npos);
  const std::string message = error_of(kMinimal, {"training.steps=0"});
  EXPECT_NE(message.find("--set training.steps=0: [training] steps = 0"), std::string::npos) << message;
  EXPECT_NE(error_of(kMinimal, {"steps=3"}).find("expected section.key=value"), std::string::npos);
}

TEST_F(RecipeTest, GlobalBatchSizeDerivesAccumulation) {
  const Recipe recipe = load(std::string(kMinimal) + "[training]\nmicro_batch_size = 2\nglobal_batch_size = 8\n");
  EXPECT_EQ(batch_shape(recipe, 1).grad_accum_steps, 4);
  EXPECT_EQ(batch_shape(recipe, 2).grad_accum_steps, 2);
  EXPECT_THROW(batch_shape(recipe, 3), InputError);
  const Recipe clash =
      load(std::string(kMinimal) + "[training]\nmicro_batch_size = 2\ngrad_accum_steps = 3\nglobal_batch_size = 8\n");
  EXPECT_THROW(batch_shape(clash, 1), InputError);
}

// training.gemm_library reaches the run's settings: cuBLASLt's GEMMs timed
// by default, untimed or LibTorch's where named; other values refused.
TEST_F(RecipeTest, GemmLibraryChoosesTheGemmsAndTheirTiming) {
  const std::string bf16 = std::string(kMinimal) + "[training]\nprecision = \"bf16\"\n";
  const RunConfig plain = run_config(load(bf16), 1);
  EXPECT_TRUE(plain.lt_gemms);
  EXPECT_TRUE(plain.lt_gemm_timing);
  const RunConfig untimed = run_config(load(bf16, {"training.gemm_library=cublaslt"}), 1);
  EXPECT_TRUE(untimed.lt_gemms);
  EXPECT_FALSE(untimed.lt_gemm_timing);
  const RunConfig libtorch = run_config(load(bf16, {"training.gemm_library=libtorch"}), 1);
  EXPECT_FALSE(libtorch.lt_gemms);
  EXPECT_FALSE(libtorch.lt_gemm_timing);
  const std::string error = error_of(bf16, {"training.gemm_library=cublas"});
  EXPECT_NE(error.find("gemm_library"), std::string::npos) << error;
  EXPECT_NE(error.find("cublaslt-timed"), std::string::npos) << error;
}

TEST(ClosestKey, FindsNearMissesOnly) {
  const std::vector<std::string> keys = {"micro_batch_size", "grad_accum_steps", "steps"};
  EXPECT_EQ(closest_key("stpes", keys), "steps");
  EXPECT_EQ(closest_key("micro_batch", keys), "micro_batch_size");
  EXPECT_EQ(closest_key("learning_rate", keys), "");
}

}  // namespace
}  // namespace trainer
