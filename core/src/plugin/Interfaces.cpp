// Key functions of the SDK's interfaces: defining them here makes
// libtrainer_core.so the one home of their vtables and typeinfo.
#include "trainer/Comm.h"
#include "trainer/Dataset.h"
#include "trainer/Errors.h"
#include "trainer/Logger.h"
#include "trainer/Model.h"
#include "trainer/Optimizer.h"
#include "trainer/Strategy.h"

namespace trainer {

Model::~Model() = default;
torch::Tensor Model::logits(const torch::Tensor&) { throw InputError("this model plugin does not provide logits()"); }
UnitHooks::~UnitHooks() = default;
Dataset::~Dataset() = default;
Logger::~Logger() = default;
Strategy::~Strategy() = default;
Optimizer::~Optimizer() = default;
void Optimizer::prepare(const ParameterInfo&, UpdateSlice&, torch::Tensor, const UpdateArgs&) {
  throw TrainingError(
      "this optimizer plugin claims a whole-matrix parameter but does not implement Optimizer::prepare");
}
torch::Tensor Optimizer::transform(const ParameterInfo& parameter, const torch::Tensor&, const UpdateArgs&) {
  throw TrainingError(
      parameter.name +
      ": this optimizer plugin claims it as a whole matrix but does not implement Optimizer::transform");
}
torch::Tensor Optimizer::transform_stack(const std::vector<ParameterInfo>& parameters, const torch::Tensor& matrices,
                                         const UpdateArgs& args) {
  torch::Tensor out = torch::zeros_like(matrices);
  for (size_t i = 0; i < parameters.size(); ++i) {
    const auto at = static_cast<int64_t>(i);
    out[at].copy_(transform(parameters[i], matrices[at], args));
  }
  return out;
}
void Optimizer::apply(const ParameterInfo&, UpdateSlice&, const torch::Tensor&, const UpdateArgs&) {
  throw TrainingError("this optimizer plugin claims a whole-matrix parameter but does not implement Optimizer::apply");
}
Comm::~Comm() = default;
std::unique_ptr<Comm> Comm::split(int, int) {
  throw TrainingError(
      "this communication backend offers no sub-groups (Comm::split), which hybrid sharding "
      "(strategy.shard_group_size) needs: use distributed.backend = 'gloo' or 'nccl'");
}
CommWork::~CommWork() = default;

}  // namespace trainer
