"""prism-replay end to end on the checked-in tiny graph (tp=2 pp=2 dp=2): real ranks, virtual peers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import simulate
from prism.graph.sim.whatif import BlockDelay, WhatIf, apply_what_if
from prism.graph.traces.kineto import read_json_file
from prism.replay.cli import app
from prism.replay.cores import can_pin
from prism.replay.wait_spans import WAIT_CATEGORY
from prism.schemas import graph_format as gf
from prism.schemas.comm_log import read_comm_log
from prism.schemas.replay import ReplayFiles, ReplayRankStats, ReplayReport

TINY = Path(__file__).parents[1] / "data" / "tiny_graph.parquet"
runner = CliRunner()


def run_cli(*args: str):
    return runner.invoke(app, list(args))


def error_line(result) -> str:
    return next(line for line in result.output.splitlines() if line.startswith("error:"))


def with_metadata(tmp_path: Path, **changes: object) -> Path:
    """The tiny graph with some of its file metadata changed (``model`` entries merge)."""
    table = pq.read_table(TINY)
    meta = json.loads(table.schema.metadata[gf.METADATA_KEY])
    for key, value in changes.items():
        meta[key] = {**meta[key], **value} if isinstance(value, dict) else value
    path = tmp_path / "changed.parquet"
    pq.write_table(table.replace_schema_metadata({gf.METADATA_KEY: json.dumps(meta).encode()}), path)
    return path


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("replay") / "out"
    result = run_cli(
        str(TINY), "--rank", "0", "--rank", "7", "-o", str(out), "--warmup", "4", "--iterations", "1",
        "--trace-peers", "1,4", "--separately",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def replayed_together(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ranks 0, 1 (stage 0) and 4, 5 (stage 1) at once: tp groups {0,1} and {4,5} all real,
    transfers 0<->4 and 1<->5 between real ranks, dp groups and the world mixed."""
    out = tmp_path_factory.mktemp("together") / "out"
    ranks = [arg for r in (0, 1, 4, 5) for arg in ("--rank", str(r))]
    result = run_cli(
        str(TINY), *ranks, "-o", str(out), "--warmup", "4", "--iterations", "1", "--trace-peers", "2"
    )
    assert result.exit_code == 0, result.output
    return out


def test_ranks_replayed_together_share_real_groups_and_one_cosimulation(replayed_together: Path) -> None:
    files = ReplayFiles(replayed_together)
    report = ReplayReport.from_dict(json.loads(files.report.read_text()))
    assert [r.rank for r in report.ranks] == [0, 1, 4, 5]
    for r in report.ranks:
        # Real transfers free their buffers on gloo's threads at times (a few KiB): the target.
        assert abs(r.mem_err_pct) <= 0.1
        assert r.measured_iter_ms > 0 and r.calls_per_iter > 0
    for rank in (0, 1, 4, 5):
        log = read_comm_log(files.comm(rank))
        group = {g.name: g for g in log.groups}
        steady = [c for c in log.calls if group[c.group].label != "world" or c.op in ("send", "recv")]
        by_kind = {(group[c.group].label.split(".")[0], c.op, c.delegated) for c in steady}
        assert ("tp", "all_reduce", True) in by_kind  # the tp pair is all real: gloo, real data
        assert ("world", "send", True) in by_kind and ("world", "recv", True) in by_kind  # real peer
        assert not any(kind == "dp" and delegated for kind, _, delegated in by_kind)  # dp peers virtual
        stats = ReplayRankStats.from_dict(json.loads(files.replay_stats(rank).read_text()))
        assert len(stats.iterations) == 5 and all(it.emulated_ns > 0 for it in stats.iterations)
        # One co-simulation served them all: they agree on every rank's time in every pass.
        assert (
            stats.virtual_iteration_ns
            == ReplayRankStats.from_dict(json.loads(files.replay_stats(0).read_text())).virtual_iteration_ns
        )
    assert files.peer_trace(2).exists()


def test_replay_reports_every_real_rank_against_the_prediction(replayed: Path) -> None:
    report = ReplayReport.from_dict(json.loads((replayed / "report.json").read_text()))
    assert [r.rank for r in report.ranks] == [0, 7]
    assert report.cores is None  # left to the scheduler unless --pin
    assert [r.role for r in report.ranks] == ["first", "last"]
    for r in report.ranks:
        assert r.measured_iter_ms > 0 and r.predicted_iter_ms > 0
        # The wall time is the measurement; the corrected time takes the stall out of it.
        assert r.wall_iter_ms >= 0.99 * r.measured_iter_ms
        assert r.wall_err_pct == pytest.approx((r.predicted_iter_ms - r.wall_iter_ms) / r.wall_iter_ms * 100)
        assert r.calls_per_iter > 0
        assert r.measured_peak_bytes > 0 and r.predicted_peak_bytes > 0
        assert {p.phase for p in r.phases} >= {"fwd", "bwd", "optim"}
        measured_total = sum(p.measured_ms for p in r.phases)
        assert measured_total == pytest.approx(r.measured_iter_ms, rel=0.25)  # phases cover the iteration
        assert r.replay_rss_bytes > 0


@pytest.mark.skipif(not can_pin() or len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin")
def test_a_pinned_replay_holds_the_rank_and_the_cosimulation_to_cores_of_their_own(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_cli(str(TINY), "--rank", "0", "-o", str(out), "--warmup", "4", "--iterations", "1", "--pin")
    assert result.exit_code == 0, result.output
    report = ReplayReport.from_dict(json.loads((out / "report.json").read_text()))
    cores = sorted(os.sched_getaffinity(0))
    assert report.cores == {"ranks": [cores[:1]], "launcher": cores[1:]}
    assert report.ranks[0].wall_iter_ms > 0


def test_replay_writes_the_real_ranks_trace_and_the_cosimulation(replayed: Path) -> None:
    files = ReplayFiles(replayed)
    for rank in (0, 7):
        events = read_json_file(files.kineto(rank))["traceEvents"]
        waits = [e for e in events if e.get("cat") == WAIT_CATEGORY]
        comm_marks = [e for e in events if e.get("ph") == "X" and e["name"].startswith("prism:comm")]
        assert len(waits) == len(comm_marks) > 0  # every profiled virtual call, as a span of its own
        assert all(e["dur"] >= 0 and e["tid"] != comm_marks[0]["tid"] for e in waits)
        stats = ReplayRankStats.from_dict(json.loads(files.replay_stats(rank).read_text()))
        assert len(stats.iterations) == 5  # 4 warm-up + 1 profiled
        assert all(it.emulated_ns > 0 and it.engine_ns > 0 and it.stall_ns >= 0 for it in stats.iterations)


def test_trace_peers_are_chrome_traces_of_virtual_ranks(replayed: Path) -> None:
    trace = json.loads(ReplayFiles(replayed).peer_trace(4).read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    nodes = pq.read_table(TINY, filters=[(gf.RANK, "=", 4)]).num_rows
    assert len(spans) == 5 * nodes  # every node of every iteration (of the last replayed rank's run)
    assert all(e["pid"] == 4 and e["dur"] >= 0 for e in spans)
    real = [e for e in read_json_file(ReplayFiles(replayed).kineto(7))["traceEvents"] if e.get("ph") == "X"]
    lo, hi = min(e["ts"] for e in real), max(e["ts"] + e.get("dur", 0) for e in real)
    profiled = [e for e in spans if e["args"]["iteration"] == 4]  # on the real rank's trace clock
    assert lo <= min(e["ts"] for e in profiled) and max(e["ts"] for e in profiled) <= hi
    assert any("recv with peer 0" in e["name"] for e in spans)


def test_a_program_that_leaves_the_graph_stops_with_what_each_side_did(tmp_path: Path) -> None:
    changed = with_metadata(tmp_path, model={"hidden": 64, "heads": 2})  # the program's tensors double
    result = run_cli(
        str(changed), "--rank", "0", "-o", str(tmp_path / "out"), "--warmup", "3", "--iterations", "1"
    )
    assert result.exit_code == 2, result.output
    line = error_line(result)
    assert "the program made all_reduce on tp.0" in line and "the graph expects all_reduce on tp.0" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--rank", "8"], "rank 8 is out of range: the graph's job has ranks 0..7"),
        (["--rank", "0", "--trace-peers", "9"], "rank 9 is out of range"),
        (["--rank", "0", "--warmup", "2"], "--warmup must be at least 3"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    result = run_cli(str(TINY), *args, "-o", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert needle in error_line(result)
    assert not (tmp_path / "out").exists()


def test_a_graph_of_another_version_is_refused(tmp_path: Path) -> None:
    old = with_metadata(tmp_path, version=1)
    result = run_cli(str(old), "--rank", "0", "-o", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "graph format version 1 is not supported" in error_line(result)


def test_a_missing_graph_is_one_line_naming_it_once_before_anything_starts(tmp_path: Path) -> None:
    missing = tmp_path / "nope.parquet"
    result = run_cli(str(missing), "--rank", "0", "-o", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert error_line(result).count(str(missing)) == 1 and "no such file" in error_line(result)
    assert "starting" not in result.output and "prism-replay" not in result.output


def test_a_file_that_is_not_a_graph_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    result = run_cli(str(junk), "--rank", "0", "-o", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert str(junk) in error_line(result)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error when CUDA is absent")
def test_a_program_that_cannot_start_here_is_refused(tmp_path: Path) -> None:
    result = run_cli(str(TINY), "--rank", "0", "--device", "cuda", "-o", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "no CUDA device is available" in error_line(result)


def test_more_real_cuda_ranks_at_once_than_gpus_is_refused(tmp_path: Path, monkeypatch) -> None:
    # Two real ranks at once each take a GPU (LOCAL_RANK 0 and 1); on a one-GPU host the second
    # would fail inside its process with an invalid device ordinal, after the first had started.
    from prism.replay import runtime

    monkeypatch.setattr(runtime, "_cuda_devices", lambda: 1)
    args = (str(TINY), "--rank", "0", "--rank", "1", "--device", "cuda", "-o", str(tmp_path / "out"))
    result = run_cli(*args)
    assert result.exit_code == 2
    assert "2 real ranks at once need a GPU each, and this machine has 1" in error_line(result)
    assert "--separately" in error_line(result)
    assert not (tmp_path / "out").exists()


def test_a_straggler_moves_its_virtual_peers_as_the_offline_what_if(tmp_path: Path, replayed: Path) -> None:
    # The same rank replayed with and without a delay: the virtual ranks must move by what the
    # offline what-if with that delay predicts. The delay dwarfs the tiny job's own iteration
    # (~12 ms); the real rank's own iteration differs between the two replays by up to about one
    # of them on a loaded 2-core machine (14 ms seen), which moves its virtual peers with it.
    delay = BlockDelay(phase="optim", layer=None, delay_ns=1_000_000_000, rank=0)
    out = tmp_path / "out"
    # Warm-up 6: the first iterations after the straggler appears are a transient (the peers
    # first wait in the second one); the median of the clean ones is then the steady state.
    result = run_cli(str(TINY), "--rank", "0", "-o", str(out), "--warmup", "6", "--iterations", "1", "--delay", "optim:+1s")  # fmt: skip
    assert result.exit_code == 0, result.output

    def virtual(root: Path) -> np.ndarray:
        return np.array(
            ReplayRankStats.from_dict(
                json.loads(ReplayFiles(root).replay_stats(0).read_text())
            ).virtual_iteration_ns
        )

    graph = load_sim_graph(TINY)
    what_if = simulate(apply_what_if(graph, TINY, WhatIf(delays=(delay,))), iterations=3).iteration_ns
    predicted_move = what_if - simulate(graph, iterations=3).iteration_ns
    assert (predicted_move > 950_000_000).all()  # every rank waits for the straggler
    noise = 2 * simulate(graph, iterations=3).iteration_ns.max()
    # Rank 0 is the real one: its move is the delay as the machine ran it (a loaded 2-core
    # machine oversleeps a 1 s delay and varies the rank's own time, 24 ms seen); the virtual ranks
    # must follow it as the what-if says every rank follows the straggler.
    moved = virtual(out) - virtual(replayed)
    assert abs(moved[0] - predicted_move[0]) < 0.05 * delay.delay_ns
    np.testing.assert_allclose(moved - moved[0], predicted_move - predicted_move[0], rtol=0, atol=noise)


def test_a_graph_that_cannot_be_simulated_is_an_error_not_a_hang(tmp_path: Path) -> None:
    import time

    import pyarrow as pa

    table = pq.read_table(TINY)
    dur = table.column(gf.DUR_NS).to_numpy().copy()
    dur[3] = 2**62  # a corrupt duration: simulating it would overflow the clock
    damaged = tmp_path / "damaged.parquet"
    pq.write_table(
        table.set_column(table.schema.get_field_index(gf.DUR_NS), gf.DUR_NS, pa.array(dur)), damaged
    )
    began = time.monotonic()
    result = run_cli(
        str(damaged), "--rank", "0", "-o", str(tmp_path / "r"), "--warmup", "3", "--iterations", "1"
    )
    assert result.exit_code == 2, result.output
    assert "overflow" in error_line(result)
    assert time.monotonic() - began < 120  # the rank is refused, not left waiting for its timeout
    assert not (tmp_path / "r").exists()
