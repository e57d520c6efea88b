// Logger `jsonl`: one JSON object per optimizer step, flushed per line so a
// crash leaves only whole records. Doubles are written in nlohmann-json's
// shortest form that reads back to the same double, so two runs compare bit
// for bit from their files; unknown figures are null.
#include <cmath>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "trainer/Log.h"
#include "trainer/Logger.h"
#include "trainer/util/JsonSupport.h"
#include "trainer/util/StepFile.h"

namespace {

using namespace trainer;

// A record's "step"; a torn last line of a crashed run has none.
std::optional<int64_t> step_of_record(const std::string& line) {
  try {
    const Json record = json_parse(line);
    const Json* step = json_find(record, "step");
    if (step && json_is_int64(*step)) return step->get<int64_t>();
  } catch (const std::exception&) {
    // a torn last line
  }
  return std::nullopt;
}

class JsonlLogger final : public Logger {
 public:
  JsonlLogger(const Options& options, const Context& context) : path_(claim_run_path(options, "path", context)) {}

  // A resumed run continues the file: records past the checkpoint's step
  // (written before a crash) are dropped so every step appears once.
  void start(const RunInfo& info) override {
    if (info.first_step == 0 && std::filesystem::exists(path_)) {
      log::warn(fmt::format("{}: replacing the metrics of an earlier run", path_.string()));
    }
    file_.open_lines(path_, info.first_step, "", step_of_record);
  }

  void log(const StepRecord& r) override {
    Json record;
    for (const MetricField& f : metric_fields(r)) {
      Json& value = record[f.name];
      if (!std::isfinite(f.value))
        value = nullptr;
      else if (f.kind == MetricField::Kind::Bool)
        value = f.value != 0;
      else if (f.kind == MetricField::Kind::Integer)
        value = static_cast<int64_t>(f.value);
      else
        value = f.value;
    }
    file_.write(record.dump() + "\n");
  }

  void finish() override { file_.finish(); }

 private:
  std::filesystem::path path_;
  StepFile file_;
};

constexpr KeySpec kKeys[] = {
    {"path", ValueType::String, "'metrics.jsonl'", "output file, relative to the run's output directory"},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Logger, JsonlLogger, "jsonl", "0.1.0", "one JSON record per optimizer step", kKeys)
