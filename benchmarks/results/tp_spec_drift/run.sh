set -e
cd "$(git rev-parse --show-toplevel)"
CASE="tp=2 layers=8 hidden=64 heads=4 seq=64 mbs=4 microbatches=1"
F=".venv/bin/python benchmarks/fidelity.py --case"
date
$F "$CASE" --repeats 2 --warmup 12 --no-replay --no-probe --recalibrate --calibrate-into benchmarks/results/tp_spec_drift/fresh.toml --calibrate-reps 100 --calibrate-cold-gaps-ms 0.5,1,2,4 --json benchmarks/results/tp_spec_drift/fresh0.json > benchmarks/results/tp_spec_drift/fresh0.log 2>&1
date
for i in 1 2; do
  $F "$CASE" --repeats 2 --warmup 12 --no-replay --no-probe --cluster-spec benchmarks/results/fidelity-spec-161803.toml --json benchmarks/results/tp_spec_drift/old$i.json > benchmarks/results/tp_spec_drift/old$i.log 2>&1
  $F "$CASE" --repeats 2 --warmup 12 --no-replay --no-probe --cluster-spec benchmarks/results/tp_spec_drift/fresh.toml --json benchmarks/results/tp_spec_drift/fresh$i.json > benchmarks/results/tp_spec_drift/fresh$i.log 2>&1
done
date
