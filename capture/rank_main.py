"""One rank process of a capture: ``python -m prism.capture.rank_main --job job.json --rank R --out DIR``.

It joins the target world as rank R through the ``prism`` backend (peers outside
``job.real_ranks`` are virtual), runs ``warmup + iterations`` training iterations, profiles the
last ``iterations`` of them and writes its Kineto trace, Execution Trace, comm log and result
into the capture directory ``DIR``. Progress goes to stdout (``prism.capture.progress``).
When several ranks are real at once, MASTER_ADDR / MASTER_PORT / LOCAL_RANK come from the
environment, as under torchrun.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist

from prism.capture import annotate
from prism.capture.held_parameters import held_parameters
from prism.capture.launch import parse_rank_args
from prism.capture.phase_timer import BlockSpan, PhaseTimer, block_wall_ns, own_phase_ns
from prism.capture.profiling import ProfileSpec, profiled
from prism.capture.progress import report
from prism.capture.workloads.gpt.config import GPTConfig
from prism.capture.workloads.gpt.train import GPTWorkload
from prism.peers.backend import BACKEND_NAME, VirtualWorld, activate, current_comm_log, rendezvous_store
from prism.peers.clock import CommClock, capture_clock
from prism.peers.host_work import host_work_of
from prism.schemas.annotations import group_label
from prism.schemas.comm_log import CollectiveTime, HeldTime, write_comm_log
from prism.schemas.files import write_json_atomic
from prism.schemas.iterations import calls_within
from prism.schemas.layout import ParallelLayout
from prism.schemas.manifest import CaptureFiles, RankJob, RankResult


def layout_labeler(layout: ParallelLayout):
    """Group label ('tp.3', 'dp.0', 'world', ...) of a set of global ranks, or None."""

    def label(ranks: tuple[int, ...]) -> str | None:
        found = layout.group_of_ranks(ranks)
        return None if found is None else group_label(*found)

    return label


def _init_distributed(job: RankJob, rank: int, clock: CommClock) -> None:
    layout = job.layout
    world = VirtualWorld(
        real_ranks=job.real_ranks_for(rank),
        clock=clock,
        labeler=layout_labeler(layout),
        host_work=host_work_of(job),
    )
    activate(world)
    # The store waits only for the real ranks: virtual ones never connect.
    store = rendezvous_store(rank, layout.world_size, world)
    dist.init_process_group(BACKEND_NAME, rank=rank, world_size=layout.world_size, store=store)


def peak_rss_bytes() -> int:
    """This process's own peak resident memory: ``VmHWM`` of its address space, which ``exec``
    starts afresh. (``ru_maxrss`` is carried across ``fork`` and ``exec``: a rank started by a
    launcher holding a large graph would report the launcher's peak.)"""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # not Linux


def record_rank(
    files: CaptureFiles,
    rank: int,
    *,
    started: float,
    device: str,
    windows: list[tuple[int, int]],
    blocks: list[list[BlockSpan]] | None = None,
    **fields: object,
) -> RankResult:
    """End the rank's run: write its comm log, end its process group, and write ``result.json``
    with what the run measured (``fields``: RankResult's iteration times, losses, parameters,
    ...), the time prism held it and the time in collective calls in each iteration ``windows``,
    and per-phase own and wall time from its top-level ``blocks`` when it marked them."""
    log = current_comm_log()
    write_comm_log(log, files.comm(rank))
    held, collective = HeldTime(log), CollectiveTime(log)
    if dist.is_initialized():
        dist.destroy_process_group()
    result = RankResult(
        rank=rank,
        peak_rss_bytes=peak_rss_bytes(),
        peak_device_bytes=torch.cuda.max_memory_allocated() if device == "cuda" else None,
        wall_s=time.perf_counter() - started,
        held_ns=tuple(held.within(s, e) for s, e in windows),
        collective_ns=tuple(collective.within(s, e) for s, e in windows),
        calls=calls_within(log.calls, windows),
        **fields,
    )
    if blocks is not None:
        result = replace(
            result,
            phase_ns=own_phase_ns(blocks, log, result.own_iteration_ns),
            block_ns=block_wall_ns(blocks),
        )
    write_json_atomic(files.result(rank), asdict(result))
    report(rank=rank, event="done")
    return result


@dataclass(kw_only=True)
class _Timings:
    """What the training loop measured, one entry per iteration."""

    iteration_ns: list[int] = field(default_factory=list)
    windows: list[tuple[int, int]] = field(default_factory=list)  # wall-clock span (comm log's clock)
    blocks: list[list[BlockSpan]] = field(default_factory=list)  # top-level blocks
    losses: list[float | None] = field(default_factory=list)
    static_bytes: int | None = None  # on CUDA: the allocator's live bytes as profiling begins


def _train(workload: GPTWorkload, job: RankJob, rank: int, spec: ProfileSpec, clock: CommClock) -> _Timings:
    """Run every iteration, the last ``job.iterations`` profiled, each block timed."""
    timings, timer = _Timings(), PhaseTimer()
    total = job.warmup + job.iterations
    report(rank=rank, event="start", total=total)
    annotate.set_phase_timer(timer)
    try:
        with profiled(spec) as prof:
            for it in range(total):
                if it == job.warmup and job.device == "cuda":
                    # What the device holds between iterations: the model's state and what CUDA
                    # libraries keep in the allocator (cuBLAS workspaces), which no model counts.
                    timings.static_bytes = torch.cuda.memory_allocated()
                # The iteration's wall time starts where the clock's does: a hold at its start
                # (the co-simulation catching up in a replay) is time the program took.
                began, t0 = time.time_ns(), time.perf_counter_ns()
                clock.iteration_started(began)
                result = workload.train_step(it)  # on CUDA it ends once the device is done
                timings.iteration_ns.append(time.perf_counter_ns() - t0)
                timings.windows.append((began, time.time_ns()))  # the clock's iteration ends here
                timings.blocks.append(timer.take())
                clock.iteration_done(timings.windows[-1][1])
                timings.losses.append(result.loss)
                prof.step()
                report(
                    rank=rank, event="iteration", done=it + 1, total=total, ms=timings.iteration_ns[-1] / 1e6
                )
    finally:
        annotate.set_phase_timer(None)
    return timings


def run_rank(job: RankJob, rank: int, out_dir: Path, *, clock: CommClock | None = None) -> RankResult:
    """Run one rank of ``job`` and write its files under ``out_dir``.

    ``clock`` times the calls with virtual peers (default: a capture's, ``capture_clock``); it is
    told where each iteration begins and ends, outside the timed span.
    """
    started = time.perf_counter()
    clock = clock or capture_clock(job)
    torch.set_num_threads(job.threads)
    if job.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    _init_distributed(job, rank, clock)
    files = CaptureFiles(out_dir)
    workload = GPTWorkload(GPTConfig.from_dict(job.config))
    spec = ProfileSpec(
        warmup=job.warmup,
        iterations=job.iterations,
        kineto_path=files.kineto(rank),
        et_path=files.et(rank),
        cuda=job.device == "cuda",
    )
    timings = _train(workload, job, rank, spec, clock)
    return record_rank(
        files, rank, started=started, device=job.device, windows=timings.windows, blocks=timings.blocks,
        iteration_ns=tuple(timings.iteration_ns), losses=tuple(timings.losses),
        parameter_count=workload.parameter_count, static_bytes=timings.static_bytes,
        parameters=held_parameters(workload.model, workload.optimizer, workload.grad_sync.bucket_bytes),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_rank_args("prism.capture.rank_main", __doc__, argv)
    job = RankJob.from_dict(json.loads(args.job.read_text()))
    run_rank(job, args.rank, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
