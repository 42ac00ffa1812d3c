#!/usr/bin/env bash
# Run 6: run 4's CUDA captures rebuilt with the launch cost kept, replayed against the new graphs;
# the one-GPU DDP fidelity run again (simulation only).
set -u
OUT=$1
export PYTHONUNBUFFERED=1
mkdir -p /tmp/gc && tar xzf gpu_recheck/gpu-captures.tgz -C /tmp/gc
ONLY="gpt_build gpt_simulate gpt_replay ddp_build ddp_simulate ddp_replay fsdp_build fsdp_simulate fsdp_replay" \
  bash benchmarks/gpu_checks.sh /tmp/gc "$OUT/gpu.tgz" > "$OUT/checks.log" 2>&1
timeout 100 python3 benchmarks/fidelity.py --device cuda --dp 1 --repeats 2 --warmup 10 --no-replay \
  --cluster-spec benchmarks/results/fidelity-programs-spec.toml --work-dir /tmp/fw --json "$OUT/ddp_fidelity.json" \
  --program "examples/ddp.py --device cuda --steps 40 --log-every 1 --hidden 1024 --layers 8 --vocab 4096 --batch 16 --seq 256" \
  > "$OUT/ddp_fidelity.log" 2>&1
cp /tmp/gc/summary.txt "$OUT/"
cat "$OUT/summary.txt"; tail -22 "$OUT/ddp_fidelity.log" | head -8
