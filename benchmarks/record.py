"""Run a benchmark command and keep what it printed as a result file, with how it was made.

    .venv/bin/python benchmarks/record.py NAME -- COMMAND [ARGS...]

Runs COMMAND (output shown as it runs) and writes ``benchmarks/results/NAME.txt`` (or ``--dir``): a header
with the command, the commit it ran at, the date and the machine, then everything the command
printed, then its wall time. The file is written only if the command succeeds (exit 0), and atomically. Prints the
path written; exits with the command's code.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prism.fidelity.report import machine

RESULTS = Path(__file__).resolve().parent / "results"


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, cwd=RESULTS.parent
        ).stdout.strip()

    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    return rev + (
        " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else ""
    )


def header(command: list[str]) -> str:
    facts = machine()
    return (
        f"# command: {shlex.join(command)}\n# commit: {_commit()}\n# date: {facts['date']}\n"
        f"# machine: {facts['nproc']} CPUs, {facts['cpu_model']}, {facts['platform']}\n\n"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], usage="%(prog)s NAME [--dir DIR] -- COMMAND [ARGS...]"
    )
    parser.add_argument("name", help="result file name, without .txt")
    parser.add_argument(
        "--dir", type=Path, default=RESULTS, help="where to write it [default: benchmarks/results]"
    )
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        parser.error("no command given (NAME -- COMMAND [ARGS...])")
    args.dir.mkdir(parents=True, exist_ok=True)
    text = header(command)
    env = {**os.environ, "COLUMNS": os.environ.get("COLUMNS", "160")}
    started = time.perf_counter()
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            text += line
    if proc.returncode != 0:
        print(f"record: {shlex.join(command)} exited {proc.returncode}; nothing written", file=sys.stderr)
        return proc.returncode
    text += f"\n# elapsed: {time.perf_counter() - started:.1f} s\n"
    out = args.dir / f"{args.name}.txt"
    with tempfile.NamedTemporaryFile("w", dir=args.dir, delete=False, suffix=".tmp") as tmp:
        tmp.write(text)
    os.replace(tmp.name, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
