#!/usr/bin/env python3
"""Reads the block timeline CSV of `petrel_bench_decode_cuda --timeline FILE` and prints where a decode step's
time goes, per kernel of a layer (medians over the middle layers of each recorded step).

  python3 scripts/timeline_report.py FILE [--layer-bins N] [--blocks]

A variant that ran twice into one file (named twice in --variants) is reported per run: "name", "name #2".

Columns (us, relative to the end of the kernel before, "prev end" = the last block end of the previous launch):
  blocks     blocks of the launch (attention: those that did work / all)
  SMs        SMs its blocks ran on (the hardware packs up to 4 GEMV blocks an SM where it finds room)
  first in   first block start - prev end (negative: started early under programmatic dependent launch)
  last in    last block start - prev end
  released   first block past its wait - prev end (the dependent launch's release latency)
  staged     median / last block with its input staged - prev end
  loop       median / last block out of its main loop - prev end
  end        last block end - prev end: the launch's share of the step
  epilogue   end - loop (split-K reduction, the residual add)
  GB/s       the launch's weight bytes (2 KB a block step) over its share ("end")
RMSNorm GEMVs (q/k/v, gate/up): a line below the table gives when the median block had its sum of squares.
Early starts: a line gives how many of a launch's blocks started more than 0.5 us before the kernel before ended,
by how many of that kernel's blocks had run on their SM (SMs holding the kernel before's blocks fill first; a
launch whose blocks find no room beside them starts late: session 32's shared-memory carveout).
GEMVs: a line gives how long a block takes to issue its loads, prefetches and copies before its wait (t5 from
its start: median and slowest block) and how long the first block past the wait waited after that.
Attention: "staged" = queries rotated and the token's key and value stored, "loop" = the first chunks in
shared memory; a line below the table gives its later stamps.
--blocks: for the RMSNorm GEMVs (q/k/v, gate/up) of one middle layer, the spread over their blocks (quantiles 0, 10,
50, 90, 100%) of when each started, passed its wait, had its sum of squares (x read and reduced) and its input staged,
and left its loop, relative to the end of the kernel before (session 33: gate/up's blocks start as o's end, issue
their first weight loads for ~2.3 us and pass the wait then; x takes ~3 us more), and the loop ends by how many of
the launch's blocks shared the SM.
A layer's bins (--layer-bins) show the weight bytes streamed per bin: where the memory idles. With t5 stamps
(session 17) a block's first min(steps, 16) steps, asked for before its wait, are spread over its start .. t5 +
1 us and the rest over its main loop; without them each block's bytes are spread over its start .. loop end.
"""
import csv
import statistics
import sys
from collections import defaultdict

KIND_NAMES = {0x41: "4-bit norm", 0x40: "4-bit", 0x42: "4-bit silu", 0x81: "8-bit norm", 0x80: "8-bit", 0x100: "attention"}
LAYER_ROLES = ["q/k/v", "attention", "o", "gate/up", "down"]


def launches_of(rows):
    by_tag = defaultdict(list)
    for r in rows:
        by_tag[(r["tag"], r["kind"])].append(r)
    launches = []
    for (tag, kind), blocks in by_tag.items():
        launches.append({"kind": int(kind), "blocks": blocks, "start": min(b["t0"] for b in blocks)})
    launches.sort(key=lambda l: l["start"])
    return launches


def stat(launch, prev_end, prev_blocks=()):
    bl = launch["blocks"]
    working = [b for b in bl if b["wait"] >= 0]
    t = lambda b, k: b["t0"] + b[k]

    # Latest / median stamp k over the blocks that reached it (a probe variant may stop blocks before a stamp).
    def latest(blocks, k):
        v = [t(b, k) for b in blocks if b[k] >= 0]
        return max(v) - prev_end if v else 0.0

    def median(blocks, k):
        v = [t(b, k) for b in blocks if b[k] >= 0]
        return statistics.median(v) - prev_end if v else 0.0

    out = {
        "blocks": len(bl),
        "working": len(working),
        "first_in": min(b["t0"] for b in bl) - prev_end,
        "last_in": max(b["t0"] for b in bl) - prev_end,
        "released": min(t(b, "wait") for b in working) - prev_end if working else 0.0,
        "staged": latest(working, "staged"),
        "loop": latest(working, "loop"),
        "staged_med": median(working, "staged"),
        "loop_med": median(working, "loop"),
        "end": latest(bl, "end"),
        "bytes": sum(b["steps"] for b in bl) * 2048.0,
        "sms": len({b["sm"] for b in bl}),
        "abs_end": latest(bl, "end") + prev_end,
    }
    out["epilogue"] = out["end"] - out["loop"]
    # Early starts by the number of the previous launch's blocks on the block's SM: {count: [early blocks, SMs]}.
    prev_per_sm = defaultdict(int)
    for b in prev_blocks:
        prev_per_sm[b["sm"]] += 1
    by_count = defaultdict(lambda: [0, 0])
    for n in prev_per_sm.values():
        by_count[n][1] += 1
    for b in bl:
        if b["t0"] < prev_end - 0.5:
            by_count[prev_per_sm.get(b["sm"], 0)][0] += 1
    out["early"] = sum(v[0] for v in by_count.values())
    out["early_by"] = dict(by_count)
    # GEMVs' t5: the block's loads issued, just before its wait (relative to the block's start).
    if launch["kind"] != 0x100 and working and all(b["extra"][1] >= 0 for b in working):
        first = min(working, key=lambda b: b["wait"] + b["t0"])
        out["issue"] = [statistics.median(b["extra"][1] for b in working), max(b["extra"][1] for b in working),
                        first["wait"] - first["extra"][1]]
    # Attention's finer stamps (timeline.h: t4 scores, t5 values, t6 rounds, t7 merged), medians.
    if working and all(b["extra"][0] >= 0 for b in working):
        out["extra"] = [statistics.median(b["t0"] + b["extra"][k] for b in working) - prev_end if b_ok else -1
                        for k, b_ok in ((k, all(b["extra"][k] >= 0 for b in working)) for k in range(4))]
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    bins = 0
    per_block = "--blocks" in argv
    if "--layer-bins" in argv:
        bins = int(argv[argv.index("--layer-bins") + 1])
    steps = defaultdict(list)
    # The bench appends one block of rows per variant run, steps counting from 0: a variant named twice in one
    # --variants list (or a file appended to) gives a second run whose steps start again, reported apart as
    # "name #2" (merged, the two runs' launches would interleave into one nonsense step).
    runs, last_step = defaultdict(int), {}
    with open(argv[1]) as f:
        for r in csv.DictReader(f):
            run_key, step = (r["variant"], r["group"]), int(r["step"])
            if run_key in last_step and step < last_step[run_key]:
                runs[run_key] += 1
            last_step[run_key] = step
            if runs[run_key]:
                r["variant"] = f"{r['variant']} #{runs[run_key] + 1}"
            row = {"tag": r["tag"], "kind": int(r["kind"]), "sm": int(r["sm"]), "steps": int(r["steps"]), "t0": float(r["t0_us"]),
                   "wait": float(r["wait_us"]), "staged": float(r["staged_us"]), "loop": float(r["loop_us"]),
                   "end": float(r["end_us"]), "step_ms": float(r["step_ms"]),
                   "extra": [float(r.get(f"t{k}_us", -1)) for k in range(4, 8)]}
            steps[(r["variant"], r["group"], r["step"])].append(row)
    per_config = defaultdict(lambda: defaultdict(list))  # (variant, group) -> role -> [stat]
    layer_times = defaultdict(list)
    step_spans = defaultdict(list)
    sample_layer = {}
    block_layer = {}  # (variant, group) -> [(role, launch, the kernel before's end)] of one middle layer
    for (variant, group, step), rows in sorted(steps.items()):
        launches = launches_of(rows)
        kinds = [l["kind"] for l in launches]
        # Layers: q/k/v (4-bit norm) followed by attention.
        starts = [i for i in range(len(kinds) - 1) if kinds[i] == 0x41 and kinds[i + 1] == 0x100]
        if len(starts) < 4:
            print(f"{variant} g{group} step {step}: {len(launches)} launches, no layer pattern; kinds {kinds[:12]}")
            continue
        key = (variant, group)
        step_spans[key].append(max(b["t0"] + b["end"] for b in rows if b["end"] >= 0) - min(b["t0"] for b in rows))
        ends = []
        prev_end = None
        for i, l in enumerate(launches):
            s = stat(l, prev_end if prev_end is not None else l["start"], launches[i - 1]["blocks"] if i > 0 else ())
            l["stat"] = s
            ends.append(s["abs_end"])
            prev_end = s["abs_end"]
        middle = starts[2:-2] if len(starts) > 8 else starts[1:-1]
        for li in middle:
            for k, role in enumerate(LAYER_ROLES):
                per_config[key][role].append(launches[li + k]["stat"])
            layer_times[key].append(ends[li + 4] - ends[li - 1])
        tail = launches[starts[-1] + 5:]
        for l in tail:
            per_config[key]["after the layers: " + KIND_NAMES.get(l["kind"], hex(l["kind"]))].append(l["stat"])
        if per_block and key not in block_layer:
            li = middle[len(middle) // 2]
            block_layer[key] = [(LAYER_ROLES[k], launches[li + k], ends[li + k - 1]) for k in (0, 3)]
        if bins and key not in sample_layer:
            li = middle[len(middle) // 2]
            t_begin, t_end = ends[li - 1], ends[li + 4]
            sample_layer[key] = (t_begin, t_end, [launches[li + k] for k in range(5)])
    for key, roles in per_config.items():
        variant, group = key
        med = statistics.median
        print(f"\n## {variant}, group {group}: step span {med(step_spans[key]) / 1e3:.3f} ms (blocks' first start to last end), "
              f"a layer {med(layer_times[key]):.2f} us (median of {len(layer_times[key])})\n")
        print("| kernel | blocks | SMs | first in | last in | released | staged, median / last | loop, median / last | end | epilogue | GB/s |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        total = 0.0
        for role, stats in roles.items():
            m = {k: med([s[k] for s in stats]) for k in stats[0] if k not in ("extra", "issue", "early_by")}
            if role in LAYER_ROLES:
                total += m["end"]
            blocks = f"{m['working']:.0f}/{m['blocks']:.0f}" if m["working"] != m["blocks"] else f"{m['blocks']:.0f}"
            gbs = m["bytes"] / (m["end"] * 1e3) if m["bytes"] and m["end"] > 0 else 0
            epilogue = "-" if role == "attention" else f"{m['epilogue']:.2f}"  # its "loop" stamp is not a loop end
            print(f"| {role} | {blocks} | {m['sms']:.0f} | {m['first_in']:.2f} | {m['last_in']:.2f} | {m['released']:.2f} | {m['staged_med']:.2f} / {m['staged']:.2f} | "
                  f"{m['loop_med']:.2f} / {m['loop']:.2f} | {m['end']:.2f} | {epilogue} | {gbs:.0f} |")
        print(f"\nsum of the layer's five shares: {total:.2f} us")
        early = []
        for role in LAYER_ROLES:
            if role not in roles:
                continue
            stats = roles[role]
            mid = stats[len(stats) // 2]  # one middle layer's SM picture
            by = ", ".join(f"{n} on SMs with {c} ({sms} SMs)" for c, (n, sms) in sorted(mid["early_by"].items()) if n or c)
            early.append(f"{role} {med([s_['early'] for s_ in stats]):.0f} of {mid['blocks']} ({by})")
        print("blocks started > 0.5 us before the kernel before ended (median layer; one layer by the kernel before's "
              "blocks on their SM): " + "; ".join(early))
        norms = [f"{role} {med([s_['extra'][0] for s_ in roles[role]]):.2f}" for role in ("q/k/v", "gate/up")
                 if role in roles and all("extra" in s_ for s_ in roles[role])]
        if norms:
            print("RMSNorm inputs, median block's sum of squares done (x read and reduced) after the kernel before: " + ", ".join(norms) + " us")
        issue = [f"{role} {med([s_['issue'][0] for s_ in roles[role]]):.2f} / {med([s_['issue'][1] for s_ in roles[role]]):.2f} / "
                 f"{med([s_['issue'][2] for s_ in roles[role]]):.2f}" for role in LAYER_ROLES
                 if role in roles and all("issue" in s_ for s_ in roles[role])]
        if issue:
            print("GEMV blocks' loads issued before the wait (t5 - start: median / slowest block; the first block past the wait "
                  "waited after it): " + ", ".join(issue) + " us")
        att = [s_["extra"] for s_ in roles.get("attention", []) if "extra" in s_]
        if att:
            e = [med([x[k] for x in att]) for k in range(4)]
            print(f"attention's working blocks, medians after q/k/v's end: first round's scores {e[0]:.2f}, its values "
                  f"{e[1]:.2f}, all rounds {e[2]:.2f}, slots merged and written {e[3]:.2f} us")
        for role, launch, prev_end in block_layer.get(key, []):
            bl = [b for b in launch["blocks"] if b["wait"] >= 0]

            def spread_of(values):
                v = sorted(values)
                return " / ".join(f"{v[int(q * (len(v) - 1))]:.2f}" for q in (0, 0.1, 0.5, 0.9, 1)) if v else "-"

            at = lambda k: [b["t0"] + b[k] - prev_end for b in bl if b[k] >= 0]
            t4 = [b for b in bl if b["extra"][0] >= 0]
            print(f"\n{role}'s blocks in one layer (us after the kernel before's end; quantiles 0 / 10 / 50 / 90 / 100%):")
            print(f"  started {spread_of(b['t0'] - prev_end for b in bl)}")
            print(f"  past the wait {spread_of(at('wait'))}")
            if t4:
                print(f"  sum of squares done {spread_of(b['t0'] + b['extra'][0] - prev_end for b in t4)}"
                      f" (after the wait: {spread_of(b['extra'][0] - b['wait'] for b in t4)})")
            print(f"  staged {spread_of(at('staged'))}")
            print(f"  out of the loop {spread_of(at('loop'))}")
            per_sm = defaultdict(list)
            for b in bl:
                per_sm[b["sm"]].append(b)
            by_count = defaultdict(list)  # the launch's blocks on an SM -> those SMs' median loop ends
            for sm_blocks in per_sm.values():
                by_count[len(sm_blocks)].append(statistics.median(b["t0"] + b["loop"] - prev_end for b in sm_blocks if b["loop"] >= 0))
            print("  out of the loop by its blocks on an SM: " + "; ".join(
                f"{n} a SM: {len(v)} SMs, median {statistics.median(v):.2f}, last {max(v):.2f}" for n, v in sorted(by_count.items())))
        if key in sample_layer:
            t_begin, t_end, ls = sample_layer[key]
            width = (t_end - t_begin) / bins
            streamed = [0.0] * bins

            def spread(a, z, nbytes):
                rate = nbytes / max(z - a, 1e-3)  # bytes per us
                for i in range(bins):
                    lo, hi = t_begin + i * width, t_begin + (i + 1) * width
                    streamed[i] += rate * max(0.0, min(hi, z) - max(lo, a))

            with_t5 = all(b["extra"][1] >= 0 for l in ls for b in l["blocks"] if b["loop"] >= 0 and b["steps"] > 0)
            for l in ls:
                for b in l["blocks"]:
                    if b["loop"] < 0 or b["steps"] == 0:
                        continue
                    if with_t5:
                        # The first min(steps, 16) steps (register batches and the 16-step L2 prefetch) are asked
                        # for before the wait: spread from the block's start to 1 us after it issued them (t5);
                        # the rest over its main loop (staged .. loop end).
                        early = min(b["steps"], 16)
                        spread(b["t0"], b["t0"] + b["extra"][1] + 1.0, early * 2048.0)
                        if b["steps"] > early:
                            spread(b["t0"] + b["staged"], b["t0"] + b["loop"], (b["steps"] - early) * 2048.0)
                    else:
                        spread(b["t0"], b["t0"] + b["loop"], b["steps"] * 2048.0)
            how = ("the pre-wait steps over start .. t5 + 1 us, the rest over staged .. loop end" if with_t5
                   else "blocks' bytes spread over start .. loop end")
            print(f"\none layer's weight stream, {bins} bins of {width:.2f} us (GB/s, {how}):")
            print(" ".join(f"{s / width / 1e3:.0f}" for s in streamed))
            idle = sum(1 for s in streamed if s / width / 1e3 < 1000)
            print(f"bins under 1 TB/s: {idle} of {bins} ({100.0 * idle / bins:.0f}% of the layer)")
            marks = []
            for k, l in enumerate(ls):
                marks.append(f"{LAYER_ROLES[k]} ends {(l['stat']['abs_end'] - t_begin):.1f}")
            print("; ".join(marks))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
