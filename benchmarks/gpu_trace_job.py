"""Record a GPU training job's Kineto trace as anyone would, for ``prism-build-graph --from-traces``.

    python benchmarks/gpu_trace_job.py --out traces/ [--steps 6] [--hidden 1024] [--layers 8]

One process, one GPU: a stack of MLP blocks trained with AdamW on random tokens, under
``torch.profiler`` with CPU and CUDA activities and a schedule (1 step to wait, 1 to warm up,
``--steps`` recorded). Every step ends with ``loss.item()``, a blocking device-to-host copy, as
training loops that log their loss do. Writes ``OUT/rank0.json.gz`` (no ``distributedInfo``: a
job of one rank). Exits with 2 and one line where no GPU is there. A trace prism was not
developed on: ``benchmarks/gpu_checks.sh`` builds its graph and compares each step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn as nn


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: no CUDA device: this job records a GPU trace", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    vocab = 4096
    blocks: list[nn.Module] = [nn.Embedding(vocab, args.hidden)]
    for _ in range(args.layers):
        blocks += [nn.LayerNorm(args.hidden), nn.Linear(args.hidden, 4 * args.hidden), nn.GELU(),
                   nn.Linear(4 * args.hidden, args.hidden)]  # fmt: skip
    blocks.append(nn.Linear(args.hidden, vocab))
    model = nn.Sequential(*blocks).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, vocab, (args.batch, args.seq + 1), device="cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "rank0.json.gz"
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=args.steps, repeat=1)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(
        activities=activities, schedule=schedule, on_trace_ready=lambda p: p.export_chrome_trace(str(path))
    ) as profiler:
        for _ in range(args.steps + 2):
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss.item()  # the step waits for the GPU, as a loop that logs its loss does
            profiler.step()
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
