#!/usr/bin/env bash
# Every check that needs a GPU, in one go, so that a GPU host's time goes to measuring.
#
#   bash benchmarks/gpu_checks.sh [OUT]        # OUT: where logs and results go (default gpu-checks/)
#
# Each step runs on, whatever the one before did; its log is OUT/<step>.log and one line per step
# goes to OUT/summary.txt. On a machine whose python has torch, pandas, pyarrow, numba, typer and
# rich but not prism, prism is installed first without dependencies (PY=... picks the python).
# Steps:
#   gpu_tests    pytest tests/gpu (CUDA capture; a real NCCL pair where there are two GPUs; the
#                graph of a GPU trace recorded here reproduces its step within 1 %)
#   trace_job    benchmarks/gpu_trace_job.py: a 1-GPU training job's torch.profiler trace, a trace
#                prism was not developed on
#   from_traces  benchmarks/from_traces.py on it: each step recorded vs its graph's simulation
#   capture, build, simulate, replay
#                the built-in GPT on CUDA: a slice of tp=2 pp=2 dp=4 captured with --device cuda,
#                its graph built and simulated, ranks 0 and 3 replayed on the GPU against it
set -u
OUT=${1:-${OUT:-gpu-checks}}
PY=${PY:-python3}
mkdir -p "$OUT"
: > "$OUT/summary.txt"

step() {
  local name=$1; shift
  local began=$SECONDS
  echo "== $name: $*"
  if "$@" > "$OUT/$name.log" 2>&1; then status=ok; else status="FAILED (exit $?)"; fi
  echo "$name: $status in $((SECONDS - began)) s" | tee -a "$OUT/summary.txt"
  tail -n 15 "$OUT/$name.log"
}

{ date -u; nvidia-smi 2>&1 || echo "no nvidia-smi"; "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
if ! "$PY" -c "import prism.graph" 2>/dev/null; then
  step install "$PY" -m pip install -q --no-deps --no-build-isolation -e .
fi
run() { "$PY" -c "import sys; from $1 import main; sys.argv[0] = '$1'; sys.exit(main())" "${@:2}"; }

step gpu_tests "$PY" -m pytest -q -rs tests/gpu
step trace_job "$PY" benchmarks/gpu_trace_job.py --out "$OUT/traces"
step from_traces "$PY" benchmarks/from_traces.py "$OUT/traces"
MODEL=(--layers 4 --hidden 256 --heads 4 --seq-len 128 --microbatches 4 --vocab 4096)
step capture run prism.capture.cli --device cuda --tp 2 --pp 2 --dp 4 "${MODEL[@]}" --warmup 5 --iterations 2 -o "$OUT/cap"
step build run prism.graph.build.cli "$OUT/cap" --tp 2 --pp 2 --dp 4 -o "$OUT/graph.parquet"
step simulate run prism.graph.sim.cli "$OUT/graph.parquet" -o "$OUT/simulate.json"
step replay run prism.replay.cli "$OUT/graph.parquet" --rank 0 --rank 3 --device cuda --warmup 5 --iterations 2 -o "$OUT/replay"
cp "$OUT/replay/report.json" "$OUT/replay_report.json" 2>/dev/null || true
echo "summary:"; cat "$OUT/summary.txt"
