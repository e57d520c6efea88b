// The update behind the next forward: an element-wise optimizer's step cut
// by the model's units and run, on CUDA, on a stream of its own, so the next
// forward's first units compute while the later ones are still updated.
//
// The update is bandwidth-bound (AdamW reads and writes ~30 bytes a
// parameter) and the forward's GEMMs are compute-bound; ordered, the update
// is a stretch of the step where the tensor cores idle (3B shape: ~23 ms of
// ~330). Measured on an H200 the two streams alternate rather than share
// SMs (cuBLAS's GEMMs hold every SM while they run), so the update moves
// instead of hiding: bench/README, "Eighth round".
//
// Order, unit by unit: the update stream starts where the current stream
// stands (the gradients summed, the norm taken), then updates each unit's
// elements in forward order, zeroes their gradient and records an event.
// The unit's forward waits for that event before it reads the unit's
// parameters (UnitHooks::before_unit), so every kernel reads what the
// ordered run would have: the same bits, by construction. Everything else
// that reads or writes the state (checkpoints, exports, the norm, the next
// update) joins first (join()). On the CPU the pieces run in order, at once.
//
// What it asks: a model that declares units covering every parameter (each
// forward enters all of them, Model::units), and an optimizer without the
// whole-matrix path (Muon's transforms span units); strategies refuse
// the option otherwise. CUDA-graph replays do not wait on events: a
// strategy replays only micro-steps after a step's first, whose forward
// waited for every unit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <torch/types.h>

#include "trainer/Model.h"
#include "trainer/Optimizer.h"
#include "trainer/sharding/FlatParameters.h"
#include "trainer/sharding/OptimizerShards.h"

namespace trainer {

class OverlappedUpdate final : public UnitHooks {
 public:
  /// Unset: launch() updates at once on the current stream.
  OverlappedUpdate();
  /// Cuts `groups` (laid out by flatten_parameters from model.parameters())
  /// by `units` (Model::units(), in forward order). Throws as unit_spans()
  /// does when the units do not cover every parameter once.
  OverlappedUpdate(const std::vector<ParameterUnit>& units, const std::vector<ParameterGroup>& groups,
                   torch::Device device);
  ~OverlappedUpdate() override;
  OverlappedUpdate(OverlappedUpdate&&) noexcept;
  OverlappedUpdate& operator=(OverlappedUpdate&&) noexcept;

  /// shards.update_elements(args, ...) unit by unit, each unit's elements of
  /// `gradients` (one per group, laid out like it) zeroed after its update;
  /// on CUDA on the update stream, returning before it ends. The update
  /// must have no whole-matrix parameter (OptimizerShards::has_whole_matrix).
  void launch(OptimizerShards& shards, std::vector<torch::Tensor>& gradients, const UpdateArgs& args);
  /// The current stream waits until every unit's update has ended.
  void join();

  /// The current stream waits for the unit's update (nothing once it has).
  void before_unit(size_t unit) override;
  torch::Tensor after_unit(size_t, const torch::Tensor& output) override { return output; }

 private:
  struct UnitEvents;                          // the stream and events (OverlappedUpdate.cpp)
  std::vector<std::vector<UnitSpan>> spans_;  // per unit, from unit_spans()
  std::unique_ptr<UnitEvents> device_;
};

}  // namespace trainer
