#!/usr/bin/env python3
"""Makes the tiny SentencePiece fixture for petrel's tokenizer tests (Llama 2 style: BPE with byte fallback).

  pip install sentencepiece
  python3 scripts/tokenizer_make_sentencepiece_fixture.py

Trains a 400-piece model on the first 20 KB of tests/data/corpora/tinyshakespeare_input.txt with the
settings of Llama 2's tokenizer.model (identity normalization, dummy prefix, split digits, byte fallback),
then writes tests/data/tokenizers/sentencepiece-tiny/{tokenizer.model, tokenizer_sp_expected.json}: texts
with the ids and the decoded text that the Python sentencepiece library gives.
"""
import io
import json
import os

import sentencepiece as spm

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT_DIR = os.path.join(ROOT, "tests", "data", "tokenizers", "sentencepiece-tiny")

TEXTS = [
    "Hello world",
    "First Citizen: Before we proceed any further, hear me speak.",
    "  two leading spaces and trailing  ",
    "digits 12345 split one by one",
    "line one\nline two\n",
    "unseen characters fall back to bytes: é 中文 🦙",
    "<s> written in the text",
    "",
]


def main():
    corpus = open(os.path.join(ROOT, "tests", "data", "corpora", "tinyshakespeare_input.txt"), encoding="utf-8").read()
    sample = corpus[:20000]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample.splitlines()), model_writer=model, vocab_size=400, model_type="bpe",
        normalization_rule_name="identity", add_dummy_prefix=True, remove_extra_whitespaces=False,
        split_digits=True, byte_fallback=True, allow_whitespace_only_pieces=True, character_coverage=1.0,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, minloglevel=2)
    os.makedirs(OUT_DIR, exist_ok=True)
    model_path = os.path.join(OUT_DIR, "tokenizer.model")
    with open(model_path, "wb") as f:
        f.write(model.getvalue())
    sp = spm.SentencePieceProcessor(model_file=model_path)
    cases = []
    for text in TEXTS:
        ids = sp.encode(text)
        cases.append({"text": text, "ids": ids, "decoded": sp.decode(ids)})
    with open(os.path.join(OUT_DIR, "tokenizer_sp_expected.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": "scripts/tokenizer_make_sentencepiece_fixture.py",
                   "sentencepiece_version": spm.__version__, "vocab_size": sp.get_piece_size(),
                   "bos_id": sp.bos_id(), "eos_id": sp.eos_id(), "cases": cases}, f, ensure_ascii=False, indent=1)
    print(f"wrote {model_path} ({len(model.getvalue())} bytes) and {len(cases)} cases")


if __name__ == "__main__":
    main()
