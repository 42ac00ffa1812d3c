set -e
cd /work/main
rm -rf /tmp/tpab && mkdir -p /tmp/tpab
.venv/bin/python benchmarks/fidelity.py --repeats 3 --warmup 12 --recalibrate --calibrate-into benchmarks/results/cold_signed_ab/spec.toml \
  --calibrate-reps 100 --calibrate-cold-gaps-ms 0.5,1,2,4,16,64 --work-dir /tmp/tpab/wd \
  --case "tp=2 layers=4 hidden=128 heads=4 seq=32 mbs=4 microbatches=4" \
  --case "tp=2 layers=2 hidden=192 heads=8 seq=32 mbs=1 microbatches=8" \
  --json /tmp/tpab/run.json > /tmp/tpab/run.txt 2>&1
.venv/bin/python - <<'PY'
from dataclasses import replace
from pathlib import Path
from prism.schemas.cluster import ClusterSpec
s = ClusterSpec.load(Path("benchmarks/results/cold_signed_ab/spec.toml"))
replace(s, cold_call={k: max(0.0, v) for k, v in s.cold_call.items()}).save(Path("benchmarks/results/cold_signed_ab/spec_floored.toml"))
print(dict(s.cold_call))
PY
.venv/bin/python benchmarks/fidelity_respec.py /tmp/tpab/run.json /tmp/tpab/wd signed=benchmarks/results/cold_signed_ab/spec.toml floored=benchmarks/results/cold_signed_ab/spec_floored.toml --json /tmp/tpab/respec.json > /tmp/tpab/respec.txt 2>&1
echo done
