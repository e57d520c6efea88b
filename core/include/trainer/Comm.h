// The communication interface (plugin kind "comm"): collectives on flat
// tensors of one process group. Sums only: the accumulation contract never
// averages in a collective.
#pragma once

#include <chrono>
#include <memory>

#include <torch/types.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "trainer/Plugin.h"

namespace trainer {

/// A collective in flight. wait() blocks until the result is in the output
/// tensor (on CUDA: until it is ordered before later work on the stream that
/// was current on the tensors' device when the collective started) and
/// throws TrainingError if it failed or timed out.
class CommWork {
 public:
  virtual ~CommWork();
  virtual void wait() = 0;
};

/// What a communication backend needs to join its process group.
struct CommSetup {
  c10::intrusive_ptr<c10d::Store> store;  ///< the job's rendezvous store (a prefix of it is the backend's)
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout{300000};  ///< every collective fails after this long
  torch::Device device = torch::kCPU;         ///< where the tensors passed to collectives live
};

/// Every rank must call the same collectives in the same order with tensors
/// of equal size and dtype. Tensors must be contiguous. Collectives may be
/// started from autograd hooks (another thread) but not concurrently with
/// each other.
class Comm : public Component {
 public:
  ~Comm() override;
  /// Joins the process group; called once, before any collective. Throws
  /// TrainingError when the peers cannot be reached within the timeout.
  virtual void connect(const CommSetup& setup) = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  /// In place: tensor = sum over ranks of tensor.
  virtual std::unique_ptr<CommWork> all_reduce_sum_async(torch::Tensor tensor) = 0;
  /// input has world_size * output.numel() elements; output = sum over ranks
  /// of input's rank-th slice.
  virtual std::unique_ptr<CommWork> reduce_scatter_sum_async(torch::Tensor input, torch::Tensor output) = 0;
  /// output has world_size * input.numel() elements; rank r's input lands in
  /// output's r-th slice.
  virtual std::unique_ptr<CommWork> all_gather_async(torch::Tensor input, torch::Tensor output) = 0;
  virtual std::unique_ptr<CommWork> broadcast_async(torch::Tensor tensor, int root) = 0;
  /// In place on `root`: tensor = sum over ranks of tensor. What the other
  /// ranks' tensor holds afterwards is unspecified.
  virtual std::unique_ptr<CommWork> reduce_sum_async(torch::Tensor tensor, int root) = 0;
  /// A host barrier: returns on each rank only once every rank has called
  /// it, whatever the device (a backend whose collectives complete on a
  /// stream waits for that on the host here). Checkpoints and the final
  /// write use it to order file-system work across ranks. Throws
  /// TrainingError when a peer does not arrive within the timeout.
  virtual void barrier() = 0;

  /// Sub-groups. Collective over this group: every rank calls it, with a
  /// color >= 0; the ranks of one color form a new group, in which they are
  /// ranked by (key, rank here). The new group is connected when this
  /// returns; its collectives are independent of this group's (they may be
  /// in flight at the same time), and it must not outlive this group. The
  /// default throws TrainingError: a backend without sub-groups serves
  /// everything but hybrid sharding (gloo and nccl have them).
  virtual std::unique_ptr<Comm> split(int color, int key);

  void all_reduce_sum(torch::Tensor tensor) { all_reduce_sum_async(tensor)->wait(); }
  void reduce_scatter_sum(torch::Tensor input, torch::Tensor output) {
    reduce_scatter_sum_async(input, output)->wait();
  }
  void all_gather(torch::Tensor input, torch::Tensor output) { all_gather_async(input, output)->wait(); }
  void broadcast(torch::Tensor tensor, int root) { broadcast_async(tensor, root)->wait(); }
  void reduce_sum(torch::Tensor tensor, int root) { reduce_sum_async(tensor, root)->wait(); }
};

/// A group of one process: every collective is the identity. Used at world
/// size 1 so strategies never special-case it.
std::unique_ptr<Comm> make_single_process_comm();

}  // namespace trainer
