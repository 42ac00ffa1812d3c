"""Fidelity: predicted vs real iteration time and peak memory, rank by rank, on layouts that run fully.

    .venv/bin/python benchmarks/fidelity.py [--case "tp=1 pp=2 dp=1 layers=4 hidden=128 heads=4 seq=64 mbs=2 microbatches=8"]...
        [--repeats 3] [--json out.json] [--cluster-spec spec.toml | --recalibrate] [--work-dir DIR]
    .venv/bin/python benchmarks/fidelity.py --program "examples/pp.py --pp 2 --schedule 1F1B" --tp 1 --pp 2 --dp 1

For each case: run every rank for real, capture the slice, build and simulate the graph of the
same layout, and compare (``prism.fidelity``). Without ``--case`` the default cases run: tp=2,
pp=2 and dp=2 (world size 2) at two model sizes. With ``--program`` (repeatable) the case is
your own program at ``--tp/--pp/--dp``: its real run is the program itself under torchrun
(``prism.fidelity.program_case``). See docs/fidelity.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from prism.fidelity import (
    CALIBRATION_SIZES,
    CaseError,
    CaseResult,
    Pacing,
    RunSettings,
    SpecChoice,
    captured_config,
    mean_errors,
    parse_case,
    resolve_spec,
    run_case_detailed,
)
from prism.fidelity.compare import steal_line
from prism.fidelity.explain import concurrency_probe
from prism.fidelity.options import (
    add_case_options,
    case_texts,
    check_case_options,
    measuring_settings,
    program_cases,
)
from prism.fidelity.program_case import ProgramRunFailed, run_program_case
from prism.fidelity.report import (
    breakdown_table,
    case_ids,
    collectives_table,
    hook_table,
    legend_table,
    machine,
    memory_table,
    phase_table,
    profiler_table,
    records_table,
    summary_table,
)
from prism.fidelity.spec import CALIBRATION_OPS, PROGRAM_CALIBRATION_OPS
from prism.graph.comm.bench import CalibrationError
from prism.graph.comm.calibrate import parse_size
from prism.schemas.cluster import ClusterSpec
from prism.schemas.files import write_json_atomic
from prism.schemas.layout import LayoutError

console = Console(width=max(120, Console().width))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_case_options(parser)
    parser.add_argument("--json", type=Path, default=None, help="also write the records here")
    parser.add_argument(
        "--cluster-spec", type=Path, default=None, help="cluster spec TOML for the comm model"
    )
    parser.add_argument(
        "--calibrate-into", type=Path, default=Path(tempfile.gettempdir()) / "prism-fidelity-local.toml",
        help="where a fresh calibration is written (when there is no 'local' spec, or with --recalibrate)",
    )  # fmt: skip
    parser.add_argument(
        "--recalibrate", action="store_true", help="calibrate now even if a 'local' spec exists"
    )
    parser.add_argument(
        "--recalibrate-each", action="store_true",
        help="calibrate afresh right before each case, into --calibrate-into with the case's number "
        "added to its name: on a VM the price of a small collective drifts by a fifth within hours "
        "(tp_spec_drift in benchmarks/results/fidelity-log.md)",
    )  # fmt: skip
    parser.add_argument(
        "--calibrate-between-ms", type=float, default=0.0,
        help="a fresh calibration times cold calls, each after this much compute (0: back to back)",
    )  # fmt: skip
    parser.add_argument(
        "--calibrate-reps", type=int, default=9, help="timed repetitions per calibration point"
    )
    parser.add_argument(
        "--calibrate-busy-rounds", type=int, default=0,
        help="a fresh calibration also times all-reduces beside compute over this many rounds "
        "(prism-calibrate --busy-rounds; the spec's busy_call table)",
    )  # fmt: skip
    parser.add_argument(
        "--calibrate-wake-gaps-ms", type=str, default="",
        help="a fresh calibration also times compute after waits of these lengths (e.g. 0.25,0.5,1,2,4,16; "
        "prism-calibrate --wake-gaps-ms; the spec's wake_compute table)",
    )  # fmt: skip
    parser.add_argument(
        "--calibrate-sizes", type=str, default=",".join(map(str, CALIBRATION_SIZES)),
        help="comma-separated bytes a fresh calibration times (e.g. 512,64KiB,16MiB) [default: the "
        "default cases' own sizes and points around them]",
    )  # fmt: skip
    parser.add_argument(
        "--calibrate-table", action="store_true",
        help="a fresh calibration also writes its points into the spec's measured table (prism-calibrate --table)",
    )  # fmt: skip
    parser.add_argument(
        "--no-replay",
        action="store_true",
        help="skip the replay rows (each role's rank replayed against the graph)",
    )
    parser.add_argument(
        "--paced", nargs="?", const=Pacing.ALL, default=Pacing.OFF, type=Pacing, metavar="{all,pipelines}",
        help="also capture each role paced by the slice's graph and predict from that (rows 'paced'): "
        "of every case (--paced, --paced all) or of the pp > 1 cases (--paced pipelines); those "
        "cases' replay then runs against the paced graph",
    )  # fmt: skip
    parser.add_argument(
        "--free-load", action="store_true",
        help="load ranks beside a paced capture or a replay run free instead of as replays of its graph",
    )  # fmt: skip
    parser.add_argument(
        "--no-bracket", action="store_true",
        help="one real run per repeat, first, instead of one right before and one right after the replay",
    )  # fmt: skip
    parser.add_argument(
        "--no-host-work", action="store_true",
        help="captures, load ranks and replays do not do the host-side work of their virtual collectives "
        "(the spec's host_ns_per_byte; prism-replay --no-host-work)",
    )  # fmt: skip
    parser.add_argument(
        "--free-running", action="store_true",
        help="the slice captures' virtual calls complete at once instead of holding the program for "
        "their price under the spec (prism-capture --hold-calls)",
    )  # fmt: skip
    parser.add_argument("--work-dir", type=Path, default=None, help="keep captures and graphs here")
    parser.add_argument("--no-probe", action="store_true", help="skip the 2-process CPU concurrency probe")
    parser.add_argument(
        "--slice-alone", action="store_true",
        help="capture each slice rank (and paced capture) alone instead of beside the world's other ranks "
        "(load-matched)",
    )  # fmt: skip
    parser.add_argument(
        "--replay-alone", action="store_true",
        help="replay each rank alone instead of beside the world's other ranks (load-matched)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    check_case_options(parser, args)
    if args.recalibrate_each and args.cluster_spec is not None:
        parser.error("--recalibrate-each calibrates for each case: give it without --cluster-spec")
    return args


def with_spec(settings: RunSettings, spec: ClusterSpec, args: argparse.Namespace) -> RunSettings:
    """``settings`` with what captures, load ranks and replays take from the spec: its host work,
    and the prices their virtual calls hold the program for."""
    return replace(
        settings,
        host_ns_per_byte={} if args.no_host_work else dict(spec.host_ns_per_byte),
        hold_calls=None if args.free_running else spec,
    )


def settings_of(args: argparse.Namespace, spec: ClusterSpec, **more: object) -> RunSettings:
    """How each side runs, from the options both kinds of case share, priced by ``spec``."""
    common = RunSettings(
        warmup=args.warmup,
        iterations=args.iterations,
        work_dir=args.work_dir,
        slice_load=not args.slice_alone,
        replay_load=not args.replay_alone,
        replay=not args.no_replay,
        **measuring_settings(args),
        **more,
    )
    return with_spec(common, spec, args)


def _log(message: str) -> None:
    console.log(message, markup=False, highlight=False)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args, argv)
    except CalibrationError as e:
        console.print(f"[bold red]error:[/] the calibration failed: {e}", highlight=False)
        return 2


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    started = time.perf_counter()
    try:
        cases = [(parse_case(text), captured_config(text)) for text in case_texts(args)]
        sizes = tuple(parse_size(s) for s in args.calibrate_sizes.split(",") if s.strip())
    except (CaseError, ValueError) as e:
        console.print(f"[bold red]error:[/] {e}", highlight=False)
        return 2

    def spec_for(case: int | None) -> SpecChoice:
        """The spec a case is priced with: the run's, or with --recalibrate-each its own, fresh."""
        into = args.calibrate_into
        if case is not None:
            into = into.with_name(f"{into.stem}-{case + 1}{into.suffix}")
        return resolve_spec(
            args.cluster_spec, into, recalibrate=args.recalibrate or case is not None,
            compute_between_ms=args.calibrate_between_ms, reps=args.calibrate_reps,
            sizes=sizes, measured_table=args.calibrate_table, busy_rounds=args.calibrate_busy_rounds,
            wake_gaps_ms=tuple(float(g) for g in args.calibrate_wake_gaps_ms.split(",") if g.strip()),
            ops=PROGRAM_CALIBRATION_OPS if args.program else CALIBRATION_OPS,
        )  # fmt: skip

    def priced(case: int, choice: SpecChoice, settings: RunSettings) -> tuple[SpecChoice, RunSettings]:
        """The spec and settings of a case: the run's, or with --recalibrate-each a fresh calibration's
        (the first case's was made before the run began)."""
        if not args.recalibrate_each or case == 0:
            return choice, settings
        choice = spec_for(case)
        console.print(f"cluster spec of case {case + 1}: {choice.source}", highlight=False)
        return choice, with_spec(settings, choice.spec, args)

    choice = spec_for(0 if args.recalibrate_each else None)
    console.print(f"cluster spec: {choice.source}", highlight=False)
    if args.program:
        return program_main(args, choice, started, argv, priced)
    probes = {} if args.no_probe else {"before": round(concurrency_probe(), 3)}
    settings = settings_of(
        args, choice.spec, paced=args.paced, paced_load=not args.free_load, bracket=not args.no_bracket
    )
    results: list[CaseResult] = []
    sources = []
    for i, (config, captured) in enumerate(cases):
        case_choice, case_settings = priced(i, choice, settings)
        sources.append(case_choice.source)
        result = run_case_detailed(
            config, args.repeats, case_choice.spec, case_settings, progress=_log, captured=captured
        )
        results.append(result)
    if not args.no_probe:
        probes["after"] = round(concurrency_probe(), 3)
    every = [r for res in results for r in res.records]
    records = [r for r in every if r["source"] == "simulation"]
    replayed = [r for r in every if r["source"] == "replay"]
    paced = [r for r in every if r["source"] == "paced"]
    breakdown = [r for res in results for r in res.breakdown]
    collectives = [r for res in results for r in res.collectives]
    ids = case_ids(records)
    tables = (legend_table(ids), records_table(records, ids), phase_table(records, ids, "simulation"))
    if paced:
        tables += (records_table(paced, ids, "paced"),)
    if replayed:
        tables += (
            records_table(replayed, ids, "replay"),
            phase_table(replayed, ids),
            phase_table(replayed, ids, key="graph_phase_err"),
        )
    tables += (summary_table(every, ids),)
    tables += (
        breakdown_table(breakdown, ids),
        profiler_table(breakdown, records, ids),
        memory_table(breakdown, ids),
    )
    if collectives:
        tables += (collectives_table(collectives, ids),)
    for table in tables:
        console.print(table)
    console.print(steal_line(every), highlight=False)
    elapsed = time.perf_counter() - started
    console.print(
        f"2-process CPU concurrency probe (1.0 = no slow-down): {probes or 'skipped'}; took {elapsed:.0f} s",
        highlight=False,
    )
    if args.json:
        write_json_atomic(
            args.json,
            {
                "records": every,
                **mean_errors(every),
                "breakdown": breakdown,
                "collectives": collectives,
                "meta": {
                    **_run_meta(
                        args, argv, settings, sources if args.recalibrate_each else choice.source, elapsed
                    ),
                    "spec": choice.spec.to_dict(),
                    "cases": {"random": args.random, "seed": args.seed} if args.random else "given or fixed",
                    "paced": settings.paced,
                    "paced_load": settings.paced_load,
                    "bracket": settings.bracket,
                    "steal_limit_pct": settings.steal_limit_pct,
                    "steal_tries": settings.steal_tries,
                    "window_s": settings.window_s,
                    "concurrency_probe": probes,
                },
            },
        )
        console.print(f"wrote {args.json}")
    return 0


def program_main(
    args: argparse.Namespace, choice: SpecChoice, started: float, argv: list[str] | None, priced
) -> int:
    """Each --program against its own run under torchrun."""
    try:
        cases = program_cases(args)
    except LayoutError as e:
        console.print(f"[bold red]error:[/] {e}", highlight=False)
        return 2
    settings = settings_of(args, choice.spec)
    records, hooks, sources = [], [], []
    for i, case in enumerate(cases):
        case_choice, case_settings = priced(i, choice, settings)
        sources.append(case_choice.source)
        try:
            result = run_program_case(case, args.repeats, case_choice.spec, case_settings, progress=_log)
        except ProgramRunFailed as e:
            console.print(f"[bold red]error:[/] {e}", highlight=False)
            return 2
        records += result.records
        hooks += result.hook
    simulated = [r for r in records if r["source"] == "simulation"]
    replayed = [r for r in records if r["source"] == "replay"]
    ids = case_ids(records)
    tables = (
        legend_table(ids),
        records_table(simulated, ids),
        phase_table(simulated, ids, "simulation", "block_err"),
    )
    if replayed:
        tables += (
            records_table(replayed, ids, "replay"),
            phase_table(replayed, ids, key="block_err"),
            phase_table(replayed, ids, key="graph_phase_err"),
        )
    for table in (*tables, hook_table(hooks, ids)):
        console.print(table)
    elapsed = time.perf_counter() - started
    console.print(f"took {elapsed:.0f} s", highlight=False)
    if args.json:
        write_json_atomic(
            args.json,
            {
                "records": records,
                "hook": hooks,
                **mean_errors(records),
                "meta": _run_meta(
                    args, argv, settings, sources if args.recalibrate_each else choice.source, elapsed
                ),
            },
        )
        console.print(f"wrote {args.json}")
    return 0


def _run_meta(
    args: argparse.Namespace,
    argv: list[str] | None,
    settings: RunSettings,
    cluster_spec: object,
    elapsed: float,
) -> dict:
    """What every result file says of the run that wrote it."""
    return {
        "command": shlex.join(
            ["python", "benchmarks/fidelity.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "cluster_spec": cluster_spec,
        "repeats": args.repeats,
        "warmup": settings.warmup,
        "iterations": settings.iterations,
        "sim_iterations": settings.sim_iterations,
        "slice_load": settings.slice_load,
        "replay_load": settings.replay_load,
        "hold_calls": settings.hold_calls is not None,
        "elapsed_s": round(elapsed, 1),
        "machine": machine(),
    }


if __name__ == "__main__":
    sys.exit(main())
