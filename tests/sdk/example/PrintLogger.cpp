// Logger `print`: the README's example plugin, built out of tree against the
// installed SDK. Prints "print: step N loss L" every `every` steps.
#include <cstdio>

#include "trainer/Logger.h"

namespace {

using namespace trainer;

class PrintLogger final : public Logger {
 public:
  explicit PrintLogger(const Options& options) : every_(options.integer("every")) {}
  void start(const RunInfo&) override {}
  void log(const StepRecord& r) override {
    if (r.step % every_ == 0) std::printf("print: step %lld loss %.4f\n", static_cast<long long>(r.step), r.loss);
  }
  void finish() override { std::fflush(stdout); }

 private:
  int64_t every_;
};

constexpr KeySpec kKeys[] = {{"every", ValueType::Int, "1", "print every this many steps", 1, 1e9}};

}  // namespace

TRAINER_DEFINE_PLUGIN(Logger, PrintLogger, "print", "1.0", "prints the loss", kKeys)
