// Key functions of the SDK's interfaces: defining them here makes
// libtrainer_core.so the one home of their vtables and typeinfo.
#include <cmath>
#include <fstream>
#include <limits>

#include "Files.h"

#include "trainer/Comm.h"
#include "trainer/Dataset.h"
#include "trainer/Errors.h"
#include "trainer/Logger.h"
#include "trainer/Model.h"
#include "trainer/Strategy.h"

namespace trainer {

Model::~Model() = default;
torch::Tensor Model::logits(const torch::Tensor&) { throw InputError("this model plugin does not provide logits()"); }
UnitHooks::~UnitHooks() = default;
Dataset::~Dataset() = default;
Logger::~Logger() = default;

void keep_steps_until(const std::string& path, int64_t last_step, const std::string& prefix,
                      const std::function<std::optional<int64_t>(const std::string& line)>& step_of) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept = prefix, line;
  while (std::getline(in, line)) {
    const std::optional<int64_t> step = step_of(line);
    if (step && *step <= last_step) kept += line + "\n";
  }
  write_file_atomically(path, kept);
}

std::vector<MetricField> metric_fields(const StepRecord& r) {
  using K = MetricField::Kind;
  const double unknown = std::numeric_limits<double>::quiet_NaN();
  auto bytes = [&](int64_t value) { return value < 0 ? unknown : static_cast<double>(value); };
  return {
      {"step", static_cast<double>(r.step), K::Integer},
      {"loss", r.loss, K::Real},
      {"grad_norm", r.grad_norm, K::Real},
      {"lr", r.lr, K::Real},
      {"target_tokens", static_cast<double>(r.target_tokens), K::Integer},
      {"samples", static_cast<double>(r.samples), K::Integer},
      {"input_tokens", static_cast<double>(r.input_tokens), K::Integer},
      {"step_seconds", r.step_seconds, K::Real},
      {"skipped", r.skipped ? 1.0 : 0.0, K::Bool},
      {"tokens_per_second", r.tokens_per_second, K::Real},
      {"mfu", r.mfu, K::Real},
      {"data_seconds", r.data_seconds, K::Real},
      {"memory_allocated_bytes", bytes(r.memory_allocated_bytes), K::Integer},
      {"memory_reserved_bytes", bytes(r.memory_reserved_bytes), K::Integer},
      {"rss_bytes", bytes(r.rss_bytes), K::Integer},
  };
}
Strategy::~Strategy() = default;
Comm::~Comm() = default;
std::unique_ptr<Comm> Comm::split(int, int) {
  throw TrainingError(
      "this communication backend offers no sub-groups (Comm::split), which hybrid sharding "
      "(strategy.shard_group_size) needs: use distributed.backend = 'gloo' or 'nccl'");
}
CommWork::~CommWork() = default;

namespace {

class DoneWork final : public CommWork {
 public:
  void wait() override {}
};

// World size 1: every collective is the identity on its data.
class SingleProcessComm final : public Comm {
 public:
  void connect(const CommSetup&) override {}
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::unique_ptr<CommWork> all_reduce_sum_async(torch::Tensor) override { return done(); }
  std::unique_ptr<CommWork> reduce_scatter_sum_async(torch::Tensor input, torch::Tensor output) override {
    copy_unless_same(input, output);
    return done();
  }
  std::unique_ptr<CommWork> all_gather_async(torch::Tensor input, torch::Tensor output) override {
    copy_unless_same(input, output);
    return done();
  }
  std::unique_ptr<CommWork> broadcast_async(torch::Tensor, int) override { return done(); }
  std::unique_ptr<CommWork> reduce_sum_async(torch::Tensor, int) override { return done(); }
  void barrier() override {}
  std::unique_ptr<Comm> split(int color, int) override {
    if (color < 0) throw std::invalid_argument("Comm::split: colors are >= 0");
    return std::make_unique<SingleProcessComm>();
  }

 private:
  static std::unique_ptr<CommWork> done() { return std::make_unique<DoneWork>(); }
  // In-place use (input a view of all of output) is the identity.
  static void copy_unless_same(const torch::Tensor& input, torch::Tensor& output) {
    if (input.data_ptr() != output.data_ptr()) output.copy_(input);
  }
};

}  // namespace

std::unique_ptr<Comm> make_single_process_comm() { return std::make_unique<SingleProcessComm>(); }

}  // namespace trainer
