# Per-size vs all-sizes cold_call table on two tp=2 cases: run from anywhere; writes beside this file.
set -e
HERE=benchmarks/results/cold_by_size_ab
cd "$(dirname "$0")/../../.."
WD=$(mktemp -d /tmp/prism-cold-by-size-ab-XXXX)
.venv/bin/python benchmarks/fidelity.py --repeats 3 --warmup 12 --recalibrate --calibrate-into $HERE/spec.toml \
  --calibrate-reps 100 --calibrate-cold-gaps-ms 0.5,1,2,4,16,64 --work-dir $WD \
  --case "tp=2 layers=4 hidden=128 heads=4 seq=32 mbs=4 microbatches=4" \
  --case "tp=2 layers=2 hidden=192 heads=8 seq=32 mbs=1 microbatches=8" \
  --json $HERE/run.json > $HERE/run.txt 2>&1
# The same spec without its per-size table: every size priced by the all-sizes median.
.venv/bin/python - <<'PY'
from dataclasses import replace
from pathlib import Path
from prism.schemas.cluster import ClusterSpec
here = Path("benchmarks/results/cold_by_size_ab")
s = ClusterSpec.load(here / "spec.toml")
replace(s, cold_call_by_size={}).save(here / "spec_all_sizes.toml")
PY
.venv/bin/python benchmarks/fidelity_respec.py $HERE/run.json $WD by_size=$HERE/spec.toml all_sizes=$HERE/spec_all_sizes.toml \
  --json $HERE/respec.json > $HERE/respec.txt 2>&1
echo "work dir: $WD"
