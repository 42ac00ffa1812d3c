"""Start rank processes like torchrun, stream their progress, and never hang on a dead one."""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prism.capture.progress import PROGRESS_PREFIX

ProgressCallback = Callable[[dict], None]


class LaunchError(RuntimeError):
    """A rank process failed or ran out of time."""


@dataclass(frozen=True, kw_only=True)
class RankLaunch:
    """One rank process to start."""

    rank: int
    """Global rank."""
    argv: tuple[str, ...]
    """Command line."""
    log_path: Path
    """Where its stdout and stderr go."""
    local_rank: int = 0
    """Index of the process on this machine (selects the CUDA device)."""
    cpus: frozenset[int] | None = None
    """Cores the process and every thread it starts are held to; None: wherever the scheduler puts them."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_command(
    job_path: Path, rank: int | str, out_dir: Path, main: str = "prism.capture.rank_main"
) -> tuple[str, ...]:
    """argv of one rank process: ``main`` (the built-in GPT's or a program's) with its job."""
    return (
        sys.executable,
        "-m",
        main,
        "--job",
        str(job_path),
        "--rank",
        str(rank),
        "--out",
        str(out_dir),
    )


def parse_rank_args(main: str, doc: str, argv: list[str] | None) -> argparse.Namespace:
    """The arguments ``rank_command`` gives a rank process: ``--job``, ``--rank``, ``--out``."""
    parser = argparse.ArgumentParser(prog=f"python -m {main}", description=doc.splitlines()[0])
    parser.add_argument("--job", type=Path, required=True, help="job.json of the run")
    parser.add_argument("--rank", type=int, required=True, help="global rank to run for real")
    parser.add_argument("--out", type=Path, required=True, help="directory to write into")
    return parser.parse_args(argv)


def _pump(proc: subprocess.Popen, rank: int, log_path: Path, events: queue.Queue) -> None:
    """Copy a process's output to its log; forward progress lines as events."""
    with open(log_path, "a", buffering=1) as log:  # line-buffered: a failure message reads its tail
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if line.startswith(PROGRESS_PREFIX):
                try:
                    events.put(json.loads(line[len(PROGRESS_PREFIX) :]))
                except json.JSONDecodeError:
                    pass
    events.put({"rank": rank, "event": "exit", "code": proc.wait()})


def _held_to(cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """What the child runs before its program: pin itself (its threads, started later, inherit
    it), set there so that no thread of the program ever runs elsewhere."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def _how_it_ended(code: int) -> str:
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    if -code == signal.SIGKILL:  # nothing in the rank sends it: the kernel's out-of-memory killer does
        return f"was killed by {name} (out of memory? the kernel's log says: dmesg | grep -i kill)"
    return f"was killed by {name}"


RANK_ERROR = "error: "
"""How a rank process's last log line begins when it ends on an error it explains in that line."""


def _log_tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    interesting = [line for line in text if not line.startswith(PROGRESS_PREFIX)]
    return "\n".join(interesting[-lines:])


def run_processes(
    launches: Sequence[RankLaunch],
    *,
    world_size: int,
    timeout_s: float,
    on_event: ProgressCallback | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """Run ``launches`` concurrently; return when all exit 0, raise LaunchError otherwise.

    On the first failure or on timeout every other process is killed, so a rank stuck in a
    collective whose peer died never hangs the capture.
    """
    port = str(free_port())
    events: queue.Queue = queue.Queue()
    procs: dict[int, subprocess.Popen] = {}
    try:
        for launch in launches:
            launch.log_path.parent.mkdir(parents=True, exist_ok=True)
            proc_env = {
                **os.environ,
                **(env or {}),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "WORLD_SIZE": str(world_size),
                "RANK": str(launch.rank),
                "LOCAL_RANK": str(launch.local_rank),
                "PYTHONUNBUFFERED": "1",
            }
            proc = subprocess.Popen(
                launch.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=proc_env,
                preexec_fn=_held_to(launch.cpus),
            )  # fmt: skip
            procs[launch.rank] = proc
            threading.Thread(
                target=_pump, args=(proc, launch.rank, launch.log_path, events), daemon=True
            ).start()
        _wait_all(procs, {lr.rank: lr.log_path for lr in launches}, events, timeout_s, on_event)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _wait_all(
    procs: dict[int, subprocess.Popen],
    logs: dict[int, Path],
    events: queue.Queue,
    timeout_s: float,
    on_event: ProgressCallback | None,
) -> None:
    deadline = time.monotonic() + timeout_s
    running = set(procs)
    while running:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            # The logs are in the run's temporary directory, gone once it fails: their tail goes
            # into the message.
            first = min(running)
            raise LaunchError(
                f"rank(s) {', '.join(map(str, sorted(running)))} still running after {timeout_s:.0f} s; "
                f"last lines of rank {first}'s log:\n{_log_tail(logs[first])}"
            )
        try:
            event = events.get(timeout=min(remaining, 1.0))
        except queue.Empty:
            continue
        if event.get("event") == "exit":
            rank, code = event["rank"], event["code"]
            running.discard(rank)
            if code != 0:
                tail = _log_tail(logs[rank])
                last = tail.splitlines()[-1] if tail else ""
                if last.startswith(RANK_ERROR):  # the rank said what went wrong, in one line
                    raise LaunchError(f"rank {rank}: {last.removeprefix(RANK_ERROR)}")
                log = f"last lines of its log:\n{tail}" if tail else "its log is empty"
                raise LaunchError(f"rank {rank} {_how_it_ended(code)}; {log}")
        elif on_event is not None:
            on_event(event)
