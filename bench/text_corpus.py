"""A real-text corpus from a Debian package's shipped prose: Vim's
documentation (vim-runtime, /usr/share/vim/vim*/doc/*.txt, ~9.5 MB), cut at
blank lines into documents of at most ~4000 characters, one {"text": ...}
per line: bench/optimizer_curves.sh's text task.
  python3 bench/text_corpus.py .cache/corpus/vim-docs.jsonl"""
import glob
import json
import os
import sys

out = sys.argv[1]
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
docs = 0
with open(out, "w") as f:
    for path in sorted(glob.glob("/usr/share/vim/vim*/doc/*.txt")):
        text = open(path, encoding="utf-8", errors="replace").read()
        piece = ""
        for block in text.split("\n\n"):
            if len(piece) + len(block) > 4000 and piece:
                f.write(json.dumps({"text": piece}) + "\n")
                docs += 1
                piece = ""
            piece += block + "\n\n"
        if piece.strip():
            f.write(json.dumps({"text": piece}) + "\n")
            docs += 1
print(f"{docs} documents written to {out}")
