"""``prism-calibrate``: time real gloo collectives on this machine and write the 'local' cluster spec."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from prism.graph.comm.calibrate import (
    BENCH_OPS,
    DEFAULT_SIZES,
    CalibrationConfig,
    CalibrationError,
    CalibrationResult,
    calibrate,
    parse_size,
)
from prism.graph.comm.spec_check import CHECK_REPS, DEFAULT_TOLERANCE, MIN_POINTS, SpecDrift, check_spec
from prism.schemas.cli_command import PrismCommand
from prism.schemas.cluster import ClusterSpecError, load_cluster, local_path
from prism.schemas.terminal import Table
from prism.schemas.termination import stop_on_termination

app = typer.Typer(add_completion=False, help=__doc__, no_args_is_help=False)
console = Console()
err_console = Console(stderr=True)
DEFAULT = CalibrationConfig()


def _human(n: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _tables(result: CalibrationResult) -> tuple[Table, Table]:
    checks = Table(title="measured vs the fitted α-β line (one node)")
    for column in ("op", "p", "bytes", "source", "measured µs", "line µs", "rel err"):
        checks.add_column(column, justify="left" if column in ("op", "source") else "right")
    for c in result.checks:
        s = c.sample
        checks.add_row(
            s.op, str(s.group_size), _human(s.bytes), s.source, f"{s.seconds * 1e6:.1f}",
            f"{c.predicted_s * 1e6:.1f}", f"{c.rel_error:.0%}",
        )  # fmt: skip
    fits = Table(title="fitted per op class: T = hops·α + volume·β")
    for column in ("class", "α µs/hop", "1/β GB/s", "samples"):
        fits.add_column(column, justify="left" if column == "class" else "right")
    for cls, f in result.fit.classes.items():
        bw = f"{1e-9 / f.beta_s_per_byte:.2f}" if f.beta_s_per_byte > 0 else "-"
        fits.add_row(cls, f"{f.alpha_s * 1e6:.1f}", bw, str(f.samples))
    skipped = [f"{cls}: {why}" for cls, why in result.fit.skipped.items()]
    fits.caption = ("not fitted (factor 1.0): " + "; ".join(skipped)) if skipped else None
    return checks, fits


@app.command(cls=PrismCommand)
def calibrate_command(
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Spec file to write [default: the 'local' path].")
    ] = None,
    max_procs: Annotated[
        int, typer.Option(help="Processes to spawn (group sizes 2, 4, ... up to it).")
    ] = DEFAULT.max_procs,
    sizes: Annotated[str, typer.Option(help="Comma-separated bytes per rank.")] = ",".join(
        map(_human, DEFAULT_SIZES)
    ).replace(" ", ""),
    ops: Annotated[str, typer.Option(help="Comma-separated ops to time.")] = ",".join(BENCH_OPS),
    reps: Annotated[
        int | None,
        typer.Option(
            help=f"Timed repetitions per point (mean latency kept) [default: {DEFAULT.reps}; {CHECK_REPS} with --check].",
            show_default=False,
        ),
    ] = None,
    capture: Annotated[
        list[Path] | None,
        typer.Option(
            help="A --real all capture dir (or every member's comm-log file) whose delegated calls join the fit, "
            "each timed from its last member's arrival; repeatable."
        ),
    ] = None,
    bench: Annotated[
        bool,
        typer.Option(
            "--bench/--no-bench",
            help="Run the microbenchmark; --no-bench fits the --capture calls alone (a real job's calls as it ran them).",
        ),
    ] = True,
    timeout: Annotated[
        float, typer.Option(help="Seconds before the benchmark processes are killed.")
    ] = DEFAULT.timeout_s,
    compute_between_ms: Annotated[
        float,
        typer.Option(help="Time cold calls: this much compute before each one (0: back to back)."),
    ] = DEFAULT.compute_between_ms,
    busy_rounds: Annotated[
        int,
        typer.Option(
            help="Also time 2-member all-reduces of each size with both members computing through them, over "
            "this many rounds (e.g. 30; 0: off), giving the spec's busy_call table: on a CPU test bed, what "
            "a call costs beside compute (DDP's bucket all-reduces during backward)."
        ),
    ] = DEFAULT.busy_rounds,
    wake_gaps_ms: Annotated[
        str,
        typer.Option(
            help="Comma-separated waits (ms) after which a rank's compute is also timed against back to back, "
            "giving the spec's wake_compute table (e.g. 0.25,0.5,1,2,4,16): on a shared CPU host, compute "
            "after a pipeline stage waited for its neighbour runs slower."
        ),
    ] = "",
    wake_rounds: Annotated[
        int, typer.Option(help="Rounds of the --wake-gaps-ms benchmark.")
    ] = DEFAULT.wake_rounds,
    table: Annotated[
        bool,
        typer.Option(
            help="Also write the timed points into the spec's measured table: calls within one node "
            "are then priced from them, not from the α-β line."
        ),
    ] = DEFAULT.measured_table,
    check: Annotated[
        str | None,
        typer.Option(
            help="Write nothing: time the calls now and compare them with the measured table of this spec ('local' "
            "or a TOML file written with --table), per op class; exit 1 where one moved beyond --tolerance (time "
            "to recalibrate). Give the --sizes, --ops and --compute-between-ms it was calibrated with.",
            metavar="SPEC",
        ),
    ] = None,
    tolerance: Annotated[
        float,
        typer.Option(help="With --check: the relative move of an op class's median that makes a spec stale."),
    ] = DEFAULT_TOLERANCE,
) -> None:
    """Time gloo collectives and send/recv among local processes; fit α and β; write the spec."""
    try:
        config = CalibrationConfig(
            sizes=tuple(parse_size(s) for s in sizes.split(",") if s.strip()),
            max_procs=max_procs, ops=tuple(o.strip() for o in ops.split(",") if o.strip()),
            reps=reps if reps is not None else (DEFAULT.reps if check is None else CHECK_REPS),
            timeout_s=timeout, comm_logs=tuple(capture or ()), bench=bench, out=out, compute_between_ms=compute_between_ms,
            busy_rounds=busy_rounds, measured_table=table, wake_gaps_ms=_gaps(wake_gaps_ms),
            wake_rounds=wake_rounds,
        )  # fmt: skip
        if check is not None:
            if capture or not bench or busy_rounds or wake_gaps_ms or table or out is not None:
                raise ValueError(
                    "--check times the microbenchmark and writes nothing: give it without --capture, --no-bench, "
                    "--busy-rounds, --wake-gaps-ms, --table and --out"
                )
            spec = load_cluster(check)
            err_console.print(
                f"[bold]prism-calibrate --check[/] {check}: {config.max_procs} gloo processes, sizes {sizes}"
            )
            drift = check_spec(spec, config, tolerance)
        elif bench:
            err_console.print(f"[bold]prism-calibrate[/] {config.max_procs} gloo processes, sizes {sizes}")
        else:
            err_console.print(
                f"[bold]prism-calibrate[/] the delegated calls of {len(config.comm_logs)} path(s)"
            )
        if check is None:
            result = calibrate(config)
    except (CalibrationError, ClusterSpecError, ValueError, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        err_console.print(f"[bold red]error:[/] {escape(first)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    if check is not None:
        _report_drift(check, spec.notes, drift)
        return
    for table in _tables(result):
        console.print(table)
    where = "" if result.path == local_path() else f" (use it with {_env_hint(result.path)})"
    pricing = "; calls within one node are priced from the measured table" if result.spec.measured else ""
    console.print(
        f"α-β line: median relative error {result.median_rel_error:.0%}{pricing}; wrote {result.path}{where}"
    )


def _report_drift(name: str, notes: str, drift: SpecDrift) -> None:
    """The points against the spec, each class's median move, and what to do; exit 1 if stale."""
    points = Table(title=f"now vs {name}'s price")
    for column in ("op", "p", "bytes", "spec µs", "now µs", "now/spec"):
        points.add_column(column, justify="left" if column == "op" else "right")
    for c in drift.checks:
        s = c.sample
        ratio = f"{s.seconds / c.predicted_s:.2f}" if c.predicted_s > 0 else "-"
        points.add_row(
            s.op,
            str(s.group_size),
            _human(s.bytes),
            f"{c.predicted_s * 1e6:.1f}",
            f"{s.seconds * 1e6:.1f}",
            ratio,
        )
    console.print(points)
    moves = ", ".join(
        f"{cls} {r - 1:+.0%}" + ("" if cls in drift.judged else f" (under {MIN_POINTS} points, not judged)")
        for cls, r in drift.by_class.items()
    )
    console.print(
        f"median move per op class: {moves} (tolerance ±{drift.tolerance:.0%}; the spec: {notes or '-'})"
    )
    if not drift.stale:
        console.print(f"{name} still prices this machine's calls")
        return
    err_console.print(
        f"[bold red]stale:[/] {', '.join(drift.stale)} moved beyond ±{drift.tolerance:.0%} since {name} was "
        "calibrated; predictions priced by it move with them: recalibrate (prism-calibrate, with the options it "
        "was made with)",
        highlight=False, soft_wrap=True,
    )  # fmt: skip
    raise typer.Exit(1)


def _gaps(text: str, option: str = "--wake-gaps-ms") -> tuple[float, ...]:
    try:
        return tuple(float(g) for g in text.split(",") if g.strip())
    except ValueError:
        raise ValueError(f"cannot read {option} {text!r}: write milliseconds, e.g. 0.5,1,2,4") from None


def _env_hint(path: Path) -> str:
    return f"PRISM_LOCAL_CLUSTER={path}"


def main() -> None:
    stop_on_termination()
    app()


if __name__ == "__main__":
    main()
