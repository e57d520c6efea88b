// The tokenizer against Hugging Face tokenizers: Qwen3's real tokenizer.json
// (scripts/fetch-tokenizer.sh) on a varied corpus, ids compared with those
// `tokenizers` 0.23.2 produced on the GPU machine (bench/tokenizer_reference.py,
// checked in as tests/data/tokenizer/qwen3-expected.json); and what it refuses.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "TestSupport.h"
#include "trainer/Errors.h"
#include "trainer/util/JsonSupport.h"
#include "trainer/util/Tokenizer.h"

namespace trainer {
namespace {

const std::string kQwen3 = testing::qwen3_tokenizer_dir();

std::string from_hex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return bytes;
}

std::string shown(const std::vector<int64_t>& ids) {
  std::string s;
  for (const int64_t id : ids) s += std::to_string(id) + " ";
  return s;
}

std::shared_ptr<const Tokenizer> qwen3() {
  if (!std::filesystem::exists(kQwen3 + "/tokenizer.json")) {
    ADD_FAILURE() << kQwen3 << "/tokenizer.json is missing: run scripts/fetch-tokenizer.sh";
    return nullptr;
  }
  return Tokenizer::load(kQwen3);
}

TEST(Tokenizer, Qwen3IdsEqualHuggingFaceTokenizers) {
  ASSERT_TRUE(tokenizer_available()) << "built without PCRE2/utf8proc";
  const auto tokenizer = qwen3();
  ASSERT_NE(tokenizer, nullptr);
  const Json corpus = json_parse(read_file(source_path("tests/data/tokenizer/corpus.json")));
  const Json expected = json_parse(read_file(source_path("tests/data/tokenizer/qwen3-expected.json")));
  ASSERT_EQ(corpus["texts"].size(), expected["texts"].size());
  size_t ids = 0;
  for (size_t i = 0; i < corpus["texts"].size(); ++i) {
    const std::string text = corpus["texts"][i].get<std::string>();
    const std::vector<int64_t> want = expected["texts"][i].get<std::vector<int64_t>>();
    EXPECT_EQ(tokenizer->encode(text), want) << "text " << i << ": " << text.substr(0, 80) << "\n got  "
                                             << shown(tokenizer->encode(text)) << "\n want " << shown(want);
    ids += want.size();
  }
  ASSERT_EQ(corpus["invalid_utf8_hex"].size(), expected["invalid_utf8"].size());
  for (size_t i = 0; i < corpus["invalid_utf8_hex"].size(); ++i) {
    const std::string bytes = from_hex(corpus["invalid_utf8_hex"][i].get<std::string>());
    const std::vector<int64_t> want = expected["invalid_utf8"][i].get<std::vector<int64_t>>();
    EXPECT_EQ(tokenizer->encode(bytes), want)
        << "invalid UTF-8 " << i << "\n got  " << shown(tokenizer->encode(bytes)) << "\n want " << shown(want);
  }
  EXPECT_GT(ids, 800u);  // the corpus is what it claims to be
}

TEST(Tokenizer, Qwen3SpecialTokensAndVocabularySize) {
  const auto tokenizer = qwen3();
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 151669);  // 151643 BPE entries + 26 added tokens
  EXPECT_EQ(tokenizer->token_id("<|im_end|>"), 151645);
  EXPECT_EQ(tokenizer->eos_id(), 151645);         // tokenizer_config.json: eos_token "<|im_end|>"
  EXPECT_FALSE(tokenizer->bos_id().has_value());  // bos_token null
  EXPECT_EQ(tokenizer->encode("<|im_end|><|im_end|>"), (std::vector<int64_t>{151645, 151645}));
  EXPECT_TRUE(tokenizer->encode("").empty());
}

// A minimal byte-level BPE file: the 256 byte characters, one merge, and
// whatever `patch` changes; the loader must refuse what it cannot reproduce.
std::string small_tokenizer(const std::string& dir, const std::function<void(Json&)>& patch) {
  Json vocab = Json::object();
  int id = 0;
  uint32_t next = 256;  // GPT-2's characters for the bytes that are not printable
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const uint32_t cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    vocab[s] = id++;
  }
  vocab["ab"] = id++;
  Json root = {{"normalizer", nullptr},
               {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
               {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", Json::array({"a b"})}}},
               {"added_tokens", Json::array({{{"id", id}, {"content", "<eos>"}, {"special", true}}})}};
  patch(root);
  std::filesystem::create_directories(dir);
  return write_file(dir + "/tokenizer.json", root.dump());
}

TEST(Tokenizer, SmallByteLevelFileEncodes) {
  const std::string path = small_tokenizer(scratch_dir("TokenizerSmall"), [](Json&) {});
  const auto tokenizer = Tokenizer::load(path);
  // Bytes take ids 0..255 in byte order, "ab" 256, "<eos>" 257.
  const std::vector<int64_t> ids = tokenizer->encode("ab<eos>b");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], 256);  // the merge "a b"
  EXPECT_EQ(ids[1], 257);  // the added token
  EXPECT_EQ(ids[2], tokenizer->token_id("b"));
  EXPECT_EQ(tokenizer->vocab_size(), 258);
}

// Merge order by hand: the pair of lowest rank first, the leftmost of equal
// ranks first; "a b" ranks 0, "a a" 1, "aa aa" 2.
TEST(Tokenizer, MergesApplyLowestRankThenLeftmost) {
  const std::string path = small_tokenizer(scratch_dir("TokenizerMergeOrder"), [](Json& r) {
    const int64_t next = r["added_tokens"][0]["id"].get<int64_t>();
    r["model"]["vocab"]["aa"] = next;
    r["model"]["vocab"]["aaaa"] = next + 1;
    r["added_tokens"][0]["id"] = next + 2;
    r["model"]["merges"] = Json::array({"a b", "a a", "aa aa"});
  });
  const auto t = Tokenizer::load(path);
  const int64_t a = *t->token_id("a"), ab = *t->token_id("ab"), aa = *t->token_id("aa"), aaaa = *t->token_id("aaaa");
  EXPECT_EQ(t->encode("aaa"), (std::vector<int64_t>{aa, a}));  // leftmost of two equal pairs
  EXPECT_EQ(t->encode("aab"), (std::vector<int64_t>{a, ab}));  // "a b" outranks "a a"
  EXPECT_EQ(t->encode("aaaaaaa"), (std::vector<int64_t>{aaaa, aa, a}));
  // One pre-tokenizer piece of 100,000 bytes (quadratic merging took minutes
  // on such pieces): 25,000 "aaaa".
  const std::vector<int64_t> long_piece = t->encode(std::string(100000, 'a'));
  EXPECT_EQ(long_piece, std::vector<int64_t>(25000, aaaa));
}

TEST(Tokenizer, UnsupportedFilesAreRefusedNamingWhat) {
  const std::string base = scratch_dir("TokenizerBad");
  const std::vector<std::pair<std::function<void(Json&)>, std::string>> cases = {
      {[](Json& r) { r["model"]["type"] = "WordPiece"; }, "model type 'WordPiece' is not supported"},
      {[](Json& r) {
         r["normalizer"] = {{"type", "NFKC"}};
       },
       "normalizer 'NFKC' is not supported"},
      {[](Json& r) { r["model"]["byte_fallback"] = true; }, "byte_fallback"},
      {[](Json& r) {
         r["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "pre_tokenizer 'Whitespace' is not supported"},
      {[](Json& r) { r["pre_tokenizer"] = nullptr; }, "only byte-level BPE"},
      {[](Json& r) { r["added_tokens"][0]["lstrip"] = true; }, "lstrip = true is not supported"},
      {[](Json& r) { r["model"]["merges"] = Json::array({"a c"}); }, "names a token the vocabulary lacks"},
      {[](Json& r) {
         r["pre_tokenizer"] = {
             {"type", "Sequence"},
             {"pretokenizers",
              Json::array({{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
                           {{"type", "ByteLevel"}, {"use_regex", false}}})}};
       },
       "does not compile"},
      // Fields of the wrong JSON type: named, not a library's type_error.
      {[](Json& r) { r["model"]["type"] = 5; }, "model.type: expected a string, got number"},
      {[](Json& r) {
         r["pre_tokenizer"] = Json::array({1, 2});
       },
       "pre_tokenizer: expected an object, got array"},
      {[](Json& r) {
         r["normalizer"] = {{"type", true}};
       },
       "normalizer.type: expected a string, got boolean"},
      {[](Json& r) { r["model"]["vocab"]["ab"] = "x"; }, "model.vocab['ab']: expected an id"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = small_tokenizer(base + "/" + std::to_string(i), cases[i].first);
    try {
      Tokenizer::load(path);
      ADD_FAILURE() << "case " << i << " loaded";
    } catch (const InputError& error) {
      EXPECT_NE(std::string(error.what()).find(cases[i].second), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
    }
  }
  try {
    Tokenizer::load(base + "/nowhere");
    ADD_FAILURE() << "a missing file loaded";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("no tokenizer.json"), std::string::npos) << error.what();
  }
  const std::string broken = write_file(base + "/broken/tokenizer.json", "{\"model\": ");
  EXPECT_THROW(Tokenizer::load(broken), InputError);
}

}  // namespace
}  // namespace trainer
