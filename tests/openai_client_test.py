#!/usr/bin/env python3
"""petrel serve against the official OpenAI Python client (an independent reader of the protocol).

Starts `petrel serve` on tiny-llama31 (CPU, any free port), then checks with `openai`:
models.list, a greedy chat completion, the same completion streamed (deltas joined equal the whole answer,
usage in the last chunk), seeded sampling, stop sequences, text completions (whole and streamed), and 400s for
bad requests (the server keeps serving).
Exits 77 (ctest: skipped) when the openai package is not installed: scripts/test.sh installs it into
BUILD/pyenv.

Usage: openai_client_test.py PETREL_BINARY MODEL_DIR
"""
import json
import os
import re
import subprocess
import sys
import time

try:
    import openai
except ImportError:
    print("openai is not installed (scripts/test.sh puts it in BUILD/pyenv); skipping")
    sys.exit(77)


def start_server(petrel, model):
    proc = subprocess.Popen([petrel, "serve", model, "--port", "0", "--threads", "1"],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    port = None
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        proc.kill()
        raise SystemExit("petrel serve did not start")
    return proc, port


def main():
    petrel, model = sys.argv[1], sys.argv[2]
    proc, port = start_server(petrel, model)
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
        models = client.models.list()
        check([m.id for m in models.data] == [os.path.basename(os.path.normpath(model))], "models.list names the model")

        messages = [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Tell me about the sea."}]
        whole = client.chat.completions.create(model="x", messages=messages, max_tokens=24, temperature=0)
        choice = whole.choices[0]
        check(isinstance(choice.message.content, str) and len(choice.message.content) > 0, "greedy answer has content")
        check(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason}")
        check(whole.usage.prompt_tokens > 0 and whole.usage.completion_tokens > 0 and
              whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens, "usage adds up")
        check(whole.id.startswith("chatcmpl-") and whole.object == "chat.completion", "id and object")

        stream = client.chat.completions.create(model="x", messages=messages, max_tokens=24, temperature=0,
                                                stream=True, stream_options={"include_usage": True})
        parts, finish, usage, roles = [], None, None, []
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                if c.delta.role:
                    roles.append(c.delta.role)
                if c.delta.content:
                    parts.append(c.delta.content)
                if c.finish_reason:
                    finish = c.finish_reason
        check("".join(parts) == choice.message.content, "streamed deltas join to the same answer")
        check(roles == ["assistant"], "one role delta")
        check(finish == choice.finish_reason, "streamed finish_reason")
        check(usage is not None and usage.completion_tokens == whole.usage.completion_tokens and
              usage.prompt_tokens == whole.usage.prompt_tokens, "usage chunk matches")

        seeded = [client.chat.completions.create(model="x", messages=messages, max_tokens=12, temperature=0.9,
                                                 top_p=0.9, seed=7).choices[0].message.content for _ in range(2)]
        check(seeded[0] == seeded[1], "the same seed gives the same sampled answer")

        stopped = client.chat.completions.create(model="x", messages=messages, max_tokens=24, temperature=0,
                                                 stop=[choice.message.content[3:6]] if len(choice.message.content) > 6 else None)
        check(len(stopped.choices[0].message.content) <= len(choice.message.content), "stop sequence honoured")

        # n choices: generated one after another; streamed, each chunk names its choice.
        several = client.chat.completions.create(model="x", messages=messages, max_tokens=12, temperature=0.9, seed=11, n=3)
        check([c.index for c in several.choices] == [0, 1, 2], "n = 3 gives choices 0, 1, 2")
        check(several.usage.prompt_tokens == whole.usage.prompt_tokens, "n = 3 counts the prompt once")
        check(3 <= several.usage.completion_tokens <= 3 * 12, "n = 3 counts every choice's tokens")
        texts = {0: "", 1: ""}
        for c in client.chat.completions.create(model="x", messages=messages, max_tokens=24, temperature=0, n=2, stream=True):
            for ch in c.choices:
                texts[ch.index] += ch.delta.content or ""
        check(texts[0] == texts[1] == choice.message.content, "n = 2 streamed at temperature 0: two greedy answers")

        for bad, what in [({"messages": [{"role": "wizard", "content": "hi"}]}, "unknown role"),
                          ({"messages": messages, "n": 17}, "n = 17"),
                          ({"messages": messages, "temperature": "hot"}, "temperature as a string"),
                          ({"messages": []}, "no messages")]:
            try:
                client.chat.completions.create(model="x", max_tokens=4, **bad)
                check(False, f"{what} refused")
            except openai.BadRequestError as e:
                check(e.status_code == 400 and e.body and "message" in e.body, f"{what} refused with 400: {e.body.get('message') if e.body else ''}")

        text = client.completions.create(model="x", prompt="The history of", max_tokens=12, temperature=0)
        check(text.object == "text_completion" and len(text.choices[0].text) > 0, "completions: a text answer")
        streamed_text = "".join(c.choices[0].text for c in client.completions.create(
            model="x", prompt="The history of", max_tokens=12, temperature=0, stream=True) if c.choices)
        check(streamed_text == text.choices[0].text, "completions: streamed text joins to the same answer")

        # Log-probabilities as the client types them: chat's logprobs.content, completions' legacy lists with echo.
        scored = client.chat.completions.create(model="x", messages=messages, max_tokens=6, temperature=0,
                                                logprobs=True, top_logprobs=2)
        entries = scored.choices[0].logprobs.content
        check(len(entries) == scored.usage.completion_tokens and all(len(e.top_logprobs) == 2 for e in entries)
              and all(e.logprob <= 0 and e.logprob == e.top_logprobs[0].logprob for e in entries),
              "chat logprobs: one entry a token, greedy picks the most likely")
        echoed = client.completions.create(model="x", prompt="The history of", max_tokens=1, temperature=0,
                                           echo=True, logprobs=1)
        lp = echoed.choices[0].logprobs
        check(lp.token_logprobs[0] is None and all(v <= 0 for v in lp.token_logprobs[1:])
              and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
              and echoed.choices[0].text.startswith("The history of"),
              "completions: echo with logprobs scores every prompt token after the first")

        # JSON mode: an answer that ends is one JSON object (Python's json module as the judge).
        for seed in (1, 2, 3):
            answer = client.chat.completions.create(model="x", messages=messages, max_tokens=80, temperature=1.0,
                                                    seed=seed, response_format={"type": "json_object"})
            content = answer.choices[0].message.content
            if answer.choices[0].finish_reason == "stop":
                try:
                    check(isinstance(json.loads(content), dict), f"json mode (seed {seed}): an object")
                except ValueError:
                    check(False, f"json mode (seed {seed}): {content!r} parses")
            else:
                check(content.lstrip().startswith("{"), f"json mode (seed {seed}): cut off at max_tokens, an object's start")

        # Structured outputs: answers that end satisfy the schema, as the jsonschema package judges them.
        schema = {"$defs": {"Name": {"enum": ["Ann", "Bob"]}},
                  "type": "object", "properties": {"name": {"$ref": "#/$defs/Name"}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                                   "ok": {"type": "boolean"}, "pet": {"enum": ["cat", "dog", None]},
                                                   "nick": {"type": "string", "minLength": 1, "maxLength": 4},
                                                   "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{2,3}$"},
                                                   "score": {"type": "number", "minimum": -1, "exclusiveMaximum": 2.5, "multipleOf": 0.25},
                                                   "count": {"type": "integer", "maximum": 50, "multipleOf": 5},
                                                   "toy": {"anyOf": [{"type": "object", "additionalProperties": False, "required": ["kind"],
                                                                      "properties": {"kind": {"const": "ball"}, "size": {"type": "integer"}}},
                                                                     {"type": "object", "additionalProperties": False, "required": ["kind", "sound"],
                                                                      "properties": {"kind": {"const": "bell"}, "sound": {"enum": ["ding", "dong"]}}}]},
                                                   "kids": {"type": "array", "items": {"enum": ["Cy", "Di"]}, "maxItems": 2},
                                                   "home": {"allOf": [{"type": "object", "properties": {"city": {"type": "string", "maxLength": 5}},
                                                                       "required": ["city"]},
                                                                      {"properties": {"zip": {"type": "integer", "minimum": 1, "maximum": 99}},
                                                                       "required": ["zip"]}]}},
                  "required": ["name", "age", "code", "score", "toy", "home"]}
        try:
            import jsonschema
        except ImportError:
            jsonschema = None
        for seed in (1, 2, 3):
            answer = client.chat.completions.create(
                model="x", messages=messages, max_tokens=400, temperature=1.0, seed=seed,
                response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
            content = answer.choices[0].message.content
            if answer.choices[0].finish_reason != "stop":
                check(content.lstrip().startswith("{"), f"json_schema (seed {seed}): cut off at max_tokens, an object's start")
                continue
            try:
                if jsonschema:
                    jsonschema.validate(json.loads(content), schema)
                check(True, f"json_schema (seed {seed}): {content[:60]!r} follows the schema")
            except Exception as e:  # noqa: BLE001 - any failure is the test's failure
                check(False, f"json_schema (seed {seed}): {content!r}: {e}")

        after = client.chat.completions.create(model="x", messages=messages, max_tokens=24, temperature=0)
        check(after.choices[0].message.content == choice.message.content, "still serving, same greedy answer")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            failures.append("server did not stop on SIGTERM")
    check(proc.returncode == 0, f"server exited cleanly ({proc.returncode})")
    if failures:
        print(f"{len(failures)} failed")
        sys.exit(1)
    print("all passed")


if __name__ == "__main__":
    main()
