#!/bin/bash
# The same three slice captures of the pp=2 case C9 built twice: with a transfer's post kept in the
# gap before its call (82873f2~1) and run after it (82873f2); each graph simulated; the real runs
# of the same fidelity command are the reference. Build-only change: the captures are shared.
set -e
cd "$(git rev-parse --show-toplevel)"
CASE="tp=1 pp=2 dp=1 layers=2 hidden=128 heads=4 seq=32 mbs=4 microbatches=4 vocab=1024"
HERE=benchmarks/results/post_after_call
W=${W:-/tmp/post_after_call}
rm -rf $W && mkdir -p $W
.venv/bin/python benchmarks/fidelity.py --case "$CASE" --repeats 3 --warmup 12 --no-replay --no-probe \
  --cluster-spec $HERE/spec.toml --json $HERE/fidelity.json --work-dir $W > $W/fidelity.txt
build() {  # $1: tag
  for r in 0 1 2; do
    d=$(ls -d $W/tp1*/repeat$r)
    .venv/bin/prism-build-graph $d/slice --tp 1 --pp 2 --dp 1 --cluster $HERE/spec.toml -o $W/$1-$r.parquet > /dev/null
    .venv/bin/prism-simulate $W/$1-$r.parquet -o $W/$1-$r.json > /dev/null
  done
}
build after
git checkout -q 82873f2~1 -- graph/build && build before; git checkout -q HEAD -- graph/build
.venv/bin/python - "$W" "$HERE/fidelity.json" <<'PY' | tee $HERE/result.txt
import json, sys
w, fidelity = sys.argv[1], json.load(open(sys.argv[2]))
real = {r["rank"]: r["real_iter_ms"] for r in fidelity["records"] if r["source"] == "simulation"}
print("repeat rank  real median ms  before ms  after ms  change ms  before err  after err  gaps before/after ms")
for rep in range(3):
    b, a = (json.load(open(f"{w}/{t}-{rep}.json"))["ranks"] for t in ("before", "after"))
    for k in (0, 1):
        ib, ia = b["iteration_ns"][k] / 1e6, a["iteration_ns"][k] / 1e6
        print(f"{rep:6d} {k:4d} {real[k]:15.2f} {ib:10.2f} {ia:9.2f} {ia - ib:10.2f} {100 * (ib / real[k] - 1):+9.1f}% "
              f"{100 * (ia / real[k] - 1):+9.1f}%  {b['overhead_ns'][k] / 1e6:.2f} / {a['overhead_ns'][k] / 1e6:.2f}")
PY
