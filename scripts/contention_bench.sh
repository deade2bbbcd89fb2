#!/usr/bin/env bash
# Two (or N) `petrel bench` processes on the same cores at once, as a busy server or a shared CI machine runs
# them: each process's pp and tg rates, beside one process alone. A thread pool whose threads wait for each
# other without yielding the core collapses here (a worker the OS has not scheduled holds every parallel_for
# up for a time slice).
# Usage: scripts/contention_bench.sh PETREL BUNDLE [processes=2] [bench flags, default: -p 128 -n 64 -r 5]
set -euo pipefail
petrel=$1 bundle=$2 n=${3:-2}
shift $(( $# < 3 ? $# : 3 ))
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(-p 128 -n 64 -r 5)
rates() {  # the bench's JSON -> "pp128 2200 tg64 1900"
  python3 -c 'import json, sys
print(" ".join("%s %.0f" % (r["test"], r["avg_ts"]) for r in json.load(sys.stdin)))'
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "alone:        $("$petrel" bench "$bundle" "${flags[@]}" -o json 2>/dev/null | rates)"
for i in $(seq "$n"); do ("$petrel" bench "$bundle" "${flags[@]}" -o json 2>/dev/null | rates > "$tmp/$i") & done
wait
for i in $(seq "$n"); do echo "$n at once, #$i: $(cat "$tmp/$i")"; done
