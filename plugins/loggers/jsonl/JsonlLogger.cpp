// Logger `jsonl`: one JSON object per optimizer step, flushed per line so a
// crash leaves only whole records. Doubles are written in nlohmann-json's
// shortest form that reads back to the same double, so two runs compare bit
// for bit from their files; unknown figures are null.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "trainer/Errors.h"
#include "trainer/JsonSupport.h"
#include "trainer/Log.h"
#include "trainer/Logger.h"

namespace {

using namespace trainer;


class JsonlLogger final : public Logger {
 public:
  JsonlLogger(const Options& options, const Context& context) {
    path_ = std::filesystem::path(options.text("path"));
    if (path_.is_relative()) path_ = std::filesystem::path(context.output_dir) / path_;
  }

  void start(const RunInfo& info) override {
    if (info.first_step == 0 && std::filesystem::exists(path_)) {
      log::warn(fmt::format("{}: replacing the metrics of an earlier run", path_.string()));
    }
    if (info.first_step > 0) keep_until(info.first_step);
    out_.open(path_, info.first_step == 0 ? std::ios::trunc : std::ios::app);
    if (!out_) throw InputError(fmt::format("{}: cannot open for writing", path_.string()));
  }

  void log(const StepRecord& r) override {
    Json record;
    for (const MetricField& f : metric_fields(r)) {
      Json& value = record[f.name];
      if (!std::isfinite(f.value)) value = nullptr;
      else if (f.kind == MetricField::Kind::Bool) value = f.value != 0;
      else if (f.kind == MetricField::Kind::Integer) value = static_cast<int64_t>(f.value);
      else value = f.value;
    }
    out_ << record.dump() << "\n";
    out_.flush();
    if (!out_) throw TrainingError(fmt::format("{}: write failed", path_.string()));
  }

  void finish() override {
    if (out_.is_open()) out_.flush();
  }

 private:
  // A resumed run continues the file: records past the checkpoint's step
  // (written before a crash) are dropped so every step appears once.
  void keep_until(int64_t last_step) {
    keep_steps_until(path_.string(), last_step, "", [](const std::string& line) -> std::optional<int64_t> {
      try {
        const Json record = json_parse(line);
        const Json* step = json_find(record, "step");
        if (step && json_is_int64(*step)) return step->get<int64_t>();
      } catch (const std::exception&) {
        // a torn last line of a crashed run
      }
      return std::nullopt;
    });
  }

  std::filesystem::path path_;
  std::ofstream out_;
};

constexpr KeySpec kKeys[] = {
    {"path", ValueType::String, "'metrics.jsonl'", "output file, relative to the run's output directory"},
};

Component* create(const Options& options, const Context& context) { return new JsonlLogger(options, context); }

const PluginDescriptor* describe() {
  static const PluginDescriptor descriptor{kAbiVersion, PluginKind::Logger, "jsonl", "0.1.0",
                                           "one JSON record per optimizer step", TRAINER_TORCH_VERSION,
                                           kKeys, std::size(kKeys), &create};
  return &descriptor;
}

}  // namespace

TRAINER_PLUGIN(describe)
