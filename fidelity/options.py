"""The command-line options the fidelity benchmarks share: which cases, and how many runs of each.

``benchmarks/fidelity.py`` and ``benchmarks/noise_floor.py`` take the same cases, so that a
noise floor is measured on exactly the cases of the fidelity run it is set beside.
"""

from __future__ import annotations

import argparse
import shlex

from prism.fidelity.cases import DEFAULT_CASES, random_cases
from prism.fidelity.measure import RunSettings
from prism.fidelity.program_case import ProgramCase
from prism.schemas.iterations import MIN_WARMUP
from prism.schemas.layout_options import DEGREES, flag, layout_of


def add_case_options(parser: argparse.ArgumentParser) -> None:
    """--case, --random/--seed, --program with its layout's degrees and --device; --repeats,
    --warmup, --iterations; --steal-limit, --steal-tries, --window-s."""
    parser.add_argument("--case", action="append", default=None, help="key=value ... (repeatable)")
    parser.add_argument(
        "--random", type=int, default=0, metavar="N",
        help="N cases drawn at random (prism.fidelity.cases.random_cases) instead of the fixed ones",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="seed of the --random draw")
    parser.add_argument(
        "--program", action="append", default=None,
        help="a program and its arguments, as after `torchrun ... --` (repeatable; with --tp/--pp/--dp, "
        "--dp-replicate, --dp-shard, --cp, --ep, --etp)",
    )  # fmt: skip
    for name in DEGREES:
        parser.add_argument(
            flag(name), type=int, default=None, help=f"{name} degree of --program cases [default: 1]"
        )
    parser.add_argument(
        "--capture-program", default=None, metavar="PROGRAM",
        help="the one --program case's slice captures this program instead (the same model at fewer layers), "
        "its graph built with --build-layers",
    )  # fmt: skip
    parser.add_argument(
        "--build-layers", type=int, default=None, metavar="L",
        help="build the --capture-program capture at L layers (prism-build-graph --layers), the --program's count",
    )  # fmt: skip
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu",
        help="where --program cases run (cuda: one GPU per rank; the program must place itself on it)",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side per case (medians kept)")
    parser.add_argument("--warmup", type=int, default=RunSettings.warmup)
    parser.add_argument("--iterations", type=int, default=RunSettings.iterations, help="profiled iterations")
    parser.add_argument(
        "--steal-limit", type=float, default=RunSettings.steal_limit_pct, metavar="PCT",
        help="run a real, twin or replayed run again (at most --steal-tries runs) when more than PCT %% of "
        "the machine's CPU time was stolen during it; a negative PCT keeps every run [default: %(default)s]",
    )  # fmt: skip
    parser.add_argument(
        "--steal-tries", type=int, default=RunSettings.steal_tries, help="[default: %(default)s]"
    )
    parser.add_argument(
        "--window-s", type=float, default=None, metavar="S",
        help="grow each case's --warmup so that every run's median spans S seconds of clean iterations, "
        "by a probe real run's iteration time (a program must allow that many steps)",
    )  # fmt: skip


def check_case_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One ``error:`` line (argparse's, exit 2) for options that do not go together."""
    if args.window_s is not None and args.window_s <= 0:
        parser.error(f"--window-s must be positive, got {args.window_s}")
    if args.steal_tries < 1:
        parser.error(f"--steal-tries must be at least 1, got {args.steal_tries}")
    if args.program and args.case:
        parser.error("--program and --case are separate runs")
    if args.random and (args.case or args.program):
        parser.error("--random draws the cases: give it without --case or --program")
    if args.random < 0:
        parser.error("--random must be a number of cases (>= 1)")
    if (args.capture_program is None) != (args.build_layers is None):
        parser.error("--capture-program and --build-layers go together")
    if args.capture_program is not None and len(args.program or ()) != 1:
        parser.error("--capture-program stands for one --program case: give exactly one --program")
    if args.build_layers is not None and args.build_layers < 1:
        parser.error(f"--build-layers must be at least 1, got {args.build_layers}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.warmup < MIN_WARMUP:
        parser.error(
            f"--warmup must be at least {MIN_WARMUP}: the real run's time is its clean unprofiled iterations"
        )


def measuring_settings(args: argparse.Namespace) -> dict:
    """``RunSettings``' steal limit and tries and the window, from --steal-limit, --steal-tries, --window-s."""
    return {
        "steal_limit_pct": None if args.steal_limit < 0 else args.steal_limit,
        "steal_tries": args.steal_tries,
        "window_s": args.window_s,
    }


def case_texts(args: argparse.Namespace) -> list[str]:
    """The built-in model's cases, as ``parse_case`` reads them: --case, else --random's draw,
    else the fixed ones."""
    if args.case:
        return list(args.case)
    return list(random_cases(args.random, args.seed) if args.random else DEFAULT_CASES)


def program_cases(args: argparse.Namespace) -> list[ProgramCase]:
    """Each --program at the layout of its degrees (--tp, --dp-replicate, ...: those not given 1) on
    --device (``LayoutError`` for a bad layout)."""
    layout = layout_of({name: getattr(args, name) for name in DEGREES})
    captured = getattr(args, "capture_program", None)
    return [
        ProgramCase(
            argv=tuple(shlex.split(text)),
            layout=layout,
            device=args.device,
            captured_argv=tuple(shlex.split(captured)) if captured else None,
            layers=getattr(args, "build_layers", None),
        )  # fmt: skip
        for text in args.program
    ]
