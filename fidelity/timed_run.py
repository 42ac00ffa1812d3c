"""One rank of a program's real run: ``torchrun ... -m prism.fidelity.timed_run --out DIR ... -- train.py ARGS``.

The ground truth for a program's fidelity: the unmodified program under plain torchrun, every
rank real, its own backend (gloo), no prism backend. A hook on the program's outermost optimizer
steps times each iteration (from one step's end to the next; on CUDA after waiting for the device, as
prism's capture does) and measures its own cost. Each iteration's wall time in its forward,
backward and optimizer steps, found as a program's capture finds them
(``prism.capture.program_phases``), is kept too, the calls made inside them included, with what
timing them cost. After the
warm-up it records the live tensor bytes and profiles memory only (no shapes, stacks or
Execution Trace) for the remaining iterations, with the CPU allocator counting the frees of
every thread (``count_frees_on_every_thread``); then it ends the program and writes
``DIR/rank{r}.json`` (``TimedRun``) and ``DIR/rank{r}.trace.json.gz`` (the memory trace).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from prism.capture import annotate
from prism.capture.cpu_allocator import count_frees_on_every_thread
from prism.capture.cpu_mode import install_cpu_mode
from prism.capture.optimizer_steps import register_outer_step_hooks
from prism.capture.profiling import export_trace
from prism.capture.program_main import run_program
from prism.capture.program_phases import ProgramPhases
from prism.capture.step_iterations import ProgramStop, live_tensor_bytes
from prism.schemas.annotations import Mark, Phase
from prism.schemas.layout import ParallelLayout
from prism.schemas.program import ProgramSpec


@dataclass(kw_only=True)
class TimedRun:
    """What one rank of the real run measured (``rank{r}.json``)."""

    rank: int
    iteration_ns: list[int] = field(default_factory=list)
    """Wall time of every iteration, warm-up ones first."""
    hook_ns: list[int] = field(default_factory=list)
    """The timing hook's own wall time at each optimizer step (it runs inside the iteration)."""
    static_bytes: int = 0
    """Live tensor bytes when the first memory-profiled iteration began."""
    block_ns: list[dict[str, int]] = field(default_factory=list)
    """Every iteration's wall time in its forward, backward and optimizer steps by kind ('fwd',
    'bwd', 'optim'), the calls made inside them included, as ``RankResult.block_ns`` has them."""
    marks_ns: list[int] = field(default_factory=list)
    """What timing those blocks cost the program in every iteration."""

    @classmethod
    def read(cls, path: Path) -> TimedRun:
        data = json.loads(path.read_text())
        fields = ("rank", "iteration_ns", "hook_ns", "static_bytes", "block_ns", "marks_ns")
        return cls(**{k: data[k] for k in fields if k in data})


class TimedPhases(ProgramPhases):
    """The capture's phase boundaries, timed without marks: a real run has no trace to cut, and
    a mark (a ``record_function``) costs the program 10-150 µs on this VM, where two clock reads
    cost about 1 µs. Keeps each iteration's wall time by block kind, and what keeping it cost.
    Its layers are not marked: nothing reads them."""

    marks_layers = False

    def __init__(self) -> None:
        super().__init__()
        self.wall_ns: dict[str, int] = {}
        self.spent_ns = 0

    def take(self) -> tuple[dict[str, int], int]:
        """The wall time by kind and the cost since the last call (one iteration's)."""
        taken = self.wall_ns, self.spent_ns
        self.wall_ns, self.spent_ns = {}, 0
        return taken

    def _enter(self, marked: Mark) -> None:  # timed by phase alone
        began = time.perf_counter_ns()
        self._open[marked.phase] = began
        self.spent_ns += time.perf_counter_ns() - began

    def _close(self, phase: Phase) -> None:
        ended = time.perf_counter_ns()
        began = self._open.pop(phase, None)
        if began is not None:
            kind = str(phase)
            self.wall_ns[kind] = self.wall_ns.get(kind, 0) + ended - began
        self.spent_ns += time.perf_counter_ns() - ended


def trace_path(out: Path, rank: int) -> Path:
    return out / f"rank{rank}.trace.json.gz"


def result_path(out: Path, rank: int) -> Path:
    return out / f"rank{rank}.json"


class IterationTimer:
    """The optimizer post-hook: times iterations (and their ``phases``), then profiles memory for
    the last ones."""

    def __init__(
        self, run: TimedRun, *, warmup: int, total: int, out: Path, phases: TimedPhases, cuda: bool = False,
    ) -> None:  # fmt: skip
        self.run, self._warmup, self._total, self._out, self._cuda = run, warmup, total, out, cuda
        self._phases = phases
        self._profiler: torch.profiler.profile | None = None
        self._mark = None
        self._t0 = time.perf_counter_ns()

    def __call__(self, *_: object) -> None:
        if self._cuda:  # an iteration ends when its device work does
            torch.cuda.synchronize()
        entered = time.perf_counter_ns()
        self.run.iteration_ns.append(entered - self._t0)
        wall_ns, spent_ns = self._phases.take()
        self.run.block_ns.append(wall_ns)
        self.run.marks_ns.append(spent_ns)
        done = len(self.run.iteration_ns)
        if self._mark is not None:
            self._mark.__exit__(None, None, None)
            self._mark = None
        if done == self._warmup:
            self.run.static_bytes = live_tensor_bytes(cuda=self._cuda, buckets_in_python=False)
            if not self._cuda:  # gloo's threads free tensors too; the timed iterations are over
                count_frees_on_every_thread()
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self._cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities, profile_memory=True)
            self._profiler.__enter__()
        if done == self._total:
            self._stop_profiler()
            raise ProgramStop
        if self._profiler is not None:
            self._mark = annotate.mark(Mark(phase=Phase.ITERATION, iter=done))
            self._mark.__enter__()
        left = time.perf_counter_ns()
        self.run.hook_ns.append(left - entered)
        self._t0 = left

    def _stop_profiler(self) -> None:
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
            export_trace(self._profiler, trace_path(self._out, self.run.rank))
            self._profiler = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--iterations", type=int, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the program runs")
    parser.add_argument("program", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    argv_program = args.program[1:] if args.program[:1] == ["--"] else args.program
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    program = ProgramSpec(
        argv=tuple(argv_program), cwd=os.getcwd(), layout=ParallelLayout(tp=1, pp=1, dp=world)
    )
    args.out.mkdir(parents=True, exist_ok=True)
    if args.device == "cpu":  # a GPU program's set-up answered for the CPU, as in its capture
        install_cpu_mode()
    run = TimedRun(rank=rank)
    phases = TimedPhases()
    timer = IterationTimer(
        run, warmup=args.warmup, total=args.warmup + args.iterations, out=args.out, cuda=args.device == "cuda",
        phases=phases,
    )  # fmt: skip
    phases.install()  # before the timing hook: an optimizer mark closes before its iteration ends
    hook = register_outer_step_hooks(post=timer)
    try:
        run_program(program)
    except ProgramStop:
        pass
    finally:
        hook.remove()
        phases.remove()
    if len(run.iteration_ns) < args.warmup + args.iterations:
        print(f"error: the program made only {len(run.iteration_ns)} optimizer steps", file=sys.stderr)
        return 2
    result_path(args.out, rank).write_text(json.dumps(asdict(run)))
    # The program stopped mid-run: leave without its teardown (peers stop at the same step).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
