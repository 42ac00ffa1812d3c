#!/bin/bash
# Interleaved A/B on the pp=2 case C9: before this session's build changes (22da5a1, its own
# spec) and after (main, a spec calibrated with the post-excluding transfer timing).
set -e
cd "$(git rev-parse --show-toplevel)"
CASE="tp=1 pp=2 dp=1 layers=2 hidden=128 heads=4 seq=32 mbs=4 microbatches=4 vocab=1024"
OUT=${OUT:-benchmarks/results/pp_posts_ab}
mkdir -p $OUT
for i in 1 2 3; do
  git checkout -q 22da5a1
  .venv/bin/python benchmarks/fidelity.py --case "$CASE" --repeats 2 --warmup 12 --no-replay --no-probe \
    --cluster-spec benchmarks/results/fidelity-spec-112711.toml --json $OUT/before_$i.json > $OUT/before_$i.txt 2>&1
  git checkout -q main
  .venv/bin/python benchmarks/fidelity.py --case "$CASE" --repeats 2 --warmup 12 --no-replay --no-probe \
    --cluster-spec benchmarks/results/p2p_posts_c9_spec.toml --json $OUT/after_$i.json > $OUT/after_$i.txt 2>&1
done
git checkout -q main
echo done
