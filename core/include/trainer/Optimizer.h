// The optimizer plugin interface: how the fp32 master values a rank updates
// move, given the step's summed gradient. Strategies decide which elements
// a rank updates and bring the gradient there; the optimizer decides what
// the update is. No strategy names an optimizer, no optimizer names a
// strategy.
//
// State is per element. Every state tensor an optimizer keeps (AdamW's two
// moments, Lion's and Muon's momentum) is as long as the values it belongs
// to and is laid out like them in the flat groups, so it shards, saves,
// loads and reshards across world sizes and strategies exactly as the
// master values do: no optimizer needs a resharding path of its own.
//
// Two kinds of parameter, chosen per parameter by the optimizer:
//  - element-wise (AdamW, Lion, and Muon for embeddings, head, norms and
//    biases): update() on any contiguous run of a rank's elements; the
//    result does not depend on how the runs are cut;
//  - whole-matrix (Muon for the blocks' 2-D weights): the update of an
//    element depends on its whole matrix. Such an update is written as three
//    steps: prepare() (element-wise, on the rank's elements: e.g. the
//    momentum, and the matrix the transform reads), transform() (on the
//    whole matrix, which the strategy's building block assembles from the
//    ranks that hold parts of it: exactly, as a sum of disjoint parts), and
//    apply() (element-wise again, with the rank's part of the transformed
//    matrix). A matrix that one rank holds whole needs no communication; at
//    world size 1, and in ddp, none ever does. Matrices of one shape may be
//    transformed as a stack (stack_size(), transform_stack()): the same
//    bits per matrix, far fewer and fuller launches. See
//    sharding/OptimizerShards.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "trainer/Plugin.h"

namespace trainer {

/// One parameter as an optimizer sees it: its name and shape, whether weight
/// decay applies, and where it lies in the flat layout.
struct ParameterInfo {
  std::string name;  ///< the model's, e.g. "model.layers.0.mlp.up_proj.weight"
  std::vector<int64_t> shape;
  bool decay = true;
  size_t group = 0;    ///< its flat group
  int64_t offset = 0;  ///< its first element in the group
  int64_t numel = 0;
};

/// The update the loop decided on after Strategy::reduce_gradients_and_norm().
struct UpdateArgs {
  double lr = 0.0;
  double grad_scale = 1.0;  ///< clipping coefficient, 1.0 when not clipping
  int64_t adam_step = 1;    ///< 1-based count of applied updates (bias correction)
};

/// A contiguous run of one flat group's elements that this rank updates,
/// and everything its update reads and writes, all of one length.
struct UpdateSlice {
  size_t group = 0;
  int64_t offset = 0;  ///< of the first element in the group
  bool decay = true;   ///< weight decay applies to these elements
  /// fp32 master values (fp64 in the conformance kit's reference), updated in place.
  torch::Tensor values;
  /// The step's summed gradient, not yet clipped: the update uses it times
  /// UpdateArgs::grad_scale. The optimizer may overwrite it (it is zeroed
  /// after the update).
  torch::Tensor gradient;
  /// One tensor per state_names() entry, of state_dtype() (the values' dtype
  /// when that is fp64), zero before the first update.
  std::vector<torch::Tensor> state;
  /// When defined: the parameters' narrower compute copy (bf16) of these
  /// elements, which update() may write in the same pass (returning true).
  torch::Tensor compute;
};

class Optimizer : public Component {
 public:
  ~Optimizer() override;
  /// Names of the per-element state tensors, in a fixed order. Checkpoints
  /// keep each as group<G>.<name>; AdamW's are "exp_avg" and "exp_avg_sq".
  virtual std::vector<std::string> state_names() const = 0;
  /// The dtype of the state tensors for fp32 values (fp64 values get fp64 state).
  virtual torch::Dtype state_dtype() const { return torch::kFloat32; }
  /// Whether `parameter` takes the whole-matrix path. Asked once per
  /// parameter at setup; must not depend on the rank.
  virtual bool whole_matrix(const ParameterInfo& parameter) const {
    (void)parameter;
    return false;
  }
  /// The element-wise update of `slice` (elements of parameters that do not
  /// take the whole-matrix path), in place. Element-wise: any cut of the
  /// elements into slices gives the same bits. Returns true when it wrote
  /// slice.compute (if defined); otherwise the caller copies the values there.
  virtual bool update(UpdateSlice& slice, const UpdateArgs& args) = 0;

  /// Whole-matrix path, step 1, element-wise on `slice` (a run of one
  /// whole-matrix parameter's elements): updates the state and writes into
  /// `direction` (as long as the slice, the values' dtype) what transform reads.
  virtual void prepare(const ParameterInfo& parameter, UpdateSlice& slice, torch::Tensor direction,
                       const UpdateArgs& args);
  /// Step 2, once per whole-matrix parameter, on a rank that holds part of
  /// it: `matrix` is the whole parameter's directions, shaped as the
  /// parameter. Returns the transformed matrix, of the same shape and
  /// dtype. Deterministic: equal inputs on equal devices give equal bits.
  virtual torch::Tensor transform(const ParameterInfo& parameter, const torch::Tensor& matrix, const UpdateArgs& args);
  /// How many matrices of `parameter`'s shape transform_stack() takes at
  /// once; 1 (the default): transform() is called per matrix. A function of
  /// the shape alone, never of the rank.
  virtual int64_t stack_size(const ParameterInfo& parameter) const {
    (void)parameter;
    return 1;
  }
  /// Step 2 for up to stack_size() whole-matrix parameters of one shape at
  /// once (batched products: one launch for many small matrices, which alone
  /// would leave most of a GPU idle). `matrices` is [stack_size(), shape...]:
  /// entry i holds parameters[i]'s directions, entries past
  /// parameters.size() are zeros. Returns the transformed stack, same shape
  /// and dtype. Each matrix's result must not depend on its position or on
  /// the other entries: a rank stacks whichever matrices it holds, and the
  /// same matrix must get the same bits at every world size (a fixed stack
  /// shape and batched products whose entries are computed independently
  /// give that). The default calls transform() on each entry.
  virtual torch::Tensor transform_stack(const std::vector<ParameterInfo>& parameters, const torch::Tensor& matrices,
                                        const UpdateArgs& args);
  /// Step 3, element-wise on the same slice as prepare: updates the values
  /// with `direction`, the slice's part of transform's result.
  virtual void apply(const ParameterInfo& parameter, UpdateSlice& slice, const torch::Tensor& direction,
                     const UpdateArgs& args);
};

}  // namespace trainer
