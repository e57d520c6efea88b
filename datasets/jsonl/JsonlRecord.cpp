// One record of the jsonl dataset (see JsonlRecord.h).
#include "JsonlRecord.h"

#include <stdexcept>

#include <fmt/format.h>

#include "trainer/util/JsonSupport.h"
#include "trainer/util/Tokenizer.h"

namespace trainer {

namespace {

// Byte-level tokenizer: byte b is token b; then BOS and EOS.
constexpr int32_t kBos = 256, kEos = 257, kByteVocab = 258;

std::vector<int32_t> ids(const Json& array, const char* key, int64_t vocab_size) {
  if (!array.is_array()) throw std::runtime_error(fmt::format("\"{}\" must be an array of token ids", key));
  std::vector<int32_t> out;
  for (size_t i = 0; i < array.size(); ++i) {
    const Json& id = array[i];
    if (!json_is_int64(id)) {  // 2.5, "2" and 1e2 are not ids, whatever they would round to
      throw std::runtime_error(fmt::format("\"{}\"[{}] is not an integer token id", key, i));
    }
    const int64_t value = id.get<int64_t>();
    if (value < 0 || value >= vocab_size) {
      throw std::runtime_error(
          fmt::format("\"{}\"[{}] = {} is outside [0, vocab_size = {})", key, i, value, vocab_size));
    }
    out.push_back(static_cast<int32_t>(value));
  }
  return out;
}

void check_byte_vocab(const JsonlRecordFormat& format) {
  if (format.vocab_size < kByteVocab) {
    throw std::runtime_error(
        fmt::format("text records need vocab_size >= {} (bytes, BOS, EOS) without a tokenizer", kByteVocab));
  }
}

void add_bos(std::vector<int32_t>& out, const JsonlRecordFormat& format) {
  if (!format.tokenizer) {
    check_byte_vocab(format);
    out.push_back(kBos);
  } else if (const auto bos = format.tokenizer->bos_id()) {
    out.push_back(static_cast<int32_t>(*bos));
  }
}

void add_eos(std::vector<int32_t>& out, const JsonlRecordFormat& format) {
  if (!format.tokenizer) {
    out.push_back(kEos);
  } else if (const auto eos = format.tokenizer->eos_id()) {
    out.push_back(static_cast<int32_t>(*eos));
  }
}

void tokenize(const std::string& text, std::vector<int32_t>& out, const JsonlRecordFormat& format) {
  if (!format.tokenizer) {
    check_byte_vocab(format);
    for (const unsigned char b : text) out.push_back(b);
    return;
  }
  for (const int64_t id : format.tokenizer->encode(text)) {
    if (id >= format.vocab_size) {  // the dataset checks vocab_size against the tokenizer; kept for safety
      throw std::runtime_error(fmt::format("token id {} is outside [0, vocab_size = {})", id, format.vocab_size));
    }
    out.push_back(static_cast<int32_t>(id));
  }
}

}  // namespace

Sample parse_jsonl_record(const std::string& line, const JsonlRecordFormat& format) {
  const Json record = json_parse(line);
  if (!record.is_object()) throw std::runtime_error("expected a JSON object");
  std::vector<int32_t> prompt, completion;
  bool all_targets = false;
  const Json* prompt_ids = json_find(record, "prompt_ids");
  if (prompt_ids) {
    const Json* completion_ids = json_find(record, "completion_ids");
    if (!completion_ids) throw std::runtime_error("\"prompt_ids\" without \"completion_ids\"");
    prompt = ids(*prompt_ids, "prompt_ids", format.vocab_size);
    completion = ids(*completion_ids, "completion_ids", format.vocab_size);
  } else {
    const Json* text = json_find(record, "text");
    const Json* p = json_find(record, "prompt");
    const Json* c = json_find(record, "completion");
    if (text && !p && !c) {
      if (!text->is_string()) throw std::runtime_error("\"text\" must be a string");
      // A pretraining line: everything is completion (a target), BOS and EOS around it.
      add_bos(prompt, format);
      tokenize(text->get_ref<const std::string&>(), completion, format);
      add_eos(completion, format);
      all_targets = true;
    } else {
      if (!p || !c || !p->is_string() || !c->is_string()) {
        throw std::runtime_error(
            "expected string fields \"prompt\" and \"completion\", a string \"text\", or "
            "\"prompt_ids\" and \"completion_ids\"");
      }
      add_bos(prompt, format);
      tokenize(p->get_ref<const std::string&>(), prompt, format);
      tokenize(c->get_ref<const std::string&>(), completion, format);
      add_eos(completion, format);
    }
  }
  Sample sample;
  sample.tokens = prompt;
  sample.tokens.insert(sample.tokens.end(), completion.begin(), completion.end());
  sample.target.assign(prompt.size(), format.completion_only && !all_targets ? 0 : 1);
  sample.target.resize(sample.tokens.size(), 1);
  if (!sample.target.empty()) sample.target[0] = 0;
  // Truncation keeps the start: the model sees at most seq_len inputs.
  const size_t limit = static_cast<size_t>(format.seq_len + 1);
  if (sample.tokens.size() > limit) {
    sample.tokens.resize(limit);
    sample.target.resize(limit);
  }
  if (sample.tokens.size() < 2) throw std::runtime_error("a record needs at least two tokens");
  return sample;
}

}  // namespace trainer
