// Tokenizer: Hugging Face's byte-level BPE read from tokenizer.json. One
// file: the six steps below are one pipeline whose ids must equal HF's.
//
// encode(text):
//   1. invalid UTF-8 -> U+FFFD per maximal subpart (Python's "replace");
//   2. added tokens found in the raw text, longest first at each position;
//      the text between them goes through 3-6;
//   3. normalizer (NFC, utf8proc) when there is one;
//   4. pre-tokenizer: the pattern's matches and the gaps between them are
//      the pieces (Split, behaviour Isolated), PCRE2 with Unicode properties;
//   5. each piece's bytes mapped to GPT-2's printable characters (ByteLevel);
//   6. BPE: with ignore_merges a piece found whole in the vocabulary is one
//      token; otherwise the pair of lowest merge rank (leftmost on ties) is
//      merged until none is left.
#include "trainer/util/Tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <unordered_map>

#include <fmt/format.h>

#include "trainer/Errors.h"
#include "trainer/util/JsonSupport.h"
#include "util/Files.h"

#ifdef TRAINER_HAS_TOKENIZER
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>
#endif

namespace trainer {

namespace fs = std::filesystem;
// Sorted objects: the vocabulary has ~150k keys (Json's ordered objects insert in linear time).
using TokenizerJson = nlohmann::json;

#ifdef TRAINER_HAS_TOKENIZER

namespace {

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex = true).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string read_text(const fs::path& path) {
  std::optional<std::string> text = read_file(path);
  if (!text) throw InputError(fmt::format("{}: cannot be read", path.string()));
  return std::move(*text);
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Valid UTF-8 with each maximal invalid subpart replaced by U+FFFD (the
// Unicode standard's recommended practice, which Python's decoder follows):
// a lead byte starts a subpart that ends at the first byte outside the range
// its position allows; that byte then starts afresh.
std::string replace_invalid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    int length = 0;
    unsigned char low = 0x80, high = 0xBF;  // the allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) {
      length = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      length = 3;
      if (b == 0xE0) low = 0xA0;
      if (b == 0xED) high = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      length = 4;
      if (b == 0xF0) low = 0x90;
      if (b == 0xF4) high = 0x8F;
    }
    if (length == 0) {  // 0x80..0xC1, 0xF5..0xFF: never a lead byte
      append_utf8(out, 0xFFFD);
      ++i;
      continue;
    }
    size_t k = 1;
    for (; k < static_cast<size_t>(length) && i + k < n; ++k) {
      const unsigned char c = s[i + k];
      const bool ok = k == 1 ? (c >= low && c <= high) : (c >= 0x80 && c <= 0xBF);
      if (!ok) break;
    }
    if (k == static_cast<size_t>(length)) {
      out.append(text.substr(i, k));
    } else {
      append_utf8(out, 0xFFFD);
    }
    i += k;
  }
  return out;
}

std::string nfc(const std::string& text) {
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &mapped, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (length < 0) {  // the input is valid UTF-8 by now; only memory can fail
    throw std::runtime_error(std::string("NFC normalization failed: ") + utf8proc_errmsg(length));
  }
  std::string out(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
  free(mapped);
  return out;
}

// GPT-2's reversible map of the 256 byte values to printable characters:
// '!'..'~', U+00A1..U+00AC and U+00AE..U+00FF stand for themselves, the
// other 68 bytes for U+0100 onwards in byte order. Each as UTF-8.
std::vector<std::string> byte_level_alphabet() {
  std::vector<std::string> alphabet(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    append_utf8(alphabet[b], printable ? b : next++);
  }
  return alphabet;
}

struct AddedToken {
  std::string content;
  int64_t id;
};

struct Merge {
  int32_t rank;
  int32_t id;  ///< the merged symbol
};

// The pattern, compiled once (JIT where available); matches use their own match data.
class Pattern {
 public:
  Pattern(const std::string& pattern, const std::string& where) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &error,
                          &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      throw InputError(fmt::format("{}: the pre-tokenizer's pattern does not compile at offset {}: {}", where, offset,
                                   reinterpret_cast<const char*>(message)));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Pattern() { pcre2_code_free(code_); }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;

  // Calls piece(begin, end) for every match and every gap between matches, in order.
  template <typename F>
  void split(const std::string& text, F&& piece) const {
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(code_, nullptr);
    const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t at = 0, emitted = 0;
    while (at < text.size()) {
      const int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), at, PCRE2_NO_UTF_CHECK, match, nullptr)
                          : pcre2_match(code_, subject, text.size(), at, PCRE2_NO_UTF_CHECK, match, nullptr);
      if (rc < 0) break;  // no further match (or a resource limit: the rest is one gap)
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
      const size_t begin = ovector[0], end = ovector[1];
      if (begin > emitted) piece(emitted, begin);
      if (end > begin) {
        piece(begin, end);
        emitted = end;
        at = end;
      } else {  // an empty match: step over one character
        at = begin + 1;
        while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
      }
    }
    if (emitted < text.size()) piece(emitted, text.size());
    pcre2_match_data_free(match);
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

}  // namespace

struct Tokenizer::Impl {
  std::string path;
  bool normalize_nfc = false;
  bool add_prefix_space = false;
  bool ignore_merges = false;
  std::unique_ptr<Pattern> pattern;
  std::unordered_map<std::string, int32_t> vocab;
  std::unordered_map<uint64_t, Merge> merges;  ///< (left id << 32 | right id)
  std::vector<int32_t> byte_ids;               ///< the id of each byte's character
  std::vector<std::string> alphabet;
  std::vector<AddedToken> added;  ///< longest first
  bool added_first_byte[256] = {};
  int64_t vocab_size = 0;
  std::optional<int64_t> bos, eos;

  [[noreturn]] void fail(const std::string& what) const { throw InputError(fmt::format("{}: {}", path, what)); }

  void bpe(const std::string& piece, std::vector<int64_t>& ids) const {
    std::string mapped;
    for (const unsigned char b : piece) mapped += alphabet[b];
    if (ignore_merges) {
      const auto whole = vocab.find(mapped);
      if (whole != vocab.end()) {
        ids.push_back(whole->second);
        return;
      }
    }
    // The merges in rank order, leftmost first on ties, as Hugging Face
    // tokenizers applies them, in O(n log n): the symbols form a linked list
    // and every adjacent pair that has a merge waits in a heap keyed by
    // (rank, position of its left symbol); an entry whose symbols changed
    // since it was pushed is skipped when it comes up.
    const size_t n = piece.size();
    std::vector<int32_t> symbol(n);
    std::vector<int64_t> next(n), prev(n);
    for (size_t i = 0; i < n; ++i) {
      symbol[i] = byte_ids[static_cast<unsigned char>(piece[i])];
      next[i] = static_cast<int64_t>(i) + 1 < static_cast<int64_t>(n) ? static_cast<int64_t>(i) + 1 : -1;
      prev[i] = static_cast<int64_t>(i) - 1;
    }
    struct Candidate {
      int32_t rank;
      int64_t left, right;
      int32_t left_symbol, right_symbol, merged;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
    const auto offer = [&](int64_t left) {
      if (left < 0 || next[left] < 0) return;
      const int64_t right = next[left];
      const auto it = merges.find(static_cast<uint64_t>(static_cast<uint32_t>(symbol[left])) << 32 |
                                  static_cast<uint32_t>(symbol[right]));
      if (it != merges.end()) queue.push({it->second.rank, left, right, symbol[left], symbol[right], it->second.id});
    };
    for (size_t i = 0; i + 1 < n; ++i) offer(static_cast<int64_t>(i));
    std::vector<bool> gone(n, false);
    while (!queue.empty()) {
      const Candidate c = queue.top();
      queue.pop();
      if (gone[c.left] || gone[c.right] || next[c.left] != c.right || symbol[c.left] != c.left_symbol ||
          symbol[c.right] != c.right_symbol) {
        continue;  // stale: one of its symbols has merged since
      }
      symbol[c.left] = c.merged;
      gone[c.right] = true;
      next[c.left] = next[c.right];
      if (next[c.right] >= 0) prev[next[c.right]] = c.left;
      offer(prev[c.left]);
      offer(c.left);
    }
    for (int64_t i = n > 0 ? 0 : -1; i >= 0; i = next[i]) ids.push_back(symbol[i]);
  }

  void encode_plain(const std::string& segment, std::vector<int64_t>& ids) const {
    if (segment.empty()) return;
    std::string text = normalize_nfc ? nfc(segment) : segment;
    if (add_prefix_space && text[0] != ' ') text.insert(text.begin(), ' ');
    pattern->split(text, [&](size_t begin, size_t end) { bpe(text.substr(begin, end - begin), ids); });
  }

  // The added token that starts at `at`, longest first; nullptr when none.
  const AddedToken* added_at(const std::string& text, size_t at) const {
    if (!added_first_byte[static_cast<unsigned char>(text[at])]) return nullptr;
    for (const AddedToken& token : added) {
      if (text.compare(at, token.content.size(), token.content) == 0) return &token;
    }
    return nullptr;
  }
};

namespace {

bool flag(const TokenizerJson& object, const char* key, bool otherwise) {
  const TokenizerJson* v = json_find(object, key);
  return v && v->is_boolean() ? v->get<bool>() : otherwise;
}

// `object`'s string `key` (`where` names the object in messages): `otherwise`
// when absent; a value of another JSON type, or an `object` that is not an
// object, is an error naming both.
std::string text_field(const TokenizerJson& object, const char* key, const std::string& otherwise,
                       const std::string& where, const Tokenizer::Impl& t) {
  if (!object.is_object()) t.fail(fmt::format("{}: expected an object, got {}", where, object.type_name()));
  const TokenizerJson* v = json_find(object, key);
  if (!v || v->is_null()) return otherwise;
  if (!v->is_string()) t.fail(fmt::format("{}.{}: expected a string, got {}", where, key, v->type_name()));
  return v->get<std::string>();
}

void read_normalizer(const TokenizerJson& root, Tokenizer::Impl& t) {
  const TokenizerJson* n = json_find(root, "normalizer");
  if (!n || n->is_null()) return;
  std::vector<const TokenizerJson*> steps{n};
  if (text_field(*n, "type", "", "normalizer", t) == "Sequence") {
    steps.clear();
    const TokenizerJson* list = json_find(*n, "normalizers");
    if (!list || !list->is_array()) t.fail("normalizer.normalizers: expected a list");
    for (const TokenizerJson& step : *list) steps.push_back(&step);
  }
  for (const TokenizerJson* step : steps) {
    const std::string name = text_field(*step, "type", "?", "normalizer", t);
    if (name != "NFC") t.fail(fmt::format("normalizer '{}' is not supported (supported: none, NFC)", name));
    t.normalize_nfc = true;
  }
}

void read_pre_tokenizer(const TokenizerJson& root, Tokenizer::Impl& t) {
  const TokenizerJson* p = json_find(root, "pre_tokenizer");
  if (!p || p->is_null()) t.fail("no pre_tokenizer: only byte-level BPE tokenizers are supported");
  std::vector<const TokenizerJson*> steps{p};
  if (text_field(*p, "type", "", "pre_tokenizer", t) == "Sequence") {
    steps.clear();
    const TokenizerJson* list = json_find(*p, "pretokenizers");
    if (!list || !list->is_array()) t.fail("pre_tokenizer.pretokenizers: expected a list");
    for (const TokenizerJson& step : *list) steps.push_back(&step);
  }
  std::string pattern;
  bool byte_level = false;
  for (const TokenizerJson* step : steps) {
    const std::string type = text_field(*step, "type", "?", "pre_tokenizer", t);
    if (byte_level) t.fail(fmt::format("pre_tokenizer '{}' after ByteLevel is not supported", type));
    if (type == "Split") {
      if (!pattern.empty()) t.fail("more than one Split pre-tokenizer is not supported");
      const TokenizerJson* pattern_spec = json_find(*step, "pattern");
      const TokenizerJson* regex = pattern_spec ? json_find(*pattern_spec, "Regex") : nullptr;
      if (!regex || !regex->is_string()) t.fail("pre_tokenizer Split: only a Regex pattern is supported");
      const std::string behavior = text_field(*step, "behavior", "?", "pre_tokenizer Split", t);
      if (behavior != "Isolated") {
        t.fail(fmt::format("pre_tokenizer Split: behavior '{}' is not supported (supported: Isolated)", behavior));
      }
      if (flag(*step, "invert", false)) t.fail("pre_tokenizer Split: invert = true is not supported");
      pattern = regex->get<std::string>();
    } else if (type == "ByteLevel") {
      byte_level = true;
      t.add_prefix_space = flag(*step, "add_prefix_space", false);
      if (flag(*step, "use_regex", true)) {
        if (!pattern.empty()) t.fail("pre_tokenizer: a Split and ByteLevel's own regex together are not supported");
        pattern = kGpt2Pattern;
      }
    } else {
      t.fail(fmt::format("pre_tokenizer '{}' is not supported (supported: Split with a Regex, ByteLevel)", type));
    }
  }
  if (!byte_level) t.fail("the pre_tokenizer has no ByteLevel step: only byte-level BPE tokenizers are supported");
  if (pattern.empty()) t.fail("the pre_tokenizer splits on nothing (no Split and ByteLevel use_regex = false)");
  t.pattern = std::make_unique<Pattern>(pattern, t.path);
}

void read_model(const TokenizerJson& root, Tokenizer::Impl& t) {
  const TokenizerJson* m = json_find(root, "model");
  if (!m || !m->is_object()) t.fail("no model");
  const std::string type = text_field(*m, "type", "?", "model", t);
  if (type != "BPE") t.fail(fmt::format("model type '{}' is not supported (supported: BPE)", type));
  if (const TokenizerJson* d = json_find(*m, "dropout"); d && !d->is_null()) t.fail("model.dropout is not supported");
  if (flag(*m, "byte_fallback", false)) t.fail("model.byte_fallback = true is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const TokenizerJson* v = json_find(*m, key);
    if (v && !v->is_null() && !(v->is_string() && v->get<std::string>().empty())) {
      t.fail(fmt::format("model.{} is not supported (byte-level BPE has none)", key));
    }
  }
  t.ignore_merges = flag(*m, "ignore_merges", false);
  const TokenizerJson* vocab = json_find(*m, "vocab");
  if (!vocab || !vocab->is_object()) t.fail("model.vocab: expected an object of token -> id");
  for (const auto& [token, id] : vocab->items()) {
    if (!json_is_int64(id) || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      t.fail(fmt::format("model.vocab['{}']: expected an id in [0, 2^31)", token));
    }
    t.vocab.emplace(token, static_cast<int32_t>(id.get<int64_t>()));
    t.vocab_size = std::max<int64_t>(t.vocab_size, id.get<int64_t>() + 1);
  }
  t.alphabet = byte_level_alphabet();
  for (int b = 0; b < 256; ++b) {
    const auto it = t.vocab.find(t.alphabet[b]);
    if (it == t.vocab.end()) t.fail(fmt::format("model.vocab lacks the byte-level character of byte {}", b));
    t.byte_ids.push_back(it->second);
  }
  const TokenizerJson* merges = json_find(*m, "merges");
  if (!merges || !merges->is_array()) t.fail("model.merges: expected a list");
  int32_t rank = 0;
  for (const TokenizerJson& merge : *merges) {
    std::string left, right;
    if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else if (merge.is_string() && merge.get<std::string>().find(' ') != std::string::npos) {
      const std::string s = merge.get<std::string>();
      left = s.substr(0, s.find(' '));
      right = s.substr(s.find(' ') + 1);
    } else {
      t.fail(fmt::format("model.merges[{}]: expected [\"a\", \"b\"] or \"a b\"", rank));
    }
    const auto l = t.vocab.find(left), r = t.vocab.find(right), merged = t.vocab.find(left + right);
    if (l == t.vocab.end() || r == t.vocab.end() || merged == t.vocab.end()) {
      t.fail(fmt::format("model.merges[{}]: '{}' + '{}' names a token the vocabulary lacks", rank, left, right));
    }
    // The first (lowest-ranked) occurrence of a pair wins, as in Hugging Face's BPE.
    t.merges.emplace(static_cast<uint64_t>(static_cast<uint32_t>(l->second)) << 32 | static_cast<uint32_t>(r->second),
                     Merge{rank, merged->second});
    ++rank;
  }
}

void read_added_tokens(const TokenizerJson& root, Tokenizer::Impl& t) {
  const TokenizerJson* added = json_find(root, "added_tokens");
  if (!added || added->is_null()) return;
  if (!added->is_array()) t.fail("added_tokens: expected a list");
  for (const TokenizerJson& token : *added) {
    const TokenizerJson* id = json_find(token, "id");
    const TokenizerJson* content = json_find(token, "content");
    if (!id || !json_is_int64(*id) || id->get<int64_t>() < 0 || !content || !content->is_string() ||
        content->get<std::string>().empty()) {
      t.fail("added_tokens: each entry needs an id >= 0 and a non-empty content");
    }
    const std::string text = content->get<std::string>();
    for (const char* key : {"lstrip", "rstrip", "single_word"}) {
      if (flag(token, key, false)) t.fail(fmt::format("added token '{}': {} = true is not supported", text, key));
    }
    if (flag(token, "normalized", false) && t.normalize_nfc && nfc(text) != text) {
      t.fail(fmt::format("added token '{}': normalized = true with a text that NFC changes is not supported", text));
    }
    t.added.push_back(AddedToken{text, id->get<int64_t>()});
    t.added_first_byte[static_cast<unsigned char>(text[0])] = true;
    t.vocab_size = std::max<int64_t>(t.vocab_size, id->get<int64_t>() + 1);
  }
  std::stable_sort(t.added.begin(), t.added.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
}

// tokenizer_config.json's bos_token / eos_token: a string or {"content": ...}.
std::optional<int64_t> special_of(const TokenizerJson& config, const char* key, const fs::path& file,
                                  const Tokenizer& t) {
  const TokenizerJson* v = json_find(config, key);
  if (!v || v->is_null()) return std::nullopt;
  const TokenizerJson* content = v->is_object() ? json_find(*v, "content") : v;
  if (!content || !content->is_string()) {
    throw InputError(fmt::format("{}: {}: expected a token (a string or {{\"content\": ...}})", file.string(), key));
  }
  const std::optional<int64_t> id = t.token_id(content->get<std::string>());
  if (!id) {
    throw InputError(
        fmt::format("{}: {} '{}' is not a token of {}", file.string(), key, content->get<std::string>(), t.path()));
  }
  return id;
}

}  // namespace

std::shared_ptr<const Tokenizer> Tokenizer::load(const std::string& where) {
  fs::path file = where;
  if (fs::is_directory(file)) file /= "tokenizer.json";
  if (!fs::is_regular_file(file)) {
    throw InputError(fmt::format("{}: no tokenizer.json (expected the file or a directory holding it)", where));
  }
  auto impl = std::make_unique<Impl>();
  impl->path = file.string();
  TokenizerJson root;
  try {
    root = json_parse_as<TokenizerJson>(read_text(file));
  } catch (const std::runtime_error& error) {
    throw InputError(fmt::format("{}: not valid JSON: {}", file.string(), error.what()));
  }
  if (!root.is_object()) impl->fail("expected a JSON object");
  try {
    read_normalizer(root, *impl);
    read_pre_tokenizer(root, *impl);
    read_model(root, *impl);
    read_added_tokens(root, *impl);
  } catch (const nlohmann::json::exception& error) {  // a field of a JSON type no check above foresaw
    impl->fail(fmt::format("a field has an unexpected JSON type ({})", error.what()));
  }
  std::shared_ptr<Tokenizer> tokenizer(new Tokenizer(std::move(impl)));
  const fs::path config = file.parent_path() / "tokenizer_config.json";
  if (fs::is_regular_file(config)) {
    TokenizerJson c;
    try {
      c = json_parse_as<TokenizerJson>(read_text(config));
    } catch (const std::runtime_error& error) {
      throw InputError(fmt::format("{}: not valid JSON: {}", config.string(), error.what()));
    }
    tokenizer->impl_->bos = special_of(c, "bos_token", config, *tokenizer);
    tokenizer->impl_->eos = special_of(c, "eos_token", config, *tokenizer);
  }
  return tokenizer;
}

std::vector<int64_t> Tokenizer::encode(std::string_view raw) const {
  const std::string text = replace_invalid_utf8(raw);
  std::vector<int64_t> ids;
  size_t segment = 0;
  for (size_t at = 0; at < text.size();) {
    const AddedToken* token = impl_->added_at(text, at);
    if (!token) {
      ++at;
      continue;
    }
    impl_->encode_plain(text.substr(segment, at - segment), ids);
    ids.push_back(token->id);
    at += token->content.size();
    segment = at;
  }
  impl_->encode_plain(text.substr(segment), ids);
  return ids;
}

std::optional<int64_t> Tokenizer::token_id(const std::string& token) const {
  for (const AddedToken& a : impl_->added) {
    if (a.content == token) return a.id;
  }
  const auto it = impl_->vocab.find(token);
  if (it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

bool tokenizer_available() { return true; }

#else  // no PCRE2 / utf8proc in this build

struct Tokenizer::Impl {
  std::string path;
  int64_t vocab_size = 0;
  std::optional<int64_t> bos, eos;
};

std::shared_ptr<const Tokenizer> Tokenizer::load(const std::string& where) {
  throw InputError(
      fmt::format("{}: this trainer was built without the tokenizer (it needs PCRE2 and utf8proc: "
                  "libpcre2-dev, libutf8proc-dev)",
                  where));
}

std::vector<int64_t> Tokenizer::encode(std::string_view) const { return {}; }
std::optional<int64_t> Tokenizer::token_id(const std::string&) const { return std::nullopt; }
bool tokenizer_available() { return false; }

#endif

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int64_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int64_t> Tokenizer::eos_id() const { return impl_->eos; }
const std::string& Tokenizer::path() const { return impl_->path; }

}  // namespace trainer
