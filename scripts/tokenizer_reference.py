#!/usr/bin/env python3
"""Hugging Face `tokenizers` reference for petrel's tokenizer: ids, speed, and fixtures.

  pip install tokenizers   # the Rust library's Python binding; no transformers needed

Subcommands:
  bench        encode a corpus single-threaded, print MB/s (whole text and per line), write the ids
  compare      encode with HF and with `petrel tokenize`, report the first difference
  make-cases   write random and tricky strings with HF's ids as a JSON test fixture

Single-threaded: RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false are set before the import, and only
Tokenizer.encode (never encode_batch) is timed. "whole" encodes the corpus as one string; "per line"
encodes each line (newline kept) with its own call, which is closer to how a server sees prompts
(str.splitlines; for wiki.test.raw that is the same 2,891 lines as `petrel tokenize --bench --per-line`).
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import tokenizers  # noqa: E402  (after the environment is set)
from tokenizers import Tokenizer  # noqa: E402


def fnv1a64(ids):
    """The checksum the C++ test computes: FNV-1a 64 over each id as 4 little-endian bytes."""
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little", signed=True):
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def bench(args):
    tok = Tokenizer.from_file(args.tokenizer_json)
    text = open(args.corpus, "rb").read().decode("utf-8")
    nbytes = len(text.encode("utf-8"))
    lines = text.splitlines(keepends=True)
    results = {}
    for mode in ("whole", "per-line"):
        rates = []
        ids = None
        for _ in range(args.runs):
            start = time.perf_counter()
            if mode == "whole":
                ids = tok.encode(text, add_special_tokens=False).ids
            else:
                n = 0
                for line in lines:
                    n += len(tok.encode(line, add_special_tokens=False).ids)
            rates.append(nbytes / 1e6 / (time.perf_counter() - start))
        results[mode] = rates
        print(f"hf tokenizers {tokenizers.__version__} {mode}: bytes={nbytes} runs={args.runs} "
              f"first_MB/s={rates[0]:.2f} median_MB/s={statistics.median(rates):.2f} best_MB/s={max(rates):.2f}")
    ids = tok.encode(text, add_special_tokens=False).ids
    print(f"whole-text ids={len(ids)} fnv1a64=0x{fnv1a64(ids):016x}")
    if args.ids_out:
        with open(args.ids_out, "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")


def compare(args):
    tok = Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    text = open(args.corpus, "rb").read().decode("utf-8")
    hf = tok.encode(text, add_special_tokens=False).ids
    out = subprocess.run([args.petrel, "tokenize", "--tokenizer", args.tokenizer_dir, "--file", args.corpus],
                         check=True, capture_output=True, text=True).stdout
    ours = [int(x) for x in out.split()]
    print(f"hf ids={len(hf)} fnv1a64=0x{fnv1a64(hf):016x}; petrel ids={len(ours)} fnv1a64=0x{fnv1a64(ours):016x}")
    for i, (a, b) in enumerate(zip(hf, ours)):
        if a != b:
            print(f"first difference at id {i}: hf {hf[i:i+8]} petrel {ours[i:i+8]}")
            return 1
    if len(hf) != len(ours):
        print("lengths differ")
        return 1
    print("identical")
    return 0


# Characters chosen to stress the pre-tokenizer regex: every kind of whitespace PCRE2 and Oniguruma might
# classify differently, letters and numbers outside ASCII, combining marks, emoji sequences, apostrophes.
SPECIAL_WS = ["\u00a0", "\u1680", "\u2000", "\u2007", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000",
              "\u0085", "\u000b", "\u000c", "\u180e", "\u200b", "\ufeff", "\r\n", "\r", "\n\n", "\t"]
ALPHABETS = ["abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "àéîõüçñßøåæœ", "αβγδεζηθ",
             "абвгдеёжз", "我想在工作天～中文字", "日本語のテキストです", "한국어텍스트", "عربيالنص", "हिन्दी",
             "ไทย", "0123456789", "٠١٢٣٤٥٦٧٨٩", "²³¹¼½¾", "ⅠⅡⅢⅣ", "①②③", ".,;:!?-_'\"()[]{}<>/\\|@#$%^&*+=~`",
             "\u0301\u0308\u0327\u20dd", "😀😁🦙🚀🌫️👍🏽👨‍👩‍👧", "'s'T'RE've'M'll'D"]


def random_string(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        r = rng.random()
        if r < 0.2:
            parts.append(rng.choice(SPECIAL_WS) * rng.randint(1, 3))
        elif r < 0.35:
            parts.append(" " * rng.randint(1, 4))
        else:
            alphabet = rng.choice(ALPHABETS)
            parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))))
    return "".join(parts)


def make_cases(args):
    tok = Tokenizer.from_file(args.tokenizer_json)
    rng = random.Random(args.seed)
    texts = [
        "Hello world", "  leading spaces", "trailing spaces   ", "tabs\tand\nnewlines\r\n\r\nend",
        "numbers 1 12 123 1234 12345 3.14159 -42", "I'm sure you'll say they've THEY'RE we'd",
        "<|begin_of_text|> is special but <|not_a_token|> is not", "emoji 👨‍👩‍👧 family and 🏳️‍🌈 flag",
        "combining e\u0301 and n\u0303 and a\u0308\u0308", "mixed 中文 English 日本語 한국어 text",
        "\u00a0nbsp\u00a0\u00a0and\u3000ideographic space", "x" * 300, "Ω" * 100 + " " + "🙂" * 50,
        "a" + " " * 200 + "b", "\n" * 20 + "text", "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!", "中" * 500,
    ]
    texts += [random_string(rng) for _ in range(args.count)]
    cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in texts]
    header = {"generator": f"scripts/tokenizer_reference.py make-cases --seed {args.seed} --count {args.count}",
              "tokenizers_version": tokenizers.__version__}
    with open(args.out, "w", encoding="utf-8") as f:  # one case a line, so a diff shows which case changed
        f.write(json.dumps(header, ensure_ascii=False)[:-1] + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n]}\n")
    print(f"wrote {len(cases)} cases to {args.out}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--tokenizer-json", default="tests/data/tokenizers/llama-3.1/tokenizer.json")
    b.add_argument("--corpus", default="tests/data/corpora/wiki.test.raw")
    b.add_argument("--runs", type=int, default=5)
    b.add_argument("--ids-out")
    c = sub.add_parser("compare")
    c.add_argument("--tokenizer-dir", default="tests/data/tokenizers/llama-3.1")
    c.add_argument("--corpus", default="tests/data/corpora/wiki.test.raw")
    c.add_argument("--petrel", default="build/petrel")
    m = sub.add_parser("make-cases")
    m.add_argument("--tokenizer-json", default="tests/data/tokenizers/llama-3.1/tokenizer.json")
    m.add_argument("--out", default="tests/data/tokenizers/llama-3.1/tokenizer_hf_cases.json")
    m.add_argument("--seed", type=int, default=1234)
    m.add_argument("--count", type=int, default=300)
    args = p.parse_args()
    return {"bench": bench, "compare": compare, "make-cases": make_cases}[args.command](args) or 0


if __name__ == "__main__":
    sys.exit(main())
