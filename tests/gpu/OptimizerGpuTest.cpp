// The muon plugin on CUDA against PyTorch's own torch.optim.Muon (run by
// tests/gpu/muon_reference.py with the machine's PyTorch), for one tall and
// one wide matrix over three steps: the same operations in the same order
// (bf16 Newton-Schulz through cuBLAS), so the same bits are expected; the
// test allows 1e-6 relative for a cuBLAS that picks another algorithm for
// the same product, and prints whether the bits agree.
#include <gtest/gtest.h>

#include <cstdio>

#include "GpuTestSupport.h"
#include "TestSupport.h"
#include "plugin/PluginRegistry.h"
#include "recipe/Recipe.h"
#include "trainer/Optimizer.h"
#include "trainer/util/Safetensors.h"

namespace trainer {
namespace {

using testing::kCuda;

TEST(OptimizerGpu, MuonMatchesTorchOptimMuon) {
  REQUIRE_CUDA();
  PluginRegistry registry;
  registry.discover({TRAINER_PLUGIN_DIR});
  const LoadedPlugin& plugin = registry.find(PluginKind::Optimizer, "muon");
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{384, 128}, std::vector<int64_t>{128, 384}}) {
    const std::string dir = testing::scratch_dir("MuonReference");
    torch::manual_seed(11);
    const torch::Tensor w = torch::randn(shape) * 0.02;
    std::vector<std::pair<std::string, torch::Tensor>> inputs = {{"w", w}};
    for (int k = 0; k < 3; ++k) inputs.emplace_back("g" + std::to_string(k), torch::randn(shape));
    write_safetensors(dir + "/in.safetensors", inputs);
    const auto reference =
        testing::run_command("python3 " + std::string(TRAINER_SOURCE_DIR) + "/tests/gpu/muon_reference.py " + dir +
                             "/in.safetensors " + dir + "/out.safetensors");
    ASSERT_EQ(reference.exit_code, 0) << "PyTorch's Muon is the reference here:\n" << reference.output;
    const SafetensorsReader expected(dir + "/out.safetensors");

    const std::unique_ptr<Optimizer> muon =
        PluginRegistry::create<Optimizer>(plugin, plugin_options(plugin, "weight_decay = 0.1\n"), Context{});
    const int64_t numel = shape[0] * shape[1];
    const ParameterInfo p{"model.layers.0.mlp.up_proj.weight", shape, true, 0, 0, numel};
    ASSERT_TRUE(muon->whole_matrix(p));
    torch::Tensor values = w.reshape({-1}).to(kCuda);
    torch::Tensor m = torch::zeros_like(values), v = torch::zeros_like(values);
    for (int k = 0; k < 3; ++k) {
      UpdateSlice s{0, 0, true, values, inputs[k + 1].second.reshape({-1}).to(kCuda), {m, v}, {}};
      const UpdateArgs args{0.02, 1.0, k + 1};
      torch::Tensor direction = torch::empty_like(values);
      muon->prepare(p, s, direction, args);
      const torch::Tensor out = muon->transform(p, direction.view(shape), args);
      muon->apply(p, s, out.reshape({-1}), args);
      const torch::Tensor want = expected.read("w" + std::to_string(k + 1)).reshape({-1});
      const torch::Tensor got = values.cpu();
      const double error = (got - want).abs().max().item<double>() / want.abs().max().item<double>();
      std::printf("shape %ldx%ld step %d: max relative difference %.3e (%s)\n", shape[0], shape[1], k + 1, error,
                  torch::equal(got, want) ? "bit for bit" : "not bit for bit");
      EXPECT_LE(error, 1e-6) << "step " << k + 1;
    }
  }
}

// Muon's stacked Newton-Schulz on CUDA (bf16 batched products): a matrix's
// bits do not depend on its position or its companions in a stack (a rank
// stacks whichever matrices it holds, so this is what keeps one matrix's
// update the same at every world size), and each matrix's result is its
// own iteration's: within 2e-2 (Frobenius, relative) of the one-matrix
// path, the bound of two bf16 computations of the same products in another
// order (2^-8 per rounding, a few roundings apart; see OpsGpuTest).
TEST(OptimizerGpu, StackedNewtonSchulzGivesEachMatrixItsOwnBits) {
  REQUIRE_CUDA();
  PluginRegistry registry;
  registry.discover({TRAINER_PLUGIN_DIR});
  const LoadedPlugin& plugin = registry.find(PluginKind::Optimizer, "muon");
  const std::unique_ptr<Optimizer> muon =
      PluginRegistry::create<Optimizer>(plugin, plugin_options(plugin, ""), Context{});
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{896, 896}, std::vector<int64_t>{4864, 896}, std::vector<int64_t>{128, 896}}) {
    const ParameterInfo p{"model.layers.0.self_attn.q_proj.weight", shape, true, 0, 0, shape[0] * shape[1]};
    const int64_t k = muon->stack_size(p);
    ASSERT_GT(k, 1);
    std::vector<int64_t> sizes{k};
    sizes.insert(sizes.end(), shape.begin(), shape.end());
    torch::manual_seed(12);
    const torch::Tensor matrices = torch::randn(sizes, torch::TensorOptions().device(kCuda));
    const std::vector<ParameterInfo> infos(k, p);
    const torch::Tensor out = muon->transform_stack(infos, matrices, {});
    const torch::Tensor alone = torch::zeros_like(matrices);
    alone[0].copy_(matrices[1]);
    torch::Tensor others = torch::randn(sizes, matrices.options());
    others[k - 1].copy_(matrices[1]);
    EXPECT_TRUE(torch::equal(muon->transform_stack({p}, alone, {})[0], out[1])) << shape[0] << "x" << shape[1];
    EXPECT_TRUE(torch::equal(muon->transform_stack(infos, others, {})[k - 1], out[1])) << shape[0] << "x" << shape[1];
    for (int64_t i = 0; i < k; ++i) {
      const torch::Tensor single = muon->transform(p, matrices[i], {});
      const double error = ((out[i] - single).norm() / single.norm()).item<double>();
      EXPECT_LT(error, 2e-2) << shape[0] << "x" << shape[1] << " matrix " << i;
    }
  }
}

}  // namespace
}  // namespace trainer
