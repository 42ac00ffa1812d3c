"""SIGTERM and SIGHUP (timeout, Slurm, docker stop, a closed terminal) stop a prism command as
Ctrl-C does: exit 130, its temporary output removed, earlier output untouched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
HANG_STACKS = dict(os.environ, PYTHONFAULTHANDLER="1")  # SIGABRT prints every thread's stack
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
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        pytest.fail(
            f"still running 60 s after {signal.Signals(sig).name}; its threads:\n{proc.communicate()[1][-6000:]}"
        )
    return proc.returncode


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_capture_leaves_nothing(tmp_path: Path, sig: int) -> None:
    out = tmp_path / "cap"
    proc = subprocess.Popen(
        [str(BIN / "prism-capture"), *TINY_GPT, "--warmup", "3", "--iterations", "200", "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=HANG_STACKS,
    )  # fmt: skip
    # Stopped while its rank processes run, their output in a temporary directory.
    running = lambda: any(tmp_path.glob(".cap.tmp-*/logs/*.log"))  # noqa: E731
    assert _stop_when(proc, running, sig) == 130
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("termination") / "cap"
    done = subprocess.run(
        [str(BIN / "prism-capture"), *TINY_GPT, "--warmup", "3", "--iterations", "1", "-o", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


def test_a_stopped_build_keeps_the_graph_before(tmp_path: Path, capture: Path) -> None:
    graph = tmp_path / "graph.parquet"
    graph.write_bytes(b"the graph before")
    proc = subprocess.Popen(
        [str(BIN / "prism-build-graph"), str(capture), "--tp", "1", "--pp", "2", "--dp", "8192", "-o", str(graph)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=HANG_STACKS,
    )  # fmt: skip
    writing = lambda: any(p.name.startswith(".") for p in tmp_path.iterdir())  # noqa: E731 (staged output)
    assert _stop_when(proc, writing, signal.SIGTERM) == 130
    assert graph.read_bytes() == b"the graph before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph.parquet"]


def test_a_build_stopped_while_it_simulates_keeps_graph_and_summary_together(
    tmp_path: Path, capture: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from prism.graph.build import cli

    graph, summary = tmp_path / "graph.parquet", tmp_path / "summary.json"
    graph.write_bytes(b"the graph before")
    summary.write_text("the summary of the graph before")

    def stopped(*_: object, **__: object) -> None:
        raise KeyboardInterrupt  # a signal while the new graph is simulated

    monkeypatch.setattr(cli, "predict", stopped)
    argv = [str(capture), "--tp", "1", "--pp", "2", "--dp", "4", "-o", str(graph)]
    assert CliRunner().invoke(cli.app, argv).exit_code == 130
    assert graph.read_bytes() == b"the graph before"
    assert summary.read_text() == "the summary of the graph before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph.parquet", "summary.json"]
    monkeypatch.undo()
    assert CliRunner().invoke(cli.app, argv).exit_code == 0  # and a finished build replaces both
    assert graph.read_bytes() != b"the graph before"
    assert str(graph) in summary.read_text()
