"""SIGTERM and SIGHUP (timeout, Slurm, docker stop, a closed terminal) stop a prism command as
Ctrl-C does: exit 130, its temporary output removed, earlier output untouched."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
TINY_GPT = ["--tp", "1", "--pp", "2", "--dp", "4", "--layers", "2", "--hidden", "32", "--heads", "2",
            "--seq-len", "16", "--vocab", "128", "--microbatches", "2"]  # fmt: skip


def _stop_when(proc: subprocess.Popen, ready, sig: int, timeout_s: float = 120) -> int:
    """Send ``sig`` once ``ready()`` holds; the command's exit code."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the command never got to the point to stop it at"
        time.sleep(0.05)
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    return proc.returncode


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_capture_leaves_nothing(tmp_path: Path, sig: int) -> None:
    out = tmp_path / "cap"
    proc = subprocess.Popen(
        [str(BIN / "prism-capture"), *TINY_GPT, "--warmup", "3", "--iterations", "200", "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # Stopped while its rank processes run, their output in a temporary directory.
    running = lambda: any(tmp_path.glob(".cap.tmp-*/logs/*.log"))  # noqa: E731
    assert _stop_when(proc, running, sig) == 130
    assert list(tmp_path.iterdir()) == []


def test_a_stopped_build_keeps_the_graph_before(tmp_path: Path) -> None:
    capture = tmp_path / "cap"
    done = subprocess.run(
        [str(BIN / "prism-capture"), *TINY_GPT, "--warmup", "3", "--iterations", "1", "-o", str(capture)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    graph = tmp_path / "graph.parquet"
    graph.write_bytes(b"the graph before")
    proc = subprocess.Popen(
        [str(BIN / "prism-build-graph"), str(capture), "--tp", "1", "--pp", "2", "--dp", "8192", "-o", str(graph)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    writing = lambda: any(tmp_path.glob(".graph.parquet.*.tmp"))  # noqa: E731
    assert _stop_when(proc, writing, signal.SIGTERM) == 130
    assert graph.read_bytes() == b"the graph before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cap", "graph.parquet"]
