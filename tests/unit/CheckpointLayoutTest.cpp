// Who writes which elements of a checkpoint (manifest::writers) and how a
// format-3 manifest's ranges are checked: every element once, whatever
// the ranks hold (full copies, disjoint shards, replicated shards).
#include "checkpoint/Manifest.h"

#include <gtest/gtest.h>

#include <ostream>
#include <tuple>

#include "trainer/Errors.h"

namespace trainer::manifest {
namespace {

using Ranks = std::vector<std::vector<Range>>;

}  // namespace

void PrintTo(const Range& r, std::ostream* out) { *out << "g" << r.group << "[" << r.begin << ", " << r.end << ")"; }

namespace {

TEST(CheckpointLayout, FullCopiesGiveTheCanonicalChunks) {
  // ddp at world size 3: every rank holds both groups whole.
  const std::vector<int64_t> numel = {10, 4};
  const Ranks held(3, {Range{0, 0, 10}, Range{1, 0, 4}});
  std::vector<Range> problems;
  const Ranks written = writers(held, numel, &problems);
  EXPECT_TRUE(problems.empty());
  for (int r = 0; r < 3; ++r) {
    std::vector<Range> expected;
    for (size_t g = 0; g < numel.size(); ++g) {
      const Range chunk = canonical_chunk(g, numel[g], r, 3);
      if (chunk.size() > 0) expected.push_back(chunk);
    }
    EXPECT_EQ(written[r], expected) << "rank " << r;
  }
}

TEST(CheckpointLayout, DisjointShardsWriteThemselves) {
  const Ranks held = {{Range{0, 0, 3}}, {Range{0, 3, 6}}, {Range{0, 6, 7}}, {}};
  std::vector<Range> problems;
  const Ranks written = writers(held, {7}, &problems);
  EXPECT_TRUE(problems.empty());
  EXPECT_EQ(written, held);
}

TEST(CheckpointLayout, ReplicatedShardsAreSplitAmongTheirHolders) {
  // Hybrid sharding at world size 4 in shard groups of 2: ranks 0 and 2
  // hold [0, 6), ranks 1 and 3 hold [6, 11).
  const Ranks held = {{Range{0, 0, 6}}, {Range{0, 6, 11}}, {Range{0, 0, 6}}, {Range{0, 6, 11}}};
  std::vector<Range> problems;
  const Ranks written = writers(held, {11}, &problems);
  EXPECT_TRUE(problems.empty());
  const Ranks expected = {{Range{0, 0, 3}}, {Range{0, 6, 9}}, {Range{0, 3, 6}}, {Range{0, 9, 11}}};
  EXPECT_EQ(written, expected);
}

TEST(CheckpointLayout, OverlapsSplitOnceAndGapsAreReported) {
  // Rank 0 holds [0, 5), rank 1 [3, 8): [3, 5) has two holders. [8, 10) has none.
  const Ranks held = {{Range{0, 0, 5}}, {Range{0, 3, 8}, Range{0, 12, 20}}};
  std::vector<Range> problems;
  const Ranks written = writers(held, {10}, &problems);
  const Ranks expected = {{Range{0, 0, 3}, Range{0, 3, 4}}, {Range{0, 4, 5}, Range{0, 5, 8}}};
  EXPECT_EQ(written, expected);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0], (Range{0, 12, 20})) << "outside the group";
  EXPECT_EQ(problems[1], (Range{0, 8, 10})) << "held by nobody";
}

Json manifest_with(const Json& ranges0, const Json& ranges1) {
  return Json{
      {"format", kFormat},
      {"step", 2},
      {"applied_updates", 2},
      {"world_size", 2},
      {"strategy", "zero1"},
      {"fingerprint", "f"},
      {"group_numel", Json::array({6})},
      {"parameters", Json::array({Json{{"name", "w"}, {"numel", 6}, {"shape", {6}}, {"decay", true}}})},
      {"files",
       Json::array({Json{{"name", "rank-00000.safetensors"}, {"xxh3_128", "0"}, {"bytes", 1}, {"ranges", ranges0}},
                    Json{{"name", "rank-00001.safetensors"}, {"xxh3_128", "0"}, {"bytes", 1}, {"ranges", ranges1}}})}};
}

std::string refusal(const Json& manifest) {
  try {
    validate(manifest, "ckpt/step-00000002/manifest.json");
  } catch (const InputError& error) {
    return error.what();
  }
  return "";
}

TEST(CheckpointLayout, Format3RangesMustCoverEveryElementOnce) {
  const Json good = manifest_with(Json::parse("[[0, 0, 2], [0, 4, 6]]"), Json::parse("[[0, 2, 4]]"));
  EXPECT_EQ(refusal(good), "");
  const Ranks ranges = file_ranges(good, "ckpt/step-00000002/manifest.json");
  EXPECT_EQ(ranges, (Ranks{{Range{0, 0, 2}, Range{0, 4, 6}}, {Range{0, 2, 4}}}));
  for (const auto& [r0, r1, says] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"[[0, 0, 3]]", "[[0, 2, 6]]", "file 1's 'ranges' overlap another file's"},
           {"[[0, 0, 2]]", "[[0, 3, 6]]", "no file holds elements [2, 3) of group 0"},
           {"[[0, 0, 2]]", "[[0, 2, 7]]", "0 <= begin < end <= the group's elements"},
           {"[[1, 0, 2]]", "[[0, 0, 6]]", "0 <= begin < end <= the group's elements"},
           {"[[0, 2, 4], [0, 0, 2]]", "[[0, 4, 6]]", "file 0's 'ranges' must be ascending and disjoint"},
           {"[[0, 0, \"2\"]]", "[[0, 2, 6]]", "must hold [group, begin, end]"},
           {"[[0, 0]]", "[[0, 2, 6]]", "must hold [group, begin, end]"}}) {
    const std::string message = refusal(manifest_with(Json::parse(r0), Json::parse(r1)));
    EXPECT_NE(message.find(says), std::string::npos) << r0 << " " << r1 << ": " << message;
    EXPECT_NE(message.find("ckpt/step-00000002/manifest.json"), std::string::npos) << message;
  }
  Json missing = good;
  missing["files"][1].erase("ranges");
  EXPECT_NE(refusal(missing).find("missing 'ranges'"), std::string::npos) << refusal(missing);
}

TEST(CheckpointLayout, Format2FilesHoldTheCanonicalChunks) {
  Json old = manifest_with(Json::array(), Json::array());
  old["format"] = kFormat2;
  for (Json& f : old["files"]) f.erase("ranges");
  EXPECT_EQ(refusal(old), "");
  EXPECT_EQ(file_ranges(old, "m.json"), (Ranks{{Range{0, 0, 3}}, {Range{0, 3, 6}}}));
}

}  // namespace
}  // namespace trainer::manifest
