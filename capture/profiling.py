"""Kineto + Execution Trace recording of one rank's profiled iterations."""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule


@dataclass(frozen=True, kw_only=True)
class ProfileSpec:
    """Which iterations to profile and where the traces go."""

    warmup: int
    """Iterations run before the profiled window (not recorded)."""
    iterations: int
    """Iterations recorded."""
    kineto_path: Path
    """Kineto trace (Chrome JSON; gzipped when it ends in .gz)."""
    et_path: Path
    """Execution Trace JSON."""
    cuda: bool
    """Record GPU kernels too."""


class Profiler:
    """Steps the torch profiler once per iteration; ``step()`` after each iteration."""

    def __init__(self, prof: profile) -> None:
        self._prof = prof

    def step(self) -> None:
        self._prof.step()


def export_trace(prof: profile, path: Path) -> None:
    """Write ``prof``'s Chrome trace to ``path`` (gzipped when it ends in .gz), staged beside it.

    torch stages a .gz export as an uncompressed copy under the system temporary folder, left
    there when the rank is killed mid-export; staging in ``path``'s own folder keeps every byte
    of a run inside its output, and the rename makes ``path`` appear whole or not at all."""
    staged = path.with_name(".tmp-" + path.name.removesuffix(".gz"))
    prof.export_chrome_trace(str(staged))
    if path.suffix == ".gz":
        packed = path.with_name(".tmp-" + path.name)
        with staged.open("rb") as raw, gzip.open(packed, "wb") as out:
            shutil.copyfileobj(raw, out)
        staged.unlink()
        staged = packed
    os.replace(staged, path)


def _profiler_schedule(spec: ProfileSpec) -> schedule:
    # One profiler warm-up step (when there is a warm-up iteration) lets Kineto settle before
    # the active window; the remaining warm-up iterations are skipped entirely.
    warm = min(spec.warmup, 1)
    return schedule(wait=spec.warmup - warm, warmup=warm, active=spec.iterations, repeat=1)


@contextlib.contextmanager
def profiled(spec: ProfileSpec) -> Iterator[Profiler]:
    """Profile ``warmup + iterations`` steps; traces are written when the active window ends."""
    for path in (spec.kineto_path, spec.et_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if spec.cuda else [])
    et = ExecutionTraceObserver().register_callback(str(spec.et_path))

    prof = profile(
        activities=activities,
        schedule=_profiler_schedule(spec),
        on_trace_ready=lambda done: export_trace(done, spec.kineto_path),
        # The Execution Trace records every op's shapes. The profiler's own shape recording keeps
        # some operators' inputs alive past their last use (FlexAttention's block masks, 4 MiB an
        # iteration in torchtitan's context parallel), so the memory the trace showed was partly
        # the profiler's, not the program's.
        record_shapes=False,
        profile_memory=True,
        with_stack=False,
        execution_trace_observer=et,
    )
    try:
        with prof:
            yield Profiler(prof)
    finally:
        et.unregister_callback()
    if torch.cuda.is_available() and spec.cuda:
        torch.cuda.synchronize()
