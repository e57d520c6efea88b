// Sub-groups (Comm::split) and hybrid sharding's process groups
// (ShardGroups), over gloo with four ranks as threads of this process. A
// build without Gloo's headers (the CUDA build) has no gloo plugin: there
// the same code runs over nccl sub-groups at one rank (tests/gpu,
// CommGroupsNccl.*), and these tests are not built.
#include <gtest/gtest.h>

#include <thread>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "plugin/PluginRegistry.h"
#include "trainer/Comm.h"
#include "trainer/Errors.h"
#include "trainer/sharding/OptimizerShards.h"
#include "unit/StubComm.h"

namespace trainer {
namespace {

#ifdef TRAINER_TESTS_HAVE_GLOO
constexpr int kWorld = 4;

// Runs `body(rank, comm)` on kWorld threads, each with a gloo comm joined
// through one in-process store; failures are collected per rank. Barriers
// before and after the body: a rank whose body fails at once (a refused
// argument) would otherwise close its connections while a peer is still
// making or using them, and that peer would report the broken connection
// instead of its own result.
template <class Body>
std::vector<std::string> on_every_rank(Body body) {
  PluginRegistry registry;
  registry.discover({TRAINER_PLUGIN_DIR});
  const LoadedPlugin& gloo = registry.find(PluginKind::Comm, "gloo");
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> failures(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        std::unique_ptr<Comm> comm = PluginRegistry::create<Comm>(gloo, Options(), Context{});
        comm->connect(CommSetup{store, rank, kWorld, std::chrono::milliseconds(60000), torch::kCPU});
        comm->barrier();
        try {
          body(rank, *comm);
        } catch (const std::exception& error) {
          failures[rank] = error.what();
        }
        comm->barrier();
      } catch (const std::exception& error) {
        failures[rank] += std::string(failures[rank].empty() ? "" : "; then ") + error.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return failures;
}

TEST(CommGroups, GlooSplitsIntoGroupsRankedByKey) {
  std::vector<std::vector<double>> seen(kWorld);
  const std::vector<std::string> failures = on_every_rank([&](int rank, Comm& world) {
    // Colors by parity; keys reversed, so rank 3 is rank 0 of the odd group.
    std::unique_ptr<Comm> group = world.split(rank % 2, -rank);
    std::vector<double>& out = seen[rank];
    out.push_back(group->rank());
    out.push_back(group->world_size());
    torch::Tensor sum = torch::full({3}, static_cast<double>(rank + 1), torch::kFloat64);
    group->all_reduce_sum(sum);
    out.push_back(sum[0].item<double>());
    torch::Tensor gathered = torch::empty({2}, torch::kFloat64);
    group->all_gather(torch::full({1}, static_cast<double>(rank), torch::kFloat64), gathered);
    out.push_back(gathered[0].item<double>());
    out.push_back(gathered[1].item<double>());
    // rank r of the group gets the sum of every member's r-th element.
    torch::Tensor input = torch::tensor({1.0 * rank, 10.0 * rank}, torch::kFloat64),
                  part = torch::empty({1}, torch::kFloat64);
    group->reduce_scatter_sum(input, part);
    out.push_back(part[0].item<double>());
    torch::Tensor shared = torch::full({1}, static_cast<double>(rank), torch::kFloat64);
    group->broadcast(shared, 1);
    out.push_back(shared[0].item<double>());
    // Collectives of the world still work beside the group's, and nested splits.
    torch::Tensor all = torch::ones({1}, torch::kFloat64);
    world.all_reduce_sum(all);
    out.push_back(all[0].item<double>());
    std::unique_ptr<Comm> alone = group->split(group->rank(), 0);
    out.push_back(alone->world_size());
  });
  for (int r = 0; r < kWorld; ++r) ASSERT_EQ(failures[r], "") << "rank " << r;
  // Even group: ranks 0 and 2, keys 0 and -2, so rank 2 comes first.
  // Odd group: ranks 1 and 3, keys -1 and -3, so rank 3 comes first.
  const std::vector<std::vector<double>> expected = {
      {1, 2, 4, 2, 0, 10 * 2 + 10 * 0, 0, 4, 1},
      {1, 2, 6, 3, 1, 10 * 3 + 10 * 1, 1, 4, 1},
      {0, 2, 4, 2, 0, 1 * 2 + 1 * 0, 0, 4, 1},
      {0, 2, 6, 3, 1, 1 * 3 + 1 * 1, 1, 4, 1},
  };
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(seen[r], expected[r]) << "rank " << r;
}

TEST(CommGroups, ShardGroupsShardWithinAndSumAcross) {
  std::vector<std::vector<double>> seen(kWorld);
  const std::vector<std::string> failures = on_every_rank([&](int rank, Comm& world) {
    for (const int64_t size : {2, 1, 0}) {
      const ShardGroups groups(world, size, "zero2");
      torch::Tensor t = torch::full({1}, static_cast<double>(1 << rank), torch::kFloat64);
      groups.sum_over_replicas(t);
      seen[rank].insert(seen[rank].end(),
                        {static_cast<double>(groups.shard().rank()), static_cast<double>(groups.shard().world_size()),
                         static_cast<double>(groups.replicas().world_size()), t[0].item<double>()});
    }
  });
  for (int r = 0; r < kWorld; ++r) ASSERT_EQ(failures[r], "") << "rank " << r;
  // Groups of 2: {0, 1} and {2, 3} shard; {0, 2} and {1, 3} replicate.
  // Groups of 1: every rank alone, all four replicas. Default: one group.
  for (int r = 0; r < kWorld; ++r) {
    const double replicas2 = r % 2 == 0 ? 1 + 4 : 2 + 8;
    EXPECT_EQ(seen[r], (std::vector<double>{static_cast<double>(r % 2), 2, 2, replicas2, 0, 1, 4, 15,
                                            static_cast<double>(r), 4, 1, static_cast<double>(1 << r)}))
        << "rank " << r;
  }
}

TEST(CommGroups, AShardGroupSizeThatDoesNotDivideTheWorldIsNamed) {
  const std::vector<std::string> failures =
      on_every_rank([&](int, Comm& world) { const ShardGroups groups(world, 3, "zero3"); });
  for (const std::string& failure : failures) {
    EXPECT_EQ(failure, "strategy.shard_group_size = 3: must divide the world size 4 (strategy 'zero3')");
  }
}

#endif  // TRAINER_TESTS_HAVE_GLOO

TEST(CommGroups, ABackendWithoutSubGroupsSaysSo) {
  testing::StubComm minimal(0, 4);
  try {
    const ShardGroups groups(minimal, 2, "zero1");
    FAIL() << "split without sub-groups";
  } catch (const TrainingError& error) {
    EXPECT_NE(std::string(error.what()).find("offers no sub-groups (Comm::split)"), std::string::npos) << error.what();
  }
  // One process: a split is a group of one.
  std::unique_ptr<Comm> single = make_single_process_comm();
  EXPECT_EQ(single->split(0, 0)->world_size(), 1);
}

}  // namespace
}  // namespace trainer
