"""``prism-capture``: run a slice of the built-in GPT job and record its traces."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from prism.capture.preflight import CaptureError
from prism.capture.progress import RankProgress
from prism.capture.runner import CaptureHooks, CaptureOptions, ProgramRoles, RealMode, run_capture
from prism.capture.workloads.gpt.config import ConfigError, GPTConfig
from prism.schemas import cli_help
from prism.schemas.cli_command import PrismCommand
from prism.schemas.cluster import ClusterSpec, ClusterSpecError
from prism.schemas.comm_log import read_comm_log
from prism.schemas.iterations import DEFAULT_WARMUP
from prism.schemas.layout import DEFAULT_ORDER, LayoutError, ParallelLayout, Role, parse_rank_list
from prism.schemas.layout_options import ONE, flag, layout_of
from prism.schemas.manifest import CaptureFiles, CaptureManifest
from prism.schemas.program import ProgramError, ProgramSpec
from prism.schemas.terminal import Table
from prism.schemas.termination import stop_on_termination

app = typer.Typer(add_completion=False, help=__doc__, no_args_is_help=False)
console = Console(stderr=True)
DEFAULT = GPTConfig()
GPT_LAYOUT = ParallelLayout(tp=DEFAULT.tp, pp=DEFAULT.pp, dp=DEFAULT.dp)


class ConsoleHooks(CaptureHooks):
    """Shows one progress bar per running rank."""

    def __init__(self) -> None:
        self._progress: RankProgress | None = None

    def batch_starting(
        self,
        ranks: tuple[int, ...],
        roles: dict[int, Role],
        *,
        value_pass: bool = False,
        capture_dir: Path | None = None,
    ) -> Callable[[dict], None]:
        what = "values sent between stages" if value_pass else None
        labels = {r: f"rank {r} ({what or roles[r].value})" for r in ranks}
        self._progress = RankProgress(console, labels).__enter__()
        for rank in ranks:
            self._progress.starting(rank)
        return self._progress

    def batch_done(self, ranks: tuple[int, ...]) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)
            self._progress = None

    def close(self) -> None:
        self.batch_done(())

    def __call__(self, event: dict) -> None:
        """A progress event of the running batch (runs that report events apart from the hooks)."""
        if self._progress is not None:
            self._progress(event)


def capture_table(manifest: CaptureManifest, out_dir: Path) -> Table:
    files = CaptureFiles(out_dir)
    table = Table(title=f"capture of {manifest.layout} — {out_dir}")
    for column in ("rank", "role", "stage", "iter ms (median, profiled)", "kineto", "ET", "comm calls"):
        table.add_column(column, justify="right" if column != "role" else "left")
    profiled = manifest.job.iterations
    for r in manifest.ranks:
        iter_ms = statistics.median(r.result.iteration_ns[-profiled:]) / 1e6
        comm_calls = str(len(read_comm_log(files.comm(r.rank)).calls))
        table.add_row(
            str(r.rank),
            r.role.value,
            str(r.stage),
            f"{iter_ms:.1f}",
            _size(files.kineto(r.rank)),
            _size(files.et(r.rank)),
            comm_calls,
        )
    table.caption = f"wall time {manifest.wall_s:.1f} s"
    return table


def _size(path: Path) -> str:
    size = path.stat().st_size
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.0f} KiB"


@app.command(cls=PrismCommand)
def capture(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", "-o", help="Capture directory to create.")] = Path(
        "capture-out"
    ),
    tp: Annotated[
        int | None, typer.Option(help=f"{cli_help.TP} {cli_help.CAPTURE_DEFAULT.format(DEFAULT.tp)}")
    ] = None,
    pp: Annotated[
        int | None, typer.Option(help=f"{cli_help.PP} {cli_help.CAPTURE_DEFAULT.format(DEFAULT.pp)}")
    ] = None,
    dp: Annotated[
        int | None, typer.Option(help=f"{cli_help.DP} {cli_help.CAPTURE_DEFAULT.format(DEFAULT.dp)}")
    ] = None,
    dp_replicate: Annotated[int | None, typer.Option(help=cli_help.DP_REPLICATE)] = None,
    dp_shard: Annotated[int | None, typer.Option(help=cli_help.DP_SHARD)] = None,
    cp: Annotated[int | None, typer.Option(help=cli_help.CP)] = None,
    ep: Annotated[int | None, typer.Option(help=cli_help.EP)] = None,
    etp: Annotated[int | None, typer.Option(help=cli_help.ETP)] = None,
    layers: Annotated[int, typer.Option(help="Transformer layers of the whole model.")] = DEFAULT.layers,
    hidden: Annotated[int, typer.Option(help="Model width.")] = DEFAULT.hidden,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = DEFAULT.heads,
    ffn_hidden: Annotated[int | None, typer.Option(help="MLP width [default: 4 * hidden].")] = None,
    seq_len: Annotated[int, typer.Option(help="Tokens per sample.")] = DEFAULT.seq_len,
    vocab: Annotated[int, typer.Option(help="Vocabulary size.")] = DEFAULT.vocab,
    micro_batch_size: Annotated[
        int, typer.Option("--micro-batch-size", "--mbs", help="Samples per microbatch.")
    ] = DEFAULT.micro_batch_size,
    microbatches: Annotated[
        int, typer.Option(help="Microbatches per iteration per DP rank.")
    ] = DEFAULT.microbatches,
    dtype: Annotated[str, typer.Option(help="float32, float64, bfloat16 or float16.")] = DEFAULT.dtype,
    seed: Annotated[int, typer.Option(help="Seed of weights and data.")] = DEFAULT.seed,
    grad_bucket_mb: Annotated[
        float, typer.Option(help="DP gradient bucket size (MiB).")
    ] = DEFAULT.grad_bucket_mb,
    iterations: Annotated[int, typer.Option(help=cli_help.ITERATIONS)] = 2,
    warmup: Annotated[int, typer.Option(help=cli_help.WARMUP)] = DEFAULT_WARMUP,
    device: Annotated[str, typer.Option(help="cpu (gloo) or cuda (NCCL).")] = "cpu",
    real: Annotated[
        RealMode, typer.Option(help="roles: one real rank per role, peers virtual; all: every rank real.")
    ] = RealMode.ROLES,
    threads: Annotated[int, typer.Option(help=cli_help.THREADS)] = 1,
    host_work: Annotated[
        Path | None,
        typer.Option(
            help="A cluster spec (prism-calibrate's) whose host_ns_per_byte each CPU rank does as work "
            "beside its program for every virtual collective, as gloo would."
        ),
    ] = None,
    hold_calls: Annotated[
        Path | None,
        typer.Option(
            help="A cluster spec of this machine (prism-calibrate's): each CPU rank's virtual calls hold "
            "its program, asleep, for their price under it, as a real call's wait would, so that compute "
            "after a call runs as it does in the real job."
        ),
    ] = None,
    overwrite: Annotated[bool, typer.Option(help=cli_help.OVERWRITE)] = False,
    rank_timeout: Annotated[float, typer.Option(min=1.0, help=cli_help.RANK_TIMEOUT)] = 1800.0,
    order: Annotated[str, typer.Option(help=cli_help.ORDER)] = DEFAULT_ORDER,
    ranks: Annotated[
        str | None,
        typer.Option(help="Capture these ranks, each alone, e.g. 0,7,8191 [default: one per role]."),
    ] = None,
    roles: Annotated[
        ProgramRoles,
        typer.Option(
            help="Program: capture every pipeline stage, or the first, two middle and the last (the "
            "build checks the middles made the same calls, then uses them for every middle stage), or "
            "every stage and on each the last rank of every other axis (one whose calls differ runs its own "
            "program for the ranks past the first on that axis)."
        ),
    ] = ProgramRoles.PIPELINE,
    nproc_per_node: Annotated[
        int, typer.Option(help="Program: processes per node of the target (LOCAL_WORLD_SIZE, GROUP_RANK).")
    ] = 8,
    run_to_end: Annotated[
        bool,
        typer.Option(
            help="Program: let it finish by itself instead of ending it after the captured iterations."
        ),
    ] = False,
    program: Annotated[
        list[str] | None,
        typer.Argument(
            help="-- train.py ARGS, or -- -m package.module ARGS: your own torch.distributed program, launched "
            "as torchrun would launch it (the model options are then not used)."
        ),
    ] = None,
) -> None:
    """Capture a slice of a job at its target layout: your own program (`-- train.py ARGS`), or the
    built-in GPT (default: tiny model, tp=8 pp=16 dp=64)."""
    hooks = ConsoleHooks()
    with reported(hooks, CaptureError, ConfigError, ProgramError, LayoutError, ClusterSpecError):
        degrees = {"tp": tp, "pp": pp, "dp": dp, "dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": cp,
                   "ep": ep, "etp": etp}  # fmt: skip
        layout = layout_of(degrees, ONE if program else GPT_LAYOUT, order=order)
        _refuse_unused(
            ctx,
            PROGRAM_ONLY if not program else MODEL_ONLY,
            "a program" if not program else "the built-in GPT",
        )
        if program:
            spec = ProgramSpec(
                argv=tuple(program), cwd=os.getcwd(), layout=layout, device=device,
                nproc_per_node=nproc_per_node, run_to_end=run_to_end,
            )  # fmt: skip
            job, what = {"program": spec}, f"program {spec.describe()}"
        else:
            if order != DEFAULT_ORDER:
                raise LayoutError(
                    f"the built-in GPT lays ranks out as {DEFAULT_ORDER}; --order is for programs"
                )
            if layout.extra_axes():
                raise LayoutError(
                    f"the built-in GPT has tp, pp and dp only; {', '.join(flag(a) for a in layout.extra_axes())} "
                    "are for programs"
                )
            config = GPTConfig(
                layers=layers, hidden=hidden, heads=heads, ffn_hidden=ffn_hidden, seq_len=seq_len, vocab=vocab,
                micro_batch_size=micro_batch_size, microbatches=microbatches, tp=layout.tp, pp=layout.pp, dp=layout.dp, dtype=dtype,
                device=device, seed=seed, grad_bucket_mb=grad_bucket_mb,
            )  # fmt: skip
            job, what = {"config": config}, f"model {model_line(config.to_dict())}"
        options = CaptureOptions(
            **job, ranks=parse_ranks(ranks), roles=roles, out_dir=out, real=real, warmup=warmup, iterations=iterations,
            threads=threads, overwrite=overwrite, rank_timeout_s=rank_timeout,
            host_ns_per_byte={} if host_work is None else dict(ClusterSpec.load(host_work).host_ns_per_byte),
            hold_calls=None if hold_calls is None else ClusterSpec.load(hold_calls),
        )  # fmt: skip
        console.print(f"[bold]prism-capture[/] {layout}, real={real.value}, {what}")
        manifest = run_capture(options, hooks)
    console.print(capture_table(manifest, out))


MODEL_ONLY = ("layers", "hidden", "heads", "ffn_hidden", "seq_len", "vocab", "micro_batch_size", "microbatches",
              "dtype", "seed", "grad_bucket_mb")  # fmt: skip
PROGRAM_ONLY = ("roles", "nproc_per_node", "run_to_end")


def _refuse_unused(ctx: typer.Context, names: tuple[str, ...], whose: str) -> None:
    """Options given on the command line that this kind of job does not use: an error, not ignored."""
    given = [n for n in names if getattr(ctx.get_parameter_source(n), "name", "DEFAULT") != "DEFAULT"]
    if given:
        flags = ", ".join("--" + n.replace("_", "-") for n in given)
        raise ConfigError(f"{flags}: only for {whose}, which this capture does not run")


def parse_ranks(text: str | None) -> tuple[int, ...] | None:
    """'0,7,8191' as ranks; None stays None."""
    if text is None:
        return None
    try:
        return parse_rank_list(text)
    except LayoutError as e:
        raise typer.BadParameter(str(e)) from None


def print_error(error: Exception, out: Console = console) -> None:
    """The ``error:`` line, then the lines under it (a failed rank's last log lines) indented."""
    first, *rest = str(error).splitlines()
    out.print(f"[bold red]error:[/] {first}", highlight=False, soft_wrap=True)
    for line in rest:
        out.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)


@contextmanager
def reported(hooks: ConsoleHooks, *errors: type[Exception]) -> Iterator[None]:
    """``errors`` end the command with an ``error:`` line (exit 2), an interruption with exit 130."""
    try:
        yield
    except errors as e:
        hooks.close()
        print_error(e)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        hooks.close()
        console.print("[bold red]interrupted[/]: nothing was written")
        raise typer.Exit(130) from None


def model_line(record: Mapping) -> str:
    """The built-in GPT's model, from its settings record, on one line."""
    c = GPTConfig.from_dict(dict(record))
    return (
        f"layers={c.layers} hidden={c.hidden} heads={c.heads} seq={c.seq_len} vocab={c.vocab} "
        f"mbs={c.micro_batch_size} microbatches={c.microbatches} {c.dtype} on {c.device}"
    )


def main() -> None:
    stop_on_termination()
    app()


if __name__ == "__main__":
    main()
