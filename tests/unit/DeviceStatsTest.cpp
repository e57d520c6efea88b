// The datasheet peaks mfu_datasheet is relative to, by the name CUDA
// reports (NVIDIA's datasheets, dense, without sparsity).
#include <gtest/gtest.h>

#include "run/DeviceStats.h"

namespace trainer {
namespace {

TEST(DeviceStats, DatasheetPeaksOfKnownDevicesAndNoneOtherwise) {
  EXPECT_DOUBLE_EQ(datasheet_flops_for("NVIDIA H200", torch::kBFloat16), 989.4e12);
  EXPECT_DOUBLE_EQ(datasheet_flops_for("NVIDIA H100 80GB HBM3", torch::kBFloat16), 989.4e12);
  EXPECT_DOUBLE_EQ(datasheet_flops_for("NVIDIA H100 PCIe", torch::kBFloat16), 756.0e12);
  EXPECT_DOUBLE_EQ(datasheet_flops_for("NVIDIA A100-SXM4-80GB", torch::kFloat32), 19.5e12);
  EXPECT_EQ(datasheet_flops_for("NVIDIA GeForce RTX 4090", torch::kBFloat16), 0.0);
  std::string name = "stale";
  EXPECT_EQ(datasheet_flops(torch::kCPU, torch::kBFloat16, &name), 0.0);
  EXPECT_EQ(name, "");
}

}  // namespace
}  // namespace trainer
