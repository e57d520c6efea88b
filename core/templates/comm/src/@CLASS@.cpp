// Comm `@NAME@`: collectives on CPU tensors through the job's rendezvous
// store. Each rank writes its tensor under a key of the collective's number,
// reads every rank's, and combines them itself, summing in rank order (so
// every rank gets the same bits). Slow, and simple: a starting point to put
// another transport behind the same interface (trainer/Comm.h).
#include <cstring>
#include <iterator>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "trainer/Comm.h"
#include "trainer/Errors.h"

namespace {

using namespace trainer;

// Every collective here completes before it returns.
class Done final : public CommWork {
 public:
  void wait() override {}
};

class @CLASS@ final : public Comm {
 public:
  void connect(const CommSetup& setup) override {
    if (!setup.device.is_cpu()) throw InputError("comm '@NAME@' moves CPU tensors only: use run.device = 'cpu'");
    rank_ = setup.rank;
    world_size_ = setup.world_size;
    store_ = c10::make_intrusive<c10d::PrefixStore>("@NAME@", setup.store);
    store_->setTimeout(setup.timeout);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  std::unique_ptr<CommWork> all_reduce_sum_async(torch::Tensor tensor) override {
    tensor.copy_(sum(exchange(tensor, "all-reduce")));
    return std::make_unique<Done>();
  }

  std::unique_ptr<CommWork> reduce_scatter_sum_async(torch::Tensor input, torch::Tensor output) override {
    check_sizes(input, output, "reduce-scatter");
    std::vector<torch::Tensor> parts;
    for (const torch::Tensor& whole : exchange(input, "reduce-scatter")) {
      parts.push_back(whole.narrow(0, rank_ * output.numel(), output.numel()));
    }
    output.copy_(sum(parts));
    return std::make_unique<Done>();
  }

  std::unique_ptr<CommWork> all_gather_async(torch::Tensor input, torch::Tensor output) override {
    check_sizes(output, input, "all-gather");
    const std::vector<torch::Tensor> all = exchange(input, "all-gather");
    for (int r = 0; r < world_size_; ++r) output.narrow(0, r * input.numel(), input.numel()).copy_(all[r]);
    return std::make_unique<Done>();
  }

  std::unique_ptr<CommWork> broadcast_async(torch::Tensor tensor, int root) override {
    tensor.copy_(exchange(tensor, "broadcast")[root]);
    return std::make_unique<Done>();
  }

  std::unique_ptr<CommWork> reduce_sum_async(torch::Tensor tensor, int root) override {
    const std::vector<torch::Tensor> all = exchange(tensor, "reduce");
    if (rank_ == root) tensor.copy_(sum(all));
    return std::make_unique<Done>();
  }

  void barrier() override { exchange(torch::zeros({1}), "barrier"); }

 private:
  // Every rank's `tensor`, in rank order. The last rank to read a
  // collective's keys deletes them.
  std::vector<torch::Tensor> exchange(const torch::Tensor& tensor, const char* what) {
    const std::string prefix = fmt::format("{}/", sequence_++);
    const torch::Tensor mine = tensor.contiguous().cpu();
    const auto* bytes = static_cast<const uint8_t*>(mine.data_ptr());
    std::vector<torch::Tensor> all;
    try {
      store_->set(prefix + std::to_string(rank_), std::vector<uint8_t>(bytes, bytes + mine.nbytes()));
      for (int r = 0; r < world_size_; ++r) {
        const std::vector<uint8_t> theirs = store_->get(prefix + std::to_string(r));
        if (theirs.size() != mine.nbytes()) {
          throw TrainingError(fmt::format("comm '@NAME@' {}: rank {} sent {} bytes, rank {} {}", what, r,
                                          theirs.size(), rank_, mine.nbytes()));
        }
        torch::Tensor received = torch::empty_like(mine);
        std::memcpy(received.data_ptr(), theirs.data(), theirs.size());
        all.push_back(received);
      }
      if (store_->add(prefix + "read", 1) == world_size_) {
        for (int r = 0; r < world_size_; ++r) store_->deleteKey(prefix + std::to_string(r));
        store_->deleteKey(prefix + "read");
      }
    } catch (const TrainingError&) {
      throw;
    } catch (const std::exception& error) {  // a peer died or stayed silent past the timeout
      throw TrainingError(fmt::format("comm '@NAME@' {} failed on rank {}: {}", what, rank_, error.what()));
    }
    return all;
  }

  static torch::Tensor sum(const std::vector<torch::Tensor>& parts) {
    torch::Tensor total = parts[0].clone();
    for (size_t r = 1; r < parts.size(); ++r) total.add_(parts[r]);
    return total;
  }

  void check_sizes(const torch::Tensor& whole, const torch::Tensor& part, const char* what) const {
    if (whole.numel() != part.numel() * world_size_ || whole.scalar_type() != part.scalar_type()) {
      throw std::invalid_argument(fmt::format("comm '@NAME@' {}: {} elements are not world size {} x {} of one dtype",
                                              what, whole.numel(), world_size_, part.numel()));
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_ = 0;
  int world_size_ = 1;
  uint64_t sequence_ = 0;
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Comm, @CLASS@, "@NAME@", "0.1.0", "CPU collectives through the rendezvous store", ::trainer::kNoKeys)
