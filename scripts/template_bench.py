#!/usr/bin/env python3
"""Times Python Jinja2 (configured as transformers configures it) rendering a conversation through a chat
template, for comparison with `petrel template --bench N` on the same input (docs/perf/templates.md).

  python3 scripts/template_bench.py --write tests/data/templates/bench_20_messages_10_tools.json
  python3 scripts/template_bench.py --runs 2000 \\
      --template tests/data/chat-templates/meta-llama-Llama-3.1-8B-Instruct.jinja \\
      --conversation tests/data/templates/bench_20_messages_10_tools.json

--write makes the benchmark conversation (20 messages, 10 tools; deterministic). The timing covers
template.render() only (compiled once), as petrel's covers ChatTemplate::render() (parsed once).
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from template_make_corpus import CONTEXT, make_environment  # noqa: E402


def make_bench_conversation():
    tools = []
    for i in range(10):
        tools.append({
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": f"Tool number {i}: looks things up in system {i} and returns a JSON summary.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "What to look up"},
                        "limit": {"type": "integer", "default": 10},
                        "mode": {"type": "string", "enum": ["fast", "exact", "fuzzy"]},
                        "filters": {"type": "object", "properties": {"since": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}},
                    },
                    "required": ["query"],
                },
            },
        })
    messages = [{"role": "system", "content": "You are a helpful assistant with access to tools. Answer concisely."}]
    turn = 0
    while len(messages) < 20:
        turn += 1
        messages.append({"role": "user", "content": f"Question {turn}: what does system {turn % 10} say about item {turn * 7}? Please check — “quickly” ✅"})
        if turn % 2 == 1 and len(messages) <= 17:
            messages.append({"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": f"tool_{turn % 10}", "arguments": {"query": f"item {turn * 7}", "limit": 5, "mode": "exact"}}}]})
            messages.append({"role": "tool", "content": json.dumps({"item": turn * 7, "status": "ok", "notes": ["a", "b"]})})
        messages.append({"role": "assistant", "content": f"System {turn % 10} reports item {turn * 7} is fine. Anything else?"})
    return {"messages": messages[:20], "tools": tools}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", help="write the benchmark conversation to this path and exit")
    parser.add_argument("--template")
    parser.add_argument("--conversation")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--add-generation-prompt", action="store_true", default=True)
    args = parser.parse_args()
    if args.write:
        with open(args.write, "w", encoding="utf-8") as f:
            json.dump(make_bench_conversation(), f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"wrote {args.write}")
        return
    with open(args.template, encoding="utf-8") as f:
        template = make_environment().from_string(f.read())
    with open(args.conversation, encoding="utf-8") as f:
        conversation = json.load(f)
    times = []
    text = ""
    for _ in range(args.runs):
        start = time.perf_counter()
        text = template.render(messages=conversation["messages"], tools=conversation["tools"], documents=None,
                               add_generation_prompt=args.add_generation_prompt, **CONTEXT)
        times.append((time.perf_counter() - start) * 1e6)
    times.sort()
    q = lambda p: times[int(p * (len(times) - 1))]  # noqa: E731
    print(f"jinja2 {__import__('jinja2').__version__}: {args.runs} renders of {len(conversation['messages'])} messages, "
          f"{len(conversation['tools'])} tools -> {len(text.encode())} bytes")
    print(f"median {statistics.median(times):.1f} us, min {times[0]:.1f} us, p10 {q(0.1):.1f} us, p90 {q(0.9):.1f} us")


if __name__ == "__main__":
    main()
