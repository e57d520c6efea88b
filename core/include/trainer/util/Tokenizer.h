// A Hugging Face fast tokenizer (tokenizer.json) of the byte-level BPE
// family: Qwen2/Qwen3, Llama 3, GPT-2.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trainer {

/// What is read from tokenizer.json: the normalizer (none or NFC), the
/// pre-tokenizer (a Split on a regular expression with behaviour Isolated
/// followed by ByteLevel without its own regex, or ByteLevel with GPT-2's
/// regex), the BPE model (vocabulary, merges, ignore_merges) and the added
/// tokens. The pre-tokenizer's pattern runs in PCRE2 (Unicode properties
/// such as \p{L} and \p{N}); normalization in utf8proc. Anything else - a
/// WordPiece or Unigram model, another normalizer, byte_fallback, an added
/// token with lstrip/rstrip/single_word - is refused by load() with an
/// error naming the file and what is unsupported: a different tokenizer is
/// never approximated. Immutable after load; encode() may be called from
/// several threads at once.
class Tokenizer {
 public:
  /// Reads `path`: a tokenizer.json, or a directory holding one. A
  /// tokenizer_config.json beside it gives the BOS and EOS tokens. Throws
  /// InputError naming the file (and the key) on anything it cannot read.
  static std::shared_ptr<const Tokenizer> load(const std::string& path);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  /// The ids of `text`, with added and special tokens written in it
  /// recognised and nothing added around it (Hugging Face's
  /// `encode(text, add_special_tokens=False)`). Invalid UTF-8 reads as
  /// U+FFFD for each maximal invalid subpart, as Python's
  /// `bytes.decode("utf-8", errors="replace")` does.
  std::vector<int64_t> encode(std::string_view text) const;

  /// One more than the largest id of the vocabulary and the added tokens.
  int64_t vocab_size() const;
  /// The id of `token` (a vocabulary entry in its byte-level spelling, or an added token).
  std::optional<int64_t> token_id(const std::string& token) const;
  /// From tokenizer_config.json's bos_token / eos_token, when it names one.
  std::optional<int64_t> bos_id() const;
  std::optional<int64_t> eos_id() const;
  /// The tokenizer.json that was read.
  const std::string& path() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Whether this build has the tokenizer (it needs PCRE2 and utf8proc);
/// without them Tokenizer::load throws saying so.
bool tokenizer_available();

}  // namespace trainer
