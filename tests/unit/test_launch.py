"""The rank-process launcher reports failures and time-outs instead of hanging."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from prism.capture.launch import LaunchError, RankLaunch, run_processes
from prism.capture.progress import PROGRESS_PREFIX
from prism.replay.cores import can_pin


def launch(tmp_path: Path, rank: int, code: str) -> RankLaunch:
    return RankLaunch(rank=rank, argv=(sys.executable, "-c", code), log_path=tmp_path / f"rank{rank}.log")


def test_progress_events_reach_the_callback(tmp_path: Path) -> None:
    code = (
        f'print({PROGRESS_PREFIX!r} + \'{{"rank": 0, "event": "iteration", "done": 1}}\'); print(\'hello\')'
    )
    events: list[dict] = []
    run_processes([launch(tmp_path, 0, code)], world_size=1, timeout_s=60, on_event=events.append)
    assert events == [{"rank": 0, "event": "iteration", "done": 1}]
    assert "hello" in (tmp_path / "rank0.log").read_text()


def test_failing_rank_kills_the_others_and_names_itself(tmp_path: Path) -> None:
    stuck = launch(tmp_path, 0, "import time; time.sleep(120)")
    failing = launch(tmp_path, 1, "import sys; print('boom: bad shape'); sys.exit(3)")
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match=r"rank 1 exited with code 3[\s\S]*boom: bad shape"):
        run_processes([stuck, failing], world_size=2, timeout_s=60)
    assert time.monotonic() - t0 < 30


def test_a_rank_killed_by_the_kernel_is_named_so(tmp_path: Path) -> None:
    """SIGKILL from outside (the out-of-memory killer) leaves no log line: the message says what
    killed the rank and where to look, not an empty tail."""
    killed = launch(tmp_path, 0, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    with pytest.raises(
        LaunchError, match=r"rank 0 was killed by SIGKILL \(out of memory\?.*dmesg.*its log is empty"
    ):
        run_processes([killed], world_size=1, timeout_s=60)


def test_timeout_kills_stuck_ranks(tmp_path: Path) -> None:
    # The message carries the log's tail: the log itself is in a directory a failed run removes.
    stuck = "import time; print('waiting for rank 7', flush=True); time.sleep(120)"
    with pytest.raises(LaunchError, match=r"still running after 1 s[\s\S]*waiting for rank 7") as error:
        run_processes([launch(tmp_path, 0, stuck)], world_size=1, timeout_s=1)
    assert str(tmp_path) not in str(error.value)


@pytest.mark.skipif(not can_pin(), reason="this platform cannot pin processes to cores")
def test_a_pinned_rank_and_the_threads_it_starts_run_on_its_cores_only(tmp_path: Path) -> None:
    core = min(os.sched_getaffinity(0))
    code = (
        "import os, threading; seen = []; "
        "t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0)))); t.start(); t.join(); "
        "print('main', sorted(os.sched_getaffinity(0)), 'thread', seen[0])"
    )
    pinned = RankLaunch(rank=0, argv=(sys.executable, "-c", code), log_path=tmp_path / "rank0.log",
                        cpus=frozenset({core}))  # fmt: skip
    run_processes([pinned], world_size=1, timeout_s=60)
    assert f"main [{core}] thread [{core}]" in (tmp_path / "rank0.log").read_text()
    # Unpinned, the process may run wherever this one may.
    run_processes([launch(tmp_path, 1, code)], world_size=1, timeout_s=60)
    everywhere = sorted(os.sched_getaffinity(0))
    assert f"main {everywhere} thread {everywhere}" in (tmp_path / "rank1.log").read_text()
