#!/usr/bin/env python3
"""Makes petrel's parity fixtures with Hugging Face transformers (float32, eager attention, CPU).

For three small random-weight Llama configurations and the shipped tiny-llama31 it writes, under OUT:
  <name>/            a Hugging Face checkpoint (config.json + safetensors) as save_pretrained writes it
  <name>.tokens.txt  the input ids, whitespace-separated
  <name>.logits.npy  float32 logits [n_tokens, vocab] of LlamaForCausalLM in float32 from the stored weights
  tiny-llama31.greedy.txt  32 greedily generated ids after tiny-llama31.tokens.txt's first 16 tokens
  manifest.json      versions and shapes

The configurations cover what petrel must get right:
  gqa_llama3:   grouped KV heads (8 q / 2 kv), llama3 RoPE scaling whose bands all occur, bf16 weights
  tied_mha:     tied embeddings, as many KV heads as query heads, f16 weights, sharded with an index
  headdim_1kv:  explicit head_dim (40) different from hidden/heads (24), a single KV head, linear RoPE
                scaling, f32 weights

Usage (on a machine with torch + transformers): python3 make_parity_fixtures.py OUT [TINY_LLAMA31_DIR]
Weights are re-initialised with unit-scale statistics (not transformers' std 0.02) so that logits are
spread out and argmax comparisons are meaningful.
"""
import inspect
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

N_TOKENS = 200  # longer than one 128-token prompt chunk
TINY_TOKENS = 160

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}

CONFIGS = {
    "gqa_llama3": dict(
        dtype=torch.bfloat16, shard=None,
        config=dict(vocab_size=512, hidden_size=128, intermediate_size=320, num_hidden_layers=3,
                    num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                    rms_norm_eps=1e-5, rope_theta=500000.0, rope=LLAMA3_ROPE, tie_word_embeddings=False,
                    bos_token_id=1, eos_token_id=[2, 3])),
    "tied_mha": dict(
        dtype=torch.float16, shard="100KB",
        config=dict(vocab_size=384, hidden_size=96, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=6, num_key_value_heads=6, max_position_embeddings=512,
                    rms_norm_eps=1e-6, rope_theta=10000.0, rope=None, tie_word_embeddings=True,
                    bos_token_id=1, eos_token_id=2)),
    "headdim_1kv": dict(
        dtype=torch.float32, shard=None,
        config=dict(vocab_size=320, hidden_size=96, intermediate_size=200, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=40, max_position_embeddings=512,
                    rms_norm_eps=1e-5, rope_theta=10000.0, rope={"rope_type": "linear", "factor": 2.0},
                    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)),
}


def make_config(spec):
    spec = dict(spec)
    rope = spec.pop("rope")
    theta = spec.pop("rope_theta")
    params = inspect.signature(LlamaConfig.__init__).parameters
    if "rope_parameters" in params:  # transformers >= 5
        rp = {"rope_type": "default", "rope_theta": theta}
        if rope:
            rp.update(rope)
        spec["rope_parameters"] = rp
    else:
        spec["rope_theta"] = theta
        spec["rope_scaling"] = rope
    return LlamaConfig(**spec)


def reinit(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # RMSNorm weights around 1
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))


def load_fp32(path):
    try:
        return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        return LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager")


def logits_of(model, ids):
    with torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long))
    return out.logits[0].float().numpy().astype(np.float32)


def main():
    out = sys.argv[1]
    tiny_dir = sys.argv[2] if len(sys.argv) > 2 else None
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(8)
    manifest = {"transformers": transformers.__version__, "torch": torch.__version__, "models": {}}
    for i, (name, spec) in enumerate(CONFIGS.items()):
        torch.manual_seed(100 + i)
        config = make_config(spec["config"])
        config._attn_implementation = "eager"
        model = LlamaForCausalLM(config)
        reinit(model, 1000 + i)
        model = model.to(spec["dtype"])
        path = os.path.join(out, name)
        kwargs = {"safe_serialization": True}
        if spec["shard"]:
            kwargs["max_shard_size"] = spec["shard"]
        model.save_pretrained(path, **kwargs)
        ref = load_fp32(path)
        ref.eval()
        rng = np.random.default_rng(7 + i)
        ids = [1] + rng.integers(3, config.vocab_size, N_TOKENS - 1).tolist()
        logits = logits_of(ref, ids)
        np.save(os.path.join(out, name + ".logits.npy"), logits)
        with open(os.path.join(out, name + ".tokens.txt"), "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
        manifest["models"][name] = {"dtype": str(spec["dtype"]), "files": sorted(os.listdir(path)),
                                    "logits_shape": list(logits.shape)}
        print(name, logits.shape, sorted(os.listdir(path)), flush=True)

    if tiny_dir:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(tiny_dir, "tokenizer.json"))
        # Held-out text: the tail of wiki.test.raw (the model was trained on the first 90%).
        text = open(os.path.join(os.path.dirname(__file__), "..", "corpora", "wiki.test.raw"),
                    encoding="utf-8").read()
        held_out = text[int(len(text) * 0.95):]
        ids = tok.encode(held_out, add_special_tokens=False).ids
        bos = 4080
        ids = [bos] + ids[:TINY_TOKENS - 1]
        ref = load_fp32(tiny_dir)
        ref.eval()
        logits = logits_of(ref, ids)
        np.save(os.path.join(out, "tiny-llama31.logits.npy"), logits)
        with open(os.path.join(out, "tiny-llama31.tokens.txt"), "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
        prompt = torch.tensor([ids[:16]], dtype=torch.long)
        with torch.no_grad():
            gen = ref.generate(prompt, max_new_tokens=32, do_sample=False, eos_token_id=None,
                               pad_token_id=0, min_new_tokens=32)
        with open(os.path.join(out, "tiny-llama31.greedy.txt"), "w") as f:
            f.write(" ".join(map(str, gen[0, 16:].tolist())) + "\n")
        manifest["models"]["tiny-llama31"] = {"logits_shape": list(logits.shape)}
        print("tiny-llama31", logits.shape, flush=True)

    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)


if __name__ == "__main__":
    main()
