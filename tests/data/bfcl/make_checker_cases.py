#!/usr/bin/env python3
"""Makes tests/data/bfcl: a subset of BFCL's AST categories, and verdicts of BFCL's own AST checker on model outputs
made from their answers (correct ones and one-change-wrong ones), which tests/bfcl_test.cc compares with petrel's
C++ checker (src/petrel/eval/bfcl.h).

The official checker is bfcl_eval/eval_checker/ast_eval/ast_checker.py from the bfcl-eval wheel on PyPI, imported
as it is; only bfcl_eval.constants.model_config (which imports every model handler and their SDKs) is replaced by
a mapping whose models all have underscore_to_dot = True, as OpenAI-style function-calling models do.

Usage: make_checker_cases.py BFCL_DATA_DIR [--wheel bfcl_eval-*.whl]   (downloads the wheel when not given)
"""
import argparse
import copy
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import types
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
CATEGORIES = {  # category: entries kept
    "simple_python": 25, "multiple": 15, "parallel": 8, "parallel_multiple": 8,
    "live_simple": 15, "live_multiple": 8, "live_parallel": 5, "live_parallel_multiple": 5,
    "irrelevance": 10, "live_irrelevance": 6, "live_relevance": 6,
}


def load_checker(wheel):
    root = tempfile.mkdtemp()
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("bfcl_eval/constants/") or name.startswith("bfcl_eval/eval_checker/ast_eval/"):
                z.extract(name, root)
    for pkg in ["bfcl_eval", "bfcl_eval/eval_checker"]:
        os.makedirs(os.path.join(root, pkg), exist_ok=True)
        open(os.path.join(root, pkg, "__init__.py"), "a").close()
    sys.path.insert(0, root)

    class Config:
        underscore_to_dot = True

    stub = types.ModuleType("bfcl_eval.constants.model_config")
    stub.MODEL_CONFIG_MAPPING = {"fc/model": Config()}
    sys.modules["bfcl_eval.constants.model_config"] = stub
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    return lambda functions, output, truth, category: ast_checker(functions, output, truth, Language.PYTHON, category, "fc_model")


def first_value(values):
    for v in values:
        if v != "":
            return True, v
    return False, None


def correct_output(truth):
    out = []
    for call in truth:
        name, params = next(iter(call.items()))
        args = {}
        for p, values in params.items():
            present, v = first_value(values)
            if present:
                args[p] = v
        out.append({name.replace(".", "_"): args})
    return out


def variants(entry, truth, rng):
    """(label, output) pairs: the correct output and single changes to it."""
    base = correct_output(truth)
    yield "correct", base
    schema = {f["name"].replace(".", "_"): f for f in entry["function"]}
    for ci, call in enumerate(base):
        name, args = next(iter(call.items()))
        props = schema.get(name, {}).get("parameters", {}).get("properties", {})
        required = schema.get(name, {}).get("parameters", {}).get("required", [])

        def changed(new_args, new_name=None):
            out = copy.deepcopy(base)
            out[ci] = {new_name or name: new_args}
            return out

        yield "wrong_name", changed(args, name + "_x")
        yield "unexpected_param", changed({**args, "zz_extra": 1})
        for p in list(args)[:3]:
            a = dict(args)
            del a[p]
            yield f"drop_{p}", changed(a)
            v = args[p]
            t = props.get(p, {}).get("type")
            options = []
            if isinstance(v, bool):
                options = [not v, int(v), str(v).lower()]
            elif isinstance(v, int):
                options = [v + 1, float(v), str(v), True]
            elif isinstance(v, float):
                options = [v + 0.5, int(v) if v == int(v) else round(v), str(v)]
            elif isinstance(v, str):
                options = ["WRONG", v.upper() + "  ", "-" + v.replace(" ", "_") + ".", v.replace("'", '"'), 5]
            elif isinstance(v, list):
                options = [v[::-1], v + v[:1], [], [str(x) for x in v], "x"]
            elif isinstance(v, dict):
                options = [{**v, "zz": 1}, {k: v[k] for k in list(v)[:-1]}, [v], "x"]
            for o in options:
                yield f"value_{p}_{t}", changed({**args, p: o})
        # an optional parameter the answer allows to leave out, given anyway with its first value
        for p, values in next(iter(truth[ci].values())).items():
            if p not in args and values:
                yield f"give_optional_{p}", changed({**args, p: values[0] if values[0] != "" else "x"})
    if len(base) > 1:
        yield "reversed", base[::-1]
        yield "duplicate_first", [base[0]] * len(base)
        yield "one_missing", base[:-1]
    yield "extra_call", base + base[:1]
    yield "empty", []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--wheel")
    args = ap.parse_args()
    wheel = args.wheel
    if not wheel:
        d = tempfile.mkdtemp()
        subprocess.check_call([sys.executable, "-m", "pip", "download", "bfcl-eval==2026.3.23", "--no-deps", "-q", "-d", d])
        wheel = glob.glob(os.path.join(d, "*.whl"))[0]
    check = load_checker(wheel)
    rng = random.Random(1)
    os.makedirs(os.path.join(HERE, "possible_answer"), exist_ok=True)
    cases = []
    for category, keep in CATEGORIES.items():
        src = os.path.join(args.data, f"BFCL_v4_{category}.json")
        entries = [json.loads(l) for l in open(src) if l.strip()][:keep]
        with open(os.path.join(HERE, f"BFCL_v4_{category}.json"), "w") as f:
            for e in entries:
                f.write(json.dumps(e) + "\n")
        answer_src = os.path.join(args.data, "possible_answer", f"BFCL_v4_{category}.json")
        if not os.path.exists(answer_src):
            continue
        answers = {a["id"]: a for a in (json.loads(l) for l in open(answer_src) if l.strip())}
        with open(os.path.join(HERE, "possible_answer", f"BFCL_v4_{category}.json"), "w") as f:
            for e in entries:
                f.write(json.dumps(answers[e["id"]]) + "\n")
        for e in entries:
            truth = answers[e["id"]]["ground_truth"]
            for label, output in variants(e, truth, rng):
                r = check(e["function"], output, truth, category)
                cases.append({"category": category, "id": e["id"], "label": label, "output": output,
                              "valid": bool(r["valid"]), "error_type": "" if r["valid"] else r.get("error_type", "")})
    with open(os.path.join(HERE, "checker_cases.jsonl"), "w") as f:
        for c in cases:
            f.write(json.dumps(c, separators=(",", ":")) + "\n")
    valid = sum(c["valid"] for c in cases)
    print(f"{len(cases)} cases ({valid} valid) from {os.path.basename(wheel)}")


if __name__ == "__main__":
    main()
