// The comm of a run at world size 1 (and of a shard or replica group of
// one rank): every collective is the identity on its data.
#include <memory>
#include <stdexcept>

#include "trainer/Comm.h"

namespace trainer {

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
