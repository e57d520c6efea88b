// A comm for unit tests: rank `rank` of `world` ranks, whose collectives
// complete at once without moving data (an all-reduce runs `on_all_reduce`
// on its tensor, if given, and is counted; a broadcast records its root
// and runs `on_broadcast`). No sub-groups (Comm::split's default).
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "trainer/Comm.h"

namespace trainer::testing {

class StubComm final : public Comm {
 public:
  StubComm(int rank, int world, std::function<void(torch::Tensor&)> on_all_reduce = nullptr)
      : rank_(rank), world_(world), on_all_reduce_(std::move(on_all_reduce)) {}
  void connect(const CommSetup&) override {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::unique_ptr<CommWork> all_reduce_sum_async(torch::Tensor t) override {
    ++all_reduces;
    if (on_all_reduce_) on_all_reduce_(t);
    return done();
  }
  std::unique_ptr<CommWork> reduce_scatter_sum_async(torch::Tensor, torch::Tensor) override { return done(); }
  std::unique_ptr<CommWork> all_gather_async(torch::Tensor, torch::Tensor) override { return done(); }
  std::unique_ptr<CommWork> broadcast_async(torch::Tensor t, int root) override {
    broadcast_roots.push_back(root);
    if (on_broadcast) on_broadcast(t, root);
    return done();
  }
  std::unique_ptr<CommWork> reduce_sum_async(torch::Tensor, int) override { return done(); }
  void barrier() override {}

  int all_reduces = 0;
  std::vector<int> broadcast_roots;                       ///< every broadcast's root, in order
  std::function<void(torch::Tensor&, int)> on_broadcast;  ///< what a broadcast writes into its tensor, if set

 private:
  struct Done final : CommWork {
    void wait() override {}
  };
  static std::unique_ptr<CommWork> done() { return std::make_unique<Done>(); }
  int rank_, world_;
  std::function<void(torch::Tensor&)> on_all_reduce_;
};

}  // namespace trainer::testing
