// Comm `gloo`: collectives on CPU tensors through LibTorch's c10d Gloo
// process group. LibTorch 1.13's Gloo group has no reduce-scatter; it is
// composed from an all-reduce (see reduce_scatter_sum_async). Gloo sums no
// bf16 or fp16: such tensors are summed as fp32 copies and rounded back
// once (the bytes of fp32 on the wire, a sum at least as exact as a bf16 one).
#include <algorithm>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "trainer/Comm.h"
#include "trainer/Errors.h"

namespace {

using namespace trainer;

// Waits on a c10d work with the job's timeout and turns its failure (a dead
// or silent peer) into a TrainingError naming the collective. `then` runs
// after a successful wait (e.g. copying a slice out).
class GlooWork final : public CommWork {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, const char* what, std::chrono::milliseconds timeout,
           std::function<void()> then = {})
      : work_(std::move(work)), what_(what), timeout_(timeout), then_(std::move(then)) {}

  void wait() override {
    try {
      work_->wait(timeout_);
    } catch (const std::exception& error) {
      throw TrainingError(fmt::format("gloo {} failed (a peer died or stayed silent for {} s?): {}", what_,
                                      timeout_.count() / 1000.0, error.what()));
    }
    if (then_) then_();
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  const char* what_;
  std::chrono::milliseconds timeout_;
  std::function<void()> then_;
};

class GlooComm final : public Comm {
 public:
  void connect(const CommSetup& setup) override {
    if (setup.device.is_cuda()) throw InputError("comm 'gloo' runs on CPU tensors: use backend 'nccl' for CUDA");
    join(c10::make_intrusive<c10d::PrefixStore>("gloo", setup.store), setup.rank, setup.world_size, setup.timeout);
  }

  // Every rank learns every rank's (color, key) through an all-gather here;
  // each new group meets under its own prefix of this group's store.
  std::unique_ptr<Comm> split(int color, int key) override {
    if (color < 0) throw std::invalid_argument("gloo split: colors are >= 0");
    torch::Tensor mine = torch::tensor({int64_t{color}, int64_t{key}}, torch::kInt64);
    torch::Tensor all = torch::empty({2 * world_size_}, torch::kInt64);
    all_gather(mine, all);
    std::vector<std::pair<int64_t, int>> members;  // (key, rank here) of this color
    for (int r = 0; r < world_size_; ++r) {
      if (all[2 * r].item<int64_t>() == color) members.emplace_back(all[2 * r + 1].item<int64_t>(), r);
    }
    std::sort(members.begin(), members.end());
    const int rank = static_cast<int>(std::find(members.begin(), members.end(), std::make_pair(int64_t{key}, rank_)) -
                                      members.begin());
    auto group = std::make_unique<GlooComm>();
    group->join(c10::make_intrusive<c10d::PrefixStore>(fmt::format("split{}/color{}", splits_++, color), store_), rank,
                static_cast<int>(members.size()), timeout_);
    return group;
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  std::unique_ptr<CommWork> all_reduce_sum_async(torch::Tensor tensor) override {
    torch::Tensor summed = summable(tensor);
    std::vector<at::Tensor> tensors{summed};
    return std::make_unique<GlooWork>(group_->allreduce(tensors), "all-reduce", timeout_, copy_back(summed, tensor));
  }

  std::unique_ptr<CommWork> reduce_scatter_sum_async(torch::Tensor input, torch::Tensor output) override {
    check_sizes(input, output, "reduce-scatter");
    // Composed: all-reduce a copy of the whole input, keep this rank's
    // slice. Costs world_size times the bandwidth of a native one, but is
    // exact: the sum is the same sum.
    torch::Tensor whole = is_narrow(input) ? input.to(torch::kFloat32) : input.clone();
    std::vector<at::Tensor> tensors{whole};
    const int64_t offset = rank_ * output.numel();
    return std::make_unique<GlooWork>(
        group_->allreduce(tensors), "reduce-scatter", timeout_,
        [whole, output, offset]() mutable { output.copy_(whole.narrow(0, offset, output.numel())); });
  }

  std::unique_ptr<CommWork> all_gather_async(torch::Tensor input, torch::Tensor output) override {
    check_sizes(output, input, "all-gather");
    const torch::Tensor in = as_bytes(input), out = as_bytes(output);
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < world_size_; ++r) outputs[0].push_back(out.narrow(0, r * in.numel(), in.numel()));
    std::vector<at::Tensor> inputs{in};
    return std::make_unique<GlooWork>(group_->allgather(outputs, inputs), "all-gather", timeout_);
  }

  std::unique_ptr<CommWork> broadcast_async(torch::Tensor tensor, int root) override {
    std::vector<at::Tensor> tensors{as_bytes(tensor)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    return std::make_unique<GlooWork>(group_->broadcast(tensors, options), "broadcast", timeout_);
  }

  std::unique_ptr<CommWork> reduce_sum_async(torch::Tensor tensor, int root) override {
    torch::Tensor summed = summable(tensor);
    std::vector<at::Tensor> tensors{summed};
    c10d::ReduceOptions options;
    options.rootRank = root;
    options.reduceOp = c10d::ReduceOp::SUM;
    return std::make_unique<GlooWork>(group_->reduce(tensors, options), "reduce", timeout_, copy_back(summed, tensor));
  }

  void barrier() override { GlooWork(group_->barrier(), "barrier", timeout_).wait(); }

 private:
  static bool is_narrow(const torch::Tensor& t) {
    return t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kHalf;
  }
  // What gloo copies (all-gather, broadcast): a bf16/fp16 tensor as its
  // bytes, which gloo moves unchanged (LibTorch 1.13's gloo has no bf16).
  static torch::Tensor as_bytes(const torch::Tensor& tensor) {
    return is_narrow(tensor) ? tensor.view(torch::kUInt8) : tensor;
  }
  // The tensor gloo sums: `tensor` itself, or an fp32 copy of a bf16/fp16 one.
  static torch::Tensor summable(const torch::Tensor& tensor) {
    return is_narrow(tensor) ? tensor.to(torch::kFloat32) : tensor;
  }
  static std::function<void()> copy_back(torch::Tensor summed, torch::Tensor tensor) {
    if (summed.is_same(tensor)) return {};
    return [summed, tensor]() mutable { tensor.copy_(summed); };
  }

  void check_sizes(const torch::Tensor& whole, const torch::Tensor& part, const char* what) const {
    if (whole.numel() != part.numel() * world_size_ || whole.scalar_type() != part.scalar_type()) {
      throw std::invalid_argument(fmt::format("gloo {}: {} elements are not world size {} x {} of the same dtype", what,
                                              whole.numel(), world_size_, part.numel()));
    }
  }

  // `store`: this group's own namespace in the job's store.
  void join(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, std::chrono::milliseconds timeout) {
    store_ = std::move(store);
    rank_ = rank;
    world_size_ = world_size;
    timeout_ = timeout;
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    try {
      group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("group", store_),
                                                           rank_, world_size_, options);
    } catch (const std::exception& error) {
      throw TrainingError(fmt::format("rank {}: gloo cannot connect to its {} peers: {}", rank_, world_size_ - 1,
                                      dynamic_cast<const c10::Error*>(&error)
                                          ? static_cast<const c10::Error&>(error).what_without_backtrace()
                                          : error.what()));
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  int splits_ = 0;  // split() calls so far: each new group's store prefix
  int rank_ = 0;
  int world_size_ = 1;
  std::chrono::milliseconds timeout_{300000};
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Comm, GlooComm, "gloo", "0.1.0", "CPU collectives through c10d's Gloo process group",
                      ::trainer::kNoKeys)
