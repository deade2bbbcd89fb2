#!/usr/bin/env python3
"""What the OpenAI-compatible server costs over the engine: streams chat completions from `petrel serve` with the
official OpenAI client and reports time to first token and the generation rate seen by the client, beside
`petrel bench` (the engine alone) on the same model, threads and backend.

Usage: bench/serve_bench.py --petrel build/petrel --model DIR [--requests 5] [--max-tokens 64] [--threads 2]
       [--backend cpu|cuda] [--prompt-words 20]
Needs the openai package (scripts/test.sh installs it into BUILD/pyenv). Prints a markdown table.
"""
import argparse
import re
import statistics
import subprocess
import sys
import time

import openai


def start_server(args):
    cmd = [args.petrel, "serve", args.model, "--port", "0", "-q", "--threads", str(args.threads), "--backend", args.backend]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    while True:
        line = proc.stderr.readline()
        if not line:
            raise SystemExit("petrel serve did not start")
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", line)
        if m:
            return proc, int(m.group(1))


def one_request(client, messages, max_tokens):
    t0 = time.perf_counter()
    first = last = None
    usage = None
    stream = client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content or getattr(c.delta, "reasoning_content", None):
                now = time.perf_counter()
                first = first or now
                last = now
    n = usage.completion_tokens
    rate = (n - 1) / (last - first) if first and last and last > first and n > 1 else float("nan")
    return (first - t0) * 1e3 if first else float("nan"), rate, n, usage.prompt_tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--petrel", default="build/petrel")
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--prompt-words", type=int, default=20)
    args = ap.parse_args()

    proc, port = start_server(args)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=600)
        rows = []
        for i in range(args.requests + 1):
            # A different first word each time, so that no request reuses the previous one's KV cache.
            words = " ".join(["request", str(i)] + ["the sea and the sky"] * (args.prompt_words // 5))
            result = one_request(client, [{"role": "user", "content": words}], args.max_tokens)
            if i > 0:  # the first one warms up
                rows.append(result)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    ttft = statistics.median(r[0] for r in rows)
    rate = statistics.median(r[1] for r in rows)
    gen = statistics.median(r[2] for r in rows)
    prompt = statistics.median(r[3] for r in rows)

    bench = subprocess.run([args.petrel, "bench", args.model, "-p", str(int(prompt)), "-n", str(int(gen)), "-r", "3",
                            "-t", str(args.threads), "--backend", args.backend, "-o", "csv"],
                           capture_output=True, text=True)
    engine = {}
    for line in bench.stdout.splitlines():
        cells = line.split(",")
        for test in (f"pp{int(prompt)}", f"tg{int(gen)}"):
            if test in cells:
                engine[test] = cells[cells.index(test) + 1]
    print(f"| model | requests | prompt tokens | generated | client TTFT ms (median) | client tok/s (median) | "
          f"petrel bench pp{int(prompt)} | petrel bench tg{int(gen)} |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {args.model} | {len(rows)} | {int(prompt)} | {int(gen)} | {ttft:.1f} | {rate:.1f} | "
          f"{engine.get(f'pp{int(prompt)}', '?')} | {engine.get(f'tg{int(gen)}', '?')} |")
    if bench.returncode != 0:
        print(bench.stderr, file=sys.stderr)


if __name__ == "__main__":
    main()
