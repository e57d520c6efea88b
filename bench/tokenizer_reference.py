#!/usr/bin/env python3
"""Token ids from Hugging Face `tokenizers` for the tokenizer test's corpus.

Encodes every text of tests/data/tokenizer/corpus.json with the given
tokenizer.json (special tokens in the text recognised, nothing added around
it: what `Tokenizer.encode(text, add_special_tokens=False)` gives), and every
invalid-UTF-8 byte string after decoding it the way Python does with
errors="replace" (each maximal invalid subpart becomes U+FFFD). Writes the
ids, the tokenizer file's SHA-256 and the library's version as JSON: the
expected output the C++ tokenizer is tested against. Where `tokenizers` is
installed (the GPU machine):

    python3 bench/tokenizer_reference.py --tokenizer .cache/tokenizers/qwen3/tokenizer.json \\
        --out tests/data/tokenizer/qwen3-expected.json
"""
import argparse
import hashlib
import json

import tokenizers


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--corpus", default="tests/data/tokenizer/corpus.json")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    tokenizer = tokenizers.Tokenizer.from_file(args.tokenizer)
    corpus = json.load(open(args.corpus, encoding="utf-8"))
    texts = [tokenizer.encode(t, add_special_tokens=False).ids for t in corpus["texts"]]
    invalid = [tokenizer.encode(bytes.fromhex(h).decode("utf-8", errors="replace"), add_special_tokens=False).ids
               for h in corpus["invalid_utf8_hex"]]
    with open(args.tokenizer, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    json.dump({"tokenizers_version": tokenizers.__version__, "tokenizer_sha256": digest, "texts": texts,
               "invalid_utf8": invalid}, open(args.out, "w"), indent=0)
    print(f"{len(texts) + len(invalid)} texts, {sum(map(len, texts + invalid))} ids, tokenizers "
          f"{tokenizers.__version__}, tokenizer.json sha256 {digest[:16]}... -> {args.out}")


if __name__ == "__main__":
    main()
