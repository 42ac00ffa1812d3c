"""Checks made before any process starts, so bad input fails at once with one clear line."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import psutil
import torch

from prism.capture.workloads.gpt.config import GPTConfig
from prism.capture.workloads.gpt.params import stage_parameter_numels
from prism.schemas.layout import ParallelLayout
from prism.schemas.program import ProgramSpec

# A CPU rank process (torch + gloo + profiler) costs this much beyond its tensors.
PROCESS_OVERHEAD_BYTES = 400 * 2**20
# Bytes kept per parameter: weight, grad, grad bucket, two Adam moments.
COPIES_PER_PARAMETER = 5
# More CPU rank processes than this per core only measures the scheduler.
MAX_PROCESSES_PER_CORE = 4


class CaptureError(RuntimeError):
    """A capture that cannot be run or did not complete; its message is one line for the user."""


def check_device(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        raise CaptureError("--device cuda was asked for but CUDA is not available on this machine")


def stage_parameter_count(config: GPTConfig, stage: int) -> int:
    """Parameters one rank of ``stage`` holds."""
    return sum(stage_parameter_numels(config, stage))


def activation_bytes(config: GPTConfig) -> int:
    """Rough bytes of activations held by a stage-0 rank at its 1F1B peak."""
    itemsize = torch.empty(0, dtype=getattr(torch, config.dtype)).element_size()
    tokens = config.micro_batch_size * config.seq_len
    per_layer = tokens * (16 * config.hidden + 2 * config.ffn) // config.tp * itemsize
    per_layer += config.micro_batch_size * config.heads // config.tp * config.seq_len**2 * 3 * itemsize
    in_flight = min(config.pp, config.microbatches)
    return in_flight * config.layers_per_stage * per_layer


def rank_bytes_estimate(config: GPTConfig) -> int:
    itemsize = torch.empty(0, dtype=getattr(torch, config.dtype)).element_size()
    params = max(stage_parameter_count(config, s) for s in {0, config.pp - 1})
    return params * itemsize * COPIES_PER_PARAMETER + activation_bytes(config)


def check_program(program: ProgramSpec) -> None:
    """The script must exist (a module is found only when it runs)."""
    if program.script is not None and not (Path(program.cwd) / program.script).is_file():
        raise CaptureError(f"program not found: {program.script} (from {program.cwd})")


def check_ranks(ranks: tuple[int, ...], layout: ParallelLayout) -> None:
    """``--ranks`` must name distinct ranks of the target world."""
    if not ranks:
        raise CaptureError("--ranks names no rank")
    bad = [r for r in ranks if not 0 <= r < layout.world_size]
    if bad:
        raise CaptureError(f"--ranks: {bad[0]} is not a rank of {layout} (0..{layout.world_size - 1})")
    if len(set(ranks)) != len(ranks):
        raise CaptureError("--ranks names a rank twice")


def check_full_run_fits(layout: ParallelLayout, device: str, config: GPTConfig | None = None) -> None:
    """``--real all`` runs world_size processes at once: refuse what the machine cannot hold (the
    built-in GPT's memory is estimated from ``config``; a program's is not known beforehand)."""
    world = layout.world_size
    if device == "cuda":
        devices = torch.cuda.device_count()
        if world > devices:
            raise CaptureError(f"--real all needs one GPU per rank: {world} ranks but {devices} GPU(s) here")
        return
    cores = os.cpu_count() or 1
    if world > MAX_PROCESSES_PER_CORE * cores:
        raise CaptureError(
            f"--real all would start {world} rank processes on {cores} CPU core(s) "
            f"(at most {MAX_PROCESSES_PER_CORE * cores}); use a smaller layout or --real roles"
        )
    if config is not None:
        _check_memory(world, config, f"--real all needs about {{needed}} for {world} ranks")


def check_rank_fits(config: GPTConfig, device: str) -> None:
    """A captured rank of the built-in GPT runs alone: its weights, gradients, optimizer state and
    activations must fit the machine (otherwise the kernel kills it, or it swaps for hours)."""
    if device == "cpu":
        _check_memory(1, config, "one rank of this model needs about {needed}")


def _check_memory(processes: int, config: GPTConfig, what: str) -> None:
    needed = processes * (rank_bytes_estimate(config) + PROCESS_OVERHEAD_BYTES)
    available = psutil.virtual_memory().available
    if needed > 0.8 * available:
        raise CaptureError(
            what.format(needed=f"{needed / 2**30:.1f} GiB")
            + f" but only {available / 2**30:.1f} GiB is available; use a smaller model or layout"
        )


def check_output(out_dir: Path, *, overwrite: bool) -> None:
    """The output must be a new (or, with overwrite, replaceable) directory in a writable parent,
    which is made (with its own parents) when missing."""
    if out_dir.exists() and not out_dir.is_dir():
        raise CaptureError(f"output {out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise CaptureError(f"output directory {out_dir} is not empty; pass --overwrite to replace it")
    parent = out_dir.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise CaptureError(f"cannot write {out_dir}: {e.strerror or e}") from e
