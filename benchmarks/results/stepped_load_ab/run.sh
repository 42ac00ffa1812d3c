#!/bin/bash
# Interleaved A/B: the slice's load ranks stepped (default) against each alone (--unstepped-load).
cd /work/main
SPEC=benchmarks/results/fidelity-spec-577215-2.toml
declare -A CASES=(
  [R2]="dp=2 layers=2 hidden=256 heads=4 seq=64 mbs=2 microbatches=1 vocab=1024"
  [R4]="dp=2 layers=4 hidden=128 heads=4 seq=32 mbs=4 microbatches=2"
  [R6]="tp=2 layers=4 hidden=256 heads=2 seq=64 mbs=1 microbatches=2"
  [R10]="tp=2 layers=2 hidden=192 heads=8 seq=64 mbs=2 microbatches=2"
)
for round in 1 2; do
  for name in R2 R4 R6 R10; do
    for arm in stepped alone; do
      extra=""; [ $arm = alone ] && extra="--unstepped-load"
      .venv/bin/python benchmarks/fidelity.py --case "${CASES[$name]}" --repeats 2 --warmup 12 --no-replay --no-probe \
        --cluster-spec $SPEC $extra --json /tmp/ab/$name-$arm-$round.json --work-dir /tmp/ab/wd-$name-$arm-$round > /tmp/ab/$name-$arm-$round.log 2>&1
      echo "$(date +%T) $name $arm $round rc=$?"
    done
  done
done
