// Logger `console`: one progress line every `interval` steps on stdout:
// step/total, loss, lr, gradient norm, tokens/s, MFU, memory, ETA.
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "trainer/Logger.h"

namespace {

using namespace trainer;

std::string clock_text(double seconds) {
  const auto total = static_cast<long long>(seconds + 0.5);
  return fmt::format("{}:{:02}:{:02}", total / 3600, (total / 60) % 60, total % 60);
}

class ConsoleLogger final : public Logger {
 public:
  explicit ConsoleLogger(const Options& options) : interval_(options.integer("interval")) {}

  void start(const RunInfo& info) override {
    total_steps_ = info.total_steps;
    first_step_ = info.first_step;
  }

  void log(const StepRecord& r) override {
    window_tokens_ += r.input_tokens;
    window_seconds_ += r.step_seconds;
    if (r.step % interval_ != 0 && r.step != first_step_ + 1 && r.step != total_steps_) return;
    const double tokens_per_second = window_seconds_ > 0 ? window_tokens_ / window_seconds_ : 0.0;
    const int64_t done = r.step - first_step_;
    const double eta = done > 0 ? r.elapsed_seconds / done * (total_steps_ - r.step) : 0.0;
    // MFU over the same window as tokens/s: the record's MFU scaled by the window's speed.
    const std::string mfu = std::isfinite(r.mfu) && r.tokens_per_second > 0
                                ? fmt::format(" | MFU {:.1f}%", 100.0 * r.mfu * tokens_per_second / r.tokens_per_second)
                                : "";
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    const std::string memory =
        r.memory_reserved_bytes >= 0
            ? fmt::format(" | mem {:.1f}/{:.1f} GiB", r.memory_allocated_bytes / kGiB, r.memory_reserved_bytes / kGiB)
        : r.rss_bytes >= 0 ? fmt::format(" | rss {:.2f} GiB", r.rss_bytes / kGiB)
                           : "";
    fmt::print("step {}/{} | loss {:.4f} | lr {:.2e} | grad {:.3f} | {:.1f}k tok/s{}{} | ETA {}{}\n", r.step,
               total_steps_, r.loss, r.lr, r.grad_norm, tokens_per_second / 1000.0, mfu, memory, clock_text(eta),
               r.skipped ? " | skipped" : "");
    std::fflush(stdout);
    window_tokens_ = 0;
    window_seconds_ = 0.0;
  }

  void finish() override { std::fflush(stdout); }

 private:
  int64_t interval_;
  int64_t total_steps_ = 0;
  int64_t first_step_ = 0;
  double window_tokens_ = 0;
  double window_seconds_ = 0.0;
};

constexpr KeySpec kKeys[] = {
    {"interval", ValueType::Int, "10", "print every this many optimizer steps (and the first and last)", 1, 1e12},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Logger, ConsoleLogger, "console", "0.1.0", "progress line on stdout", kKeys)
