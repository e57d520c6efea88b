// Logger `@NAME@`: prints "@NAME@: step N loss L" every `every` optimizer
// steps. A logger sees rank 0's records only, after each step's metrics
// (loss, gradient norm, learning rate, tokens, timings) are final.
#include <cstdio>
#include <iterator>

#include "trainer/Logger.h"

namespace {

using namespace trainer;

class @CLASS@ final : public Logger {
 public:
  explicit @CLASS@(const Options& options) : every_(options.integer("every")) {}

  void start(const RunInfo&) override {}

  void log(const StepRecord& record) override {
    if (record.step % every_ != 0) return;
    std::printf("@NAME@: step %lld loss %.4f\n", static_cast<long long>(record.step), record.loss);
  }

  void finish() override { std::fflush(stdout); }

 private:
  int64_t every_;
};

// Each key: name, type, default (a TOML literal; nullptr: required), help,
// and for numbers the allowed range.
constexpr KeySpec kKeys[] = {{"every", ValueType::Int, "1", "print every this many steps", 1, 1e9}};

}  // namespace

TRAINER_DEFINE_PLUGIN(Logger, @CLASS@, "@NAME@", "0.1.0", "prints the loss every few steps", kKeys)
