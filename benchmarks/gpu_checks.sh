#!/usr/bin/env bash
# Every check that needs a GPU, in one go, so that a GPU host's time goes to measuring.
#
#   bash benchmarks/gpu_checks.sh [OUT] [ARCHIVE]
#
# OUT: where logs and results go (default gpu-checks/). ARCHIVE: a .tgz refreshed after every
# step with OUT's logs and results (not the captures' traces), so that what ran is kept even if
# the whole run is cut short; at the end ARCHIVE's name with -captures before .tgz holds the
# captures, graphs and replay directories, to look into on another machine. Do not wrap the script
# in `timeout`: a step's own limit ends its whole process tree, an outer one leaves the running
# step's processes on the GPU. Each step runs on, whatever the one before did, under its own time
# limit; its log is OUT/<step>.log and one line per step goes to OUT/summary.txt. On a machine
# whose python has torch, pandas, pyarrow, numba, typer and rich but not prism, prism is
# installed first without dependencies (PY=... picks the python). DEVICE=cpu and DDP_MODEL=...
# (smaller sizes) run the same steps on a machine without a GPU, to check the script itself;
# ONLY="step step ..." runs those steps alone (a rerun of the ones that failed).
# Steps:
#   trace_job     benchmarks/gpu_trace_job.py: a 1-GPU training job's torch.profiler trace, a
#                 trace prism was not developed on (trace_job_wide: the same job 4x wider)
#   from_traces   benchmarks/from_traces.py on both: each step recorded vs its graph's simulation
#   gpu_tests     pytest tests/gpu (CUDA capture; a real NCCL pair where there are two GPUs; the
#                 graph of a GPU trace recorded here reproduces its step within 1 %)
#   stream_gate   benchmarks/gpu_stream_gate.py: how precisely the host can hold a CUDA stream for
#                 a time it names (host functions, stream wait values), for virtual peers' calls
#                 that end on the GPU's timeline
#   gpt_*         the built-in GPT on CUDA: a slice of tp=2 pp=2 dp=4 captured with --device
#                 cuda, its graph built and simulated, ranks 0 and 3 replayed on the GPU (one
#                 after the other where the host has one GPU)
#   ddp_*         examples/ddp.py on CUDA (NCCL), an unmodified program: a slice of dp=8
#                 captured, its graph built and simulated, rank 3 replayed against 7 virtual peers
#   ddp_fidelity  benchmarks/fidelity.py on examples/ddp.py at dp=1 (one GPU): its real run under
#                 torchrun against the simulation and the replay of its graph, 3 interleaved repeats
#   fsdp_*        examples/fsdp2.py on CUDA (FSDP2: all-gathers and reduce-scatters on their own
#                 streams): a slice of dp=8 captured, built, simulated, rank 3 replayed
#   tp_fsdp_*     examples/tp_fsdp.py on CUDA (DTensor tensor parallel inside FSDP2, tp=2 dp=4):
#                 captured, built, simulated, rank 3 replayed
#   compile_*     examples/compile_ddp.py --compile-inside on CUDA (compiled model in DDP, dp=8):
#                 captured, built, simulated, rank 3 replayed
#   llama_*       examples/hf_llama.py --tp 2 on CUDA (a Hugging Face Llama, tensor parallel inside
#                 FSDP2, tp=2 dp=4, gradient accumulation and clipping): captured, built, simulated,
#                 rank 3 replayed; skipped where transformers is not installed
#   torchtitan_*  torchtitan's llama3 debug model, unmodified (python -m torchtitan.train), tensor
#                 parallel inside FSDP2 (tp=2 dp=4), its tokenizer and data made by
#                 tests/data/torchtitan/make_assets.py: captured, built, simulated, rank 3
#                 replayed; skipped where torchtitan is not installed (torchtitan 0.3.0 needs torch 2.14)
#   megatron_*    examples/megatron_gpt.py (Megatron-core's GPTModel, DDP, optimizer and schedules),
#                 tp=2 dp=4; megatron_pp_* at tp=2 pp=2 dp=2 (1F1B); megatron_distopt_* with the
#                 distributed optimizer: each captured, built, simulated, rank 3 replayed;
#                 megatron_fidelity at tp=1 against its fully real run (REPEATS, default 3, under
#                 FIDELITY_LIMIT seconds, default 300);
#                 skipped where megatron-core is not installed
set -u
OUT=${1:-${OUT:-gpu-checks}}
ARCHIVE=${2:-}
export PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
read -r -a DDP_MODEL <<< "${DDP_MODEL:---hidden 1024 --layers 8 --vocab 4096 --batch 16 --seq 256}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: the torchtitan chain runs in a folder of its own
: > "$OUT/summary.txt"

archive() {
  [ -n "$ARCHIVE" ] && tar czf "$ARCHIVE" -C "$(dirname "$OUT")" --exclude='*cap' --exclude='replay*' \
    --exclude='*.parquet' --exclude='fidelity_*' "$(basename "$OUT")" 2>/dev/null
  return 0
}

# step NAME SECONDS COMMAND...: run COMMAND under a time limit, log it, record how it went.
step() {
  local name=$1 limit=$2; shift 2
  local began=$SECONDS status
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $name "* ]] || return 0
  echo "== $name (limit ${limit}s): $*"
  if timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1; then status=ok
  else
    local code=$?
    if [ "$code" = 124 ]; then status="TIMED OUT after ${limit} s"; else status="FAILED (exit $code)"; fi
  fi
  echo "$name: $status in $((SECONDS - began)) s" | tee -a "$OUT/summary.txt"
  tail -n 12 "$OUT/$name.log"
  archive
}

# keep_iterations WORK NAME: each repeat's iteration times from a fidelity work directory (the real
# run's rank*.json and the capture's rank*.result.json, a few KiB each), into OUT as
# NAME_repeatN_real_rankR.json and NAME_repeatN_capture_rankR.json: the archive leaves the work
# directory out, and these say whether a prediction's spread came from the capture or the real side.
keep_iterations() {
  local f rel
  for f in "$1"/*/repeat*/real/rank*.json "$1"/*/repeat*/capture/logs/rank*.result.json; do
    [ -f "$f" ] || continue
    rel=${f#"$1"/*/}
    rel=${rel//\/real\//_real_}; rel=${rel//\/capture\/logs\//_capture_}; rel=${rel/.result.json/.json}
    cp "$f" "$OUT/$2_$rel"
  done
}

# cli MODULE ARGS...: a prism command line, whether or not its console script is on PATH.
cli() { "$PY" -c "import sys; from $1 import main; sys.argv[0] = '$1'; sys.exit(main())" "${@:2}"; }
export -f cli

{ date -u; nvidia-smi 2>&1 || echo "no nvidia-smi"; "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"; nproc; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
if ! "$PY" -c "import prism.graph" 2>/dev/null; then
  ONLY= step install 120 "$PY" -m pip install -q --no-deps --no-build-isolation -e .
fi

step trace_job 90 "$PY" benchmarks/gpu_trace_job.py --out "$OUT/traces"
step trace_job_wide 90 "$PY" benchmarks/gpu_trace_job.py --out "$OUT/traces_wide" --hidden 4096 --layers 4 --batch 8 --seq 512
step from_traces 90 "$PY" benchmarks/from_traces.py "$OUT/traces" "$OUT/traces_wide"
step gpu_tests 180 "$PY" -m pytest -q -rs -p no:cacheprovider tests/gpu
step stream_gate 90 "$PY" benchmarks/gpu_stream_gate.py --json "$OUT/stream_gate.json"

GPT=(--layers 4 --hidden 256 --heads 4 --seq-len 128 --microbatches 4 --vocab 4096)
step gpt_capture 120 bash -c 'cli "$@"' cli prism.capture.cli --device $DEVICE --tp 2 --pp 2 --dp 4 "${GPT[@]}" --warmup 5 --iterations 2 --overwrite -o "$OUT/gpt_cap"
step gpt_build 60 bash -c 'cli "$@"' cli prism.graph.build.cli "$OUT/gpt_cap" --tp 2 --pp 2 --dp 4 -o "$OUT/gpt.parquet"
step gpt_simulate 60 bash -c 'cli "$@"' cli prism.graph.sim.cli "$OUT/gpt.parquet" -o "$OUT/gpt_simulate.json"
TOGETHER=$([ "$DEVICE" = cpu ] || [ "$("$PY" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ] || echo --separately)
step gpt_replay 120 bash -c 'cli "$@"' cli prism.replay.cli "$OUT/gpt.parquet" --rank 0 --rank 3 $TOGETHER --device $DEVICE --warmup 5 --iterations 2 --overwrite -o "$OUT/replay_gpt"
cp "$OUT/replay_gpt/report.json" "$OUT/gpt_replay_report.json" 2>/dev/null

# program_chain NAME "LAYOUT" PROGRAM ARGS...: an unmodified program's slice captured at LAYOUT
# (prism's layout options, "--tp 2 --pp 1 --dp 4"), its graph built and simulated, rank 3 replayed
# against its virtual peers. The capture's profiler correction is the median of 8 clean warm-up
# iterations (with 3, a host-bound program's was unsteady: 4.9-7.6 % iteration cv on the H200).
program_chain() {
  local name=$1; local -a layout; read -r -a layout <<< "$2"; shift 2
  step "${name}_capture" 150 bash -c 'cli "$@"' cli prism.capture.cli --device $DEVICE "${layout[@]}" --warmup 10 --iterations 2 --overwrite -o "$OUT/${name}_cap" -- "$@"
  step "${name}_build" 60 bash -c 'cli "$@"' cli prism.graph.build.cli "$OUT/${name}_cap" "${layout[@]}" -o "$OUT/$name.parquet"
  step "${name}_simulate" 60 bash -c 'cli "$@"' cli prism.graph.sim.cli "$OUT/$name.parquet" -o "$OUT/${name}_simulate.json"
  step "${name}_replay" 150 bash -c 'cli "$@"' cli prism.replay.cli "$OUT/$name.parquet" --rank 3 --warmup 5 --iterations 2 --overwrite -o "$OUT/replay_$name"
  cp "$OUT/replay_$name/report.json" "$OUT/${name}_replay_report.json" 2>/dev/null
}

DDP=(examples/ddp.py --device "$DEVICE" --steps 40 --log-every 1 "${DDP_MODEL[@]}")
program_chain ddp "--tp 1 --pp 1 --dp 8" "${DDP[@]}"
step ddp_fidelity 240 "$PY" benchmarks/fidelity.py --device $DEVICE --dp 1 --repeats 3 --warmup 10 \
  --cluster-spec benchmarks/results/fidelity-programs-spec.toml --work-dir "$OUT/fidelity_work" --json "$OUT/ddp_fidelity.json" --program "${DDP[*]}"
keep_iterations "$OUT/fidelity_work" ddp_fidelity
program_chain fsdp "--tp 1 --pp 1 --dp 8" examples/fsdp2.py --device "$DEVICE" --steps 40 "${DDP_MODEL[@]}"
program_chain tp_fsdp "--tp 2 --pp 1 --dp 4" examples/tp_fsdp.py --device "$DEVICE" --tp 2 --steps 40 "${DDP_MODEL[@]}"
program_chain compile "--tp 1 --pp 1 --dp 8" examples/compile_ddp.py --device "$DEVICE" --compile-inside --steps 40 "${DDP_MODEL[@]}"
if "$PY" -c "import transformers" 2>/dev/null; then
  program_chain llama "--tp 2 --pp 1 --dp 4" examples/hf_llama.py --device "$DEVICE" --tp 2 --steps 40 "${DDP_MODEL[@]}"
else
  echo "llama_*: skipped (transformers is not installed)" | tee -a "$OUT/summary.txt"
fi
if "$PY" -c "import torchtitan" 2>/dev/null; then
  # torchtitan reads ./tests/assets: the chain runs where make_assets.py wrote them.
  "$PY" tests/data/torchtitan/make_assets.py "$OUT/torchtitan" > /dev/null
  TT=(-m torchtitan.train --module llama3 --config llama3_debugmodel --training.seq_len "${TT_SEQ:-1024}"
      --training.local_batch_size 4 --training.steps 40 --metrics.log_freq 10 --training.disable_cuda_graphs
      --parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 4)
  (cd "$OUT/torchtitan" && program_chain torchtitan "--tp 2 --pp 1 --dp 4" "${TT[@]}")
else
  echo "torchtitan_*: skipped (torchtitan is not installed)" | tee -a "$OUT/summary.txt"
fi
if [ "$DEVICE" != cpu ] && "$PY" -c "import megatron.core" 2>/dev/null; then
  # Megatron's ranks: tp fastest, then dp, then pp (prism's default order).
  MEGATRON=(examples/megatron_gpt.py --tp 2 --steps 40 --layers 8 --hidden 1024 --heads 16 --vocab 4096
            --seq 256 --micro-batch 4 --microbatches 4)
  program_chain megatron "--tp 2 --pp 1 --dp 4" "${MEGATRON[@]}"
  program_chain megatron_pp "--tp 2 --pp 2 --dp 2" "${MEGATRON[@]}" --pp 2
  program_chain megatron_distopt "--tp 2 --pp 1 --dp 4" "${MEGATRON[@]}" --distributed-optimizer
  step megatron_fidelity "${FIDELITY_LIMIT:-300}" "$PY" benchmarks/fidelity.py --device $DEVICE --dp 1 --repeats "${REPEATS:-3}" --warmup 10 \
    --cluster-spec benchmarks/results/fidelity-programs-spec.toml --work-dir "$OUT/fidelity_megatron" \
    --json "$OUT/megatron_fidelity.json" --program "${MEGATRON[*]} --tp 1"
  keep_iterations "$OUT/fidelity_megatron" megatron_fidelity
else
  echo "megatron_*: skipped (megatron-core is not installed, or no CUDA)" | tee -a "$OUT/summary.txt"
fi
echo "summary:"; cat "$OUT/summary.txt"
archive
if [ -n "$ARCHIVE" ]; then
  (cd "$OUT" && tar czf "${ARCHIVE%.tgz}-captures.tgz" $(ls -d *_cap *.parquet replay_* 2>/dev/null))
fi
