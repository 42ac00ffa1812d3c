"""One rank process of a program capture: ``python -m prism.capture.program_main --job job.json --rank R --out DIR``.

It becomes global rank R of the target world as torchrun would make it (the torchrun
environment of R; any backend the program asks for is prism's, ``prism.capture.interpose``),
runs the user's program as ``__main__``, cuts it into iterations at its (outermost) optimizer steps
(``prism.capture.step_iterations``), profiles the last ``job.iterations`` of the first
``warmup + iterations``, then ends the program and writes its Kineto trace, Execution Trace,
comm log and result into the capture directory ``DIR``. A job's value pass
(``prism.capture.value_pass``) runs the program through its first optimizer step only and
writes what the rank received from its real peers.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from pathlib import Path

import torch

from prism.capture import annotate, program_profiler
from prism.capture.cpu_mode import install_cpu_mode
from prism.capture.interpose import UnsupportedCall, install
from prism.capture.launch import RANK_ERROR, parse_rank_args
from prism.capture.layout_check import GroupOutsideLayout, checked_labeler
from prism.capture.optimizer_steps import register_outer_step_hooks
from prism.capture.phase_timer import PhaseTimer
from prism.capture.profiling import ProfileSpec, profiled
from prism.capture.program_phases import ProgramPhases
from prism.capture.rank_main import record_rank
from prism.capture.step_iterations import ProgramStop, StepIterations
from prism.capture.value_pass import known_values, write_values
from prism.peers.backend import VirtualWorld, current_comm_log
from prism.peers.clock import CommClock, FreeRunningClock, capture_clock
from prism.peers.host_work import host_work_of
from prism.peers.received_values import ReceivedValues
from prism.schemas.iterations import steady_from
from prism.schemas.layout import ParallelLayout
from prism.schemas.manifest import CaptureFiles, RankJob, RankResult
from prism.schemas.program import ProgramSpec


class ProgramRunError(RuntimeError):
    """The program did not give the capture what it needs (one line, for the launcher's log)."""


def run_program(program: ProgramSpec) -> None:
    """Run the program as ``__main__``, as ``python train.py ARGS`` or ``python -m mod ARGS`` would."""
    os.chdir(program.cwd)
    if program.module is not None:
        sys.argv = [program.module, *program.args]
        sys.path.insert(0, program.cwd)
        runpy.run_module(program.module, run_name="__main__", alter_sys=True)
        return
    script = Path(program.script).resolve()
    if not script.is_file():
        raise ProgramRunError(f"program not found: {program.script} (from {program.cwd})")
    sys.argv = [str(script), *program.args]
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), run_name="__main__")


def run_program_rank(
    job: RankJob, rank: int, out_dir: Path, *, clock: CommClock | None = None, clock_from: int = 0
) -> RankResult:
    """Run ``rank`` of the program ``job`` and write its files under ``out_dir``.

    Iterations before ``clock_from`` are not told to the clock (a replay's first iteration holds
    the program's set-up, whose calls the graph does not have)."""
    started = time.perf_counter()
    program, clock = job.program, clock or capture_clock(job)
    layout = program.layout
    os.environ.update(program.torchrun_env(rank))
    torch.set_num_threads(job.threads)
    files = CaptureFiles(out_dir)
    world = VirtualWorld(
        real_ranks=job.real_ranks_for(rank), clock=clock, labeler=checked_labeler(layout),
        received=known_values(files, layout, rank), host_work=host_work_of(job),
    )  # fmt: skip
    install(world, rank=rank, world_size=layout.world_size)
    if program.device == "cpu":
        install_cpu_mode()
    spec = ProfileSpec(
        warmup=job.warmup, iterations=job.iterations, kineto_path=files.kineto(rank), et_path=files.et(rank),
        cuda=program.device == "cuda",
    )  # fmt: skip
    total = job.warmup + job.iterations
    timer, phases = PhaseTimer(), ProgramPhases()
    with profiled(spec) as prof:
        steps = StepIterations(
            rank=rank, total=total, profiled_from=job.warmup, stop_after_last=not program.run_to_end,
            profiler=prof, clock=clock, timer=timer,
            cuda=program.device == "cuda", clock_from=clock_from, holding=phases.held_parameters,
        )  # fmt: skip
        phases.install()  # before the step hook: an optimizer mark closes before its iteration ends
        hook = register_outer_step_hooks(post=steps)
        program_profiler.install(steps)  # after prism's own profiler took the original
        annotate.set_iteration_hook(steps.program_mark)
        annotate.set_phase_timer(timer)
        try:
            steps.start()
            _run_until_stopped(program)
        finally:
            hook.remove()
            phases.remove()
            annotate.set_iteration_hook(None)
            annotate.set_phase_timer(None)
            steps.finish()
    _check_ran(steps.done, total, job)
    timings = steps.timings
    return record_rank(
        files, rank, started=started, device=program.device, windows=timings.windows, blocks=timings.blocks,
        iteration_ns=tuple(timings.iteration_ns), losses=(None,) * len(timings.iteration_ns),
        parameter_count=timings.parameters, static_bytes=timings.static_bytes, parameters=timings.held,
        steady_from=steady_from(timings.windows, current_comm_log().calls),
    )  # fmt: skip


def run_value_pass(job: RankJob, rank: int, out_dir: Path) -> Path:
    """Run ``rank`` with the job's other real ranks through the first optimizer step; write
    what it received from them."""
    program = job.program
    os.environ.update(program.torchrun_env(rank))
    torch.set_num_threads(job.threads)
    received = ReceivedValues(record=True)
    world = VirtualWorld(
        real_ranks=job.real_ranks_for(rank), clock=FreeRunningClock(), labeler=checked_labeler(program.layout),
        received=received,
    )  # fmt: skip
    install(world, rank=rank, world_size=program.layout.world_size)
    if program.device == "cpu":
        install_cpu_mode()
    steps = 0

    def stop_after_first_step(*_: object) -> None:
        nonlocal steps
        steps += 1
        raise ProgramStop

    hook = register_outer_step_hooks(post=stop_after_first_step)
    try:
        _run_until_stopped(program)
    finally:
        hook.remove()
    _check_ran(steps, 1, job)
    return write_values(CaptureFiles(out_dir), rank, received)


def _run_until_stopped(program: ProgramSpec) -> None:
    try:
        run_program(program)
    except ProgramStop:
        pass
    except UnsupportedCall:
        # A program whose pipeline is not the layout's asks virtual ranks for values: say why.
        if _initialized():
            _check_pipeline(program.layout)
        raise
    except SystemExit as e:  # the program's own sys.exit(): an error only with a failing code
        if e.code not in (None, 0):
            raise


def _check_ran(done: int, needed: int, job: RankJob) -> None:
    if not _initialized():
        raise ProgramRunError(
            "the program never initialised torch.distributed (init_process_group or init_device_mesh)"
        )
    if done < needed:
        raise ProgramRunError(
            f"the program ended after {done} optimizer step(s); the capture needs {needed} "
            f"(--warmup {job.warmup} + --iterations {job.iterations})"
        )


def _check_pipeline(layout: ParallelLayout) -> None:
    """Point-to-point transfers stay inside the rank's pipeline, or the layout is not the program's."""
    log = current_comm_log()
    me = layout.coords(log.rank)
    for call in log.calls:
        if call.peer is None or call.op not in ("send", "recv"):
            continue
        if not layout.same_pipeline(log.rank, call.peer):
            there = layout.coords(call.peer)
            raise ProgramRunError(
                f"rank {log.rank} (tp {me.tp}, dp {me.dp}, stage {me.pp}) {call.op}s "
                f"{'to' if call.op == 'send' else 'from'} rank {call.peer} (tp {there.tp}, dp {there.dp}, "
                f"stage {there.pp}), outside its pipeline in {layout}: the program lays out its pipeline "
                "otherwise; capture with the --pp (and --order) it builds"
            )


def _initialized() -> bool:
    try:
        current_comm_log()
    except RuntimeError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_rank_args("prism.capture.program_main", __doc__, argv)
    job = RankJob.from_dict(json.loads(args.job.read_text()))
    try:
        if job.value_pass:
            run_value_pass(job, args.rank, args.out.resolve())
        else:
            run_program_rank(job, args.rank, args.out.resolve())
    except (ProgramRunError, GroupOutsideLayout) as e:
        print(f"{RANK_ERROR}{e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
