"""A real-text corpus from a Debian package's shipped prose: Vim's
documentation (vim-runtime, /usr/share/vim/vim*/doc/*.txt, ~9.5 MB), cut at
blank lines into documents of at most ~4000 characters, one {"text": ...}
per line: bench/optimizer_curves.sh's text task.
  python3 bench/text_corpus.py .cache/corpus/vim-docs.jsonl
With --ragged, fine-tuning records of ragged length instead: each paragraph
of two lines or more becomes {"prompt": its first line, "completion": the
rest} (bench/packing.sh).
  python3 bench/text_corpus.py --ragged .cache/corpus/vim-ragged.jsonl"""
import glob
import json
import os
import sys

ragged = sys.argv[1] == "--ragged"
out = sys.argv[-1]
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
docs = 0
if ragged:
    with open(out, "w") as f:
        for path in sorted(glob.glob("/usr/share/vim/vim*/doc/*.txt")):
            text = open(path, encoding="utf-8", errors="replace").read()
            for block in text.split("\n\n"):
                lines = block.strip("\n").split("\n")
                if len(lines) < 2 or not lines[0].strip():
                    continue
                f.write(json.dumps({"prompt": lines[0] + "\n", "completion": "\n".join(lines[1:])}) + "\n")
                docs += 1
    print(f"{docs} records written to {out}")
    sys.exit(0)
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
