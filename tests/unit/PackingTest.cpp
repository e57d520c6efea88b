// Packing documents into windows: the best-fit rule, what a long document
// becomes, and the packed sample's boundaries (trainer/util/Packing.h).
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>

#include "trainer/util/Packing.h"

namespace trainer {
namespace {

using Windows = std::vector<std::vector<int64_t>>;

// Worked by hand, capacity 8: 5 opens window 0 (room 3); 3 fills it; 4
// opens window 1 (room 4); 2 goes there (room 2, the only one that fits);
// 6 opens window 2.
TEST(Packing, EachDocumentGoesToTheFullestWindowThatHoldsIt) {
  EXPECT_EQ(pack_documents({5, 3, 4, 2, 6}, 8), (Windows{{0, 1}, {2, 3}, {4}}));
  // Best fit, not first fit: 2 goes to the window with room 2 (window 1),
  // not the earlier one with room 4 (window 0).
  EXPECT_EQ(pack_documents({4, 6, 2}, 8), (Windows{{0}, {1, 2}}));
  // Equal room: the earlier window.
  EXPECT_EQ(pack_documents({4, 4, 2}, 6), (Windows{{0, 2}, {1}}));
  // Windows keep their documents in order; every document lands once.
  const std::vector<int64_t> lengths = {7, 1, 3, 8, 2, 2, 5, 4, 6, 1};
  const Windows windows = pack_documents(lengths, 8);
  std::set<int64_t> seen;
  for (const auto& window : windows) {
    int64_t used = 0;
    for (size_t i = 0; i < window.size(); ++i) {
      used += lengths[static_cast<size_t>(window[i])];
      if (i > 0) {
        EXPECT_LT(window[i - 1], window[i]);
      }
      EXPECT_TRUE(seen.insert(window[i]).second);
    }
    EXPECT_LE(used, 8);
  }
  EXPECT_EQ(seen.size(), lengths.size());
  EXPECT_THROW(pack_documents({9}, 8), std::invalid_argument);
}

Sample document(int32_t first, size_t length) {
  Sample sample;
  for (size_t i = 0; i < length; ++i) sample.tokens.push_back(first + static_cast<int32_t>(i));
  sample.target.assign(length, 1);
  sample.target[0] = 0;
  return sample;
}

TEST(Packing, ALongDocumentIsSplitTruncatedOrRefused) {
  const Sample ten = document(0, 10);
  // Split into windows of 4: pieces from tokens 0, 3 and 6, overlapping by
  // one, so each token but the first is a target exactly once.
  const std::vector<Sample> pieces = fit_document(ten, 4, LongDocuments::Split);
  ASSERT_EQ(pieces.size(), 3u);
  std::multiset<int32_t> predicted;
  for (const Sample& piece : pieces) {
    EXPECT_LE(piece.tokens.size(), 4u);
    EXPECT_EQ(piece.target[0], 0) << "the previous piece predicts it";
    for (size_t i = 0; i < piece.tokens.size(); ++i) {
      if (piece.target[i]) predicted.insert(piece.tokens[i]);
    }
  }
  EXPECT_EQ(pieces[1].tokens.front(), 3);
  EXPECT_EQ(pieces[2].tokens.front(), 6);
  EXPECT_EQ(predicted, (std::multiset<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  const std::vector<Sample> truncated = fit_document(ten, 4, LongDocuments::Truncate);
  ASSERT_EQ(truncated.size(), 1u);
  EXPECT_EQ(truncated[0].tokens, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_THROW(fit_document(ten, 4, LongDocuments::Refuse), std::runtime_error);
  EXPECT_EQ(fit_document(ten, 10, LongDocuments::Refuse).size(), 1u) << "it fits";
  EXPECT_EQ(long_documents_from("split"), LongDocuments::Split);
  EXPECT_THROW(long_documents_from("drop"), std::invalid_argument);
}

TEST(Packing, APackedSampleMarksEachDocumentAndNoFirstTokenIsATarget) {
  Sample a = document(10, 3), b = document(20, 4);
  b.target[0] = 1;  // a dataset's mistake: the packed sample still drops it
  const Sample packed = concatenate_documents({&a, &b});
  EXPECT_EQ(packed.tokens, (std::vector<int32_t>{10, 11, 12, 20, 21, 22, 23}));
  EXPECT_EQ(packed.target, (std::vector<uint8_t>{0, 1, 1, 0, 1, 1, 1}));
  EXPECT_EQ(packed.document_starts, (std::vector<int64_t>{0, 3}));
}

}  // namespace
}  // namespace trainer
