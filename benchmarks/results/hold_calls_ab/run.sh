# Held vs free-running slice captures of the fixed tp case C1, interleaved (free, held, free, held),
# one repeat each, no replay, priced with today's calibration.
set -e
cd "$(dirname "$0")/../../.."
S=benchmarks/results/fidelity-spec-20261127.toml
C1='tp=2 pp=1 dp=1 layers=4 hidden=128 heads=4 seq=64 mbs=2 microbatches=8'
OUT=benchmarks/results/hold_calls_ab
for i in 1 2; do
  for mode in free held; do
    flag=; [ $mode = free ] && flag=--free-running
    .venv/bin/python benchmarks/fidelity.py --case "$C1" --repeats 1 --warmup 12 --no-replay --no-probe \
      --cluster-spec $S $flag --json $OUT/c1_${mode}_$i.json > $OUT/c1_${mode}_$i.txt 2>&1
  done
done
