// Key functions of the SDK's interfaces: defining them here makes
// libtrainer_core.so the one home of their vtables and typeinfo.
#include "trainer/Comm.h"
#include "trainer/Errors.h"
#include "trainer/Dataset.h"
#include "trainer/Logger.h"
#include "trainer/Model.h"
#include "trainer/Strategy.h"

namespace trainer {

Model::~Model() = default;
torch::Tensor Model::logits(const torch::Tensor&) {
  throw InputError("this model plugin does not provide logits()");
}
UnitHooks::~UnitHooks() = default;
Dataset::~Dataset() = default;
Logger::~Logger() = default;
Strategy::~Strategy() = default;
Comm::~Comm() = default;
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
  void barrier() override {}

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
