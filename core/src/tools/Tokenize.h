// `trainer tokenize`: pre-tokenizes a jsonl corpus for the `tokens` dataset.
#pragma once

#include <string>

namespace trainer {

struct TokenizeRequest {
  std::string input;           ///< jsonl, one {"text": ...} per line
  std::string tokenizer;       ///< a tokenizer.json or a directory holding one
  std::string out;             ///< the tokens file; OUT.docs gets the document offsets
  std::string dtype = "auto";  ///< uint16, uint32 or auto (uint16 when the vocabulary fits)
  int threads = 0;             ///< 0: one per core
  bool skip_bad_lines = false;
};

/// Tokenizes request.input into request.out (see Tokenize.cpp). InputError
/// names the file and line of a bad line unless skip_bad_lines; then they
/// are counted and the first is reported. Prints progress and throughput.
int tokenize_corpus(const TokenizeRequest& request);

}  // namespace trainer
