// Which CUDA device a rank binds to (Launcher.h): its local rank when every
// local rank's GPU is visible, device 0 when a launcher gave the task one.
#include <gtest/gtest.h>

#include "distributed/Launcher.h"
#include "trainer/Errors.h"

namespace trainer {
namespace {

WorldInfo local(int local_rank, int local_world_size) {
  WorldInfo world;
  world.rank = local_rank;
  world.world_size = local_world_size;
  world.local_rank = local_rank;
  world.local_world_size = local_world_size;
  return world;
}

TEST(DeviceBinding, EachLocalRankTakesItsOwnVisibleDevice) {
  for (int r = 0; r < 8; ++r) EXPECT_EQ(cuda_device_index(local(r, 8), 8), r);
  EXPECT_EQ(cuda_device_index(local(1, 2), 4), 1);
}

// Slurm's --gpus-per-task=1 (or a per-rank CUDA_VISIBLE_DEVICES): each task
// sees its own GPU as device 0, whatever its local rank.
TEST(DeviceBinding, OneVisibleDevicePerTaskIsDeviceZero) {
  for (int r = 0; r < 8; ++r) EXPECT_EQ(cuda_device_index(local(r, 8), 1), 0);
}

TEST(DeviceBinding, TooFewDevicesIsAnErrorNamingBothNumbers) {
  try {
    cuda_device_index(local(3, 4), 2);
    FAIL() << "accepted local rank 3 with 2 devices";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("local rank 3 needs a CUDA device of its own, but this process sees 2"),
              std::string::npos)
        << error.what();
  }
  EXPECT_THROW(cuda_device_index(local(0, 1), 0), InputError);
}

}  // namespace
}  // namespace trainer
