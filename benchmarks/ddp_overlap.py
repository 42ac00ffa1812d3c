"""What real gradient all-reduces cost a small DDP step on this machine, beside its compute.

    .venv/bin/python benchmarks/ddp_overlap.py [--hidden 128] [--layers 2] [--vocab 512] [--seq 32]
                                               [--steps 300] [--repeats 3]

Trains the model of examples/ddp.py (its defaults here: the size of examples/compile_ddp.py, a
10-14 ms step) three ways, in turn, ``--repeats`` times: one process alone; two processes under
torchrun that never communicate (two ranks' compute sharing the cores); two ranks under
DistributedDataParallel over gloo (a fully real run, what prism's fidelity runs compare with).
Each step is timed in forward, backward and optimizer step with ``time.perf_counter`` (the first
20 steps left out). Printed per way: each block's p10 / median / p90 over the steps of every rank
and repeat, ms. A slice capture or a replay of the same job sees the first two ways' compute (its
peers are virtual); what the third adds beyond the comm model's price of its all-reduces is the
part of a real CPU run that neither times.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
WAYS = {
    "alone": "one process alone",
    "two": "two processes, no communication",
    "ddp": "two ranks, DDP over gloo",
}
BLOCKS = ("forward", "backward", "optimizer", "step")
SKIP = 20


def _worker(way: str, args: argparse.Namespace, out: Path) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel

    spec = importlib.util.spec_from_file_location("ddp_example", ROOT / "examples" / "ddp.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.set_num_threads(1)
    distributed = way != "alone"
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)
    model = example.build_model(args.vocab, args.hidden, args.layers)
    if way == "ddp":
        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    steps = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        tokens = torch.randint(args.vocab, (args.batch, args.seq + 1), generator=generator)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        t1 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        steps.append((t1 - t0, t2 - t1, t3 - t2, t3 - t0))
    (out / f"{way}.rank{rank}.json").write_text(json.dumps(steps[SKIP:]))
    if distributed:
        # Both ranks past their last exchange, and DDP's reducer (which holds the group) freed
        # here rather than at interpreter exit: gloo's threads otherwise abort now and then as
        # the process ends.
        dist.barrier()
        del model, optimizer
        gc.collect()
        dist.destroy_process_group()


def _run(way: str, argv: list[str], out: Path) -> None:
    worker = [str(Path(__file__).resolve()), "--worker", way, "--out", str(out), *argv]
    if way == "alone":
        command = [sys.executable, *worker]
    else:
        from prism.fidelity.torchrun import torchrun_command  # not in the ranks this file also runs as

        command = torchrun_command(2, out.parent / "torchrun", *worker)
    done = subprocess.run(
        command, env=os.environ | {"OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise SystemExit(f"{way} failed:\n{done.stdout}{done.stderr}")


def _quantiles_ms(values: list[float]) -> str:
    values = sorted(values)
    picks = [values[int(p * (len(values) - 1))] * 1e3 for p in (0.1, 0.5, 0.9)]
    return " / ".join(f"{v:.2f}" for v in picks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps <= SKIP:
        parser.error(f"--steps must be more than the {SKIP} left out")
    if args.worker:
        _worker(args.worker, args, args.out)
        return
    argv = [f"--{k}={getattr(args, k)}" for k in ("hidden", "layers", "vocab", "seq", "batch", "steps")]
    steps: dict[str, list] = {way: [] for way in WAYS}
    console = Console()
    with tempfile.TemporaryDirectory(prefix="prism-ddp-overlap-") as tmp:
        for repeat in range(args.repeats):
            for way in WAYS:
                console.log(f"repeat {repeat + 1}/{args.repeats}: {WAYS[way]}")
                out = Path(tmp) / f"r{repeat}"
                out.mkdir(exist_ok=True)
                _run(way, argv, out)
                for path in out.glob(f"{way}.rank*.json"):
                    steps[way] += json.loads(path.read_text())
    table = Table(title="a step of examples/ddp.py's model by block, p10 / median / p90 ms")
    table.add_column("way")
    for block in BLOCKS:
        table.add_column(block, justify="right")
    table.add_column("steps", justify="right")
    for way in WAYS:
        rows = steps[way]
        table.add_row(
            WAYS[way], *(_quantiles_ms([r[i] for r in rows]) for i in range(len(BLOCKS))), str(len(rows))
        )
    console.print(table)
    console.print(
        f"model: hidden {args.hidden}, layers {args.layers}, vocab {args.vocab}, seq {args.seq}, batch {args.batch}; "
        f"{args.steps} steps a run, the first {SKIP} left out, {args.repeats} repeats of each way in turn"
    )


if __name__ == "__main__":
    main()
