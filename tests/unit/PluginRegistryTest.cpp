// Plugin discovery and the loader's checks, one error message per failure.
#include "plugin/PluginRegistry.h"

#include <gtest/gtest.h>

#include <set>

#include "TestSupport.h"

namespace trainer {
namespace {

std::string fixture(const std::string& dir) { return std::string(TRAINER_FIXTURE_DIR) + "/" + dir; }

std::string load_error(const std::vector<std::string>& dirs) {
  PluginRegistry registry;
  try {
    registry.discover(dirs);
  } catch (const InputError& error) {
    return error.what();
  }
  return "";
}

TEST(PluginRegistry, DiscoversTheBuiltPlugins) {
  PluginRegistry registry;
  registry.discover({TRAINER_PLUGIN_DIR});
  std::set<std::string> found;
  for (const LoadedPlugin& plugin : registry.plugins()) {
    found.insert(std::string(kind_name(plugin.descriptor->kind)) + "/" + plugin.descriptor->name);
  }
  for (const char* expected : {"strategy/ddp", "model/qwen2", "dataset/synthetic", "logger/console", "logger/jsonl"}) {
    EXPECT_TRUE(found.count(expected)) << expected;
  }
}

TEST(PluginRegistry, SameDirectoryTwiceIsNotADuplicate) {
  PluginRegistry once, twice;
  once.discover({TRAINER_PLUGIN_DIR});
  twice.discover({TRAINER_PLUGIN_DIR, TRAINER_PLUGIN_DIR});
  EXPECT_EQ(once.plugins().size(), twice.plugins().size());
}

TEST(PluginRegistry, OtherAbiVersionSaysWhichAndWhatIsNeeded) {
  const std::string message = load_error({fixture("bad-abi")});
  EXPECT_NE(message.find("trainer-fixture-badabi.so: plugin ABI version 999 does not match this trainer's ABI "
                         "version " +
                         std::to_string(kAbiVersion)),
            std::string::npos)
      << message;
}

TEST(PluginRegistry, OtherTorchVersionIsNamed) {
  const std::string message = load_error({fixture("wrong-torch")});
  EXPECT_NE(message.find("plugin was built against LibTorch 0.0.1, this trainer uses LibTorch " TORCH_VERSION),
            std::string::npos)
      << message;
}

TEST(PluginRegistry, LibraryWithoutEntryPointIsNotAPlugin) {
  const std::string message = load_error({fixture("not-a-plugin")});
  EXPECT_NE(message.find("trainer-fixture-not-a-plugin.so: not a trainer plugin"), std::string::npos) << message;
}

TEST(PluginRegistry, DuplicateNameNamesBothFiles) {
  const std::string message = load_error({TRAINER_PLUGIN_DIR, fixture("duplicate")});
  EXPECT_NE(message.find("two logger plugins are named 'console'"), std::string::npos) << message;
  EXPECT_NE(message.find("trainer-logger-console.so"), std::string::npos) << message;
  EXPECT_NE(message.find("trainer-fixture-console.so"), std::string::npos) << message;
}

TEST(PluginRegistry, FindsByPathAndChecksTheKind) {
  PluginRegistry registry;
  const std::string console = std::string(TRAINER_PLUGIN_DIR) + "/trainer-logger-console.so";
  EXPECT_EQ(std::string(registry.find(PluginKind::Logger, console).descriptor->name), "console");
  try {
    registry.find(PluginKind::Model, console);
    FAIL() << "a logger accepted as a model";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("is a logger plugin, expected a model plugin"), std::string::npos);
  }
  EXPECT_THROW(registry.find(PluginKind::Model, "/nonexistent/trainer-model-x.so"), InputError);
}

TEST(PluginRegistry, UnknownNameListsTheKind) {
  PluginRegistry registry;
  registry.discover({TRAINER_PLUGIN_DIR});
  try {
    registry.find(PluginKind::Logger, "tensorbored");
    FAIL();
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("unknown logger plugin 'tensorbored'; available: console, csv, jsonl"),
              std::string::npos)
        << error.what();
  }
}

TEST(PluginRegistry, SearchPathOrder) {
  setenv("TRAINER_PLUGIN_PATH", "/a:/b", 1);
  const std::vector<std::string> path = plugin_search_path({"/first"});
  unsetenv("TRAINER_PLUGIN_PATH");
  ASSERT_EQ(path.size(), 4u);
  EXPECT_EQ(path[0], "/first");
  EXPECT_EQ(path[1], "/a");
  EXPECT_EQ(path[2], "/b");
  EXPECT_NE(path[3].find("lib/trainer/plugins"), std::string::npos);
}

}  // namespace
}  // namespace trainer
