"""Paced captures: the program held by its virtual peers, and that time kept out of what the build reads."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prism.capture.rank_main import run_rank
from prism.capture.workloads.gpt.config import GPTConfig
from prism.graph.build.cli import app as build_app
from prism.graph.build.normalize import normalize_rank
from prism.graph.io.parquet import read_metadata
from prism.peers.clock import ImmediateClock, PendingCall
from prism.replay.paced_cli import app as paced_app
from prism.schemas.comm_log import HeldTime, read_comm_log
from prism.schemas.iterations import clean_unprofiled
from prism.schemas.manifest import CaptureFiles, RankJob, read_manifest

TINY = Path(__file__).parents[1] / "data" / "tiny_graph.parquet"
runner = CliRunner()
WAIT_NS = 20_000_000


class WaitingClock(ImmediateClock):
    """Every virtual call completes WAIT_NS after it was made: peers that always keep the rank waiting."""

    def completion_ns(self, call: PendingCall) -> int | None:
        return call.enter_ns + WAIT_NS


def test_waits_on_virtual_peers_stay_out_of_gaps_and_iteration_times(tmp_path: Path) -> None:
    config = GPTConfig(
        layers=2, hidden=32, heads=2, seq_len=16, vocab=128, micro_batch_size=1, microbatches=2, tp=2, pp=2, dp=1
    )  # fmt: skip
    job = RankJob(workload="gpt", config=config.to_dict(), real_ranks=(), warmup=3, iterations=1, threads=1)
    result = run_rank(job, 0, tmp_path, clock=WaitingClock())
    log = read_comm_log(CaptureFiles(tmp_path).comm(0))
    waited = [c for c in log.calls if c.wait_ns]
    assert len(waited) >= 4 * job.warmup  # the tp all-reduces wait in every iteration
    # Held: at least each sync call's wait; the program's own time is what is left.
    for wall, held in zip(result.iteration_ns, result.held_ns, strict=True):
        assert held > 2 * WAIT_NS
        assert 0 < wall - held < wall
    ops = normalize_rank(tmp_path, 0)
    # Without the take-out, the unit after each waited call would carry the call's wait in its gap
    # (four or more an iteration); one long gap is what a busy machine's scheduler can add.
    # The same holds of the compute ops' own durations: a leaked wait would lengthen four or more.
    assert (ops["gap_ns"] >= WAIT_NS / 2).sum() <= 1, ops["gap_ns"].nlargest(5).tolist()
    compute = ops.loc[~ops["is_comm"], "dur_ns"]
    assert (compute >= WAIT_NS / 2).sum() <= 1, compute.nlargest(5).tolist()
    (iteration,) = ops.attrs["iterations"]
    span = iteration["end_ns"] - iteration["start_ns"]
    own = int((ops["gap_ns"] + ops["dur_ns"]).sum())
    held = HeldTime(log).within(*_wall(iteration, ops, log))
    assert own < span - held / 2  # the held time left the table


def _wall(iteration: dict, ops, log) -> tuple[int, int]:
    """The profiled iteration's span on the wall clock (the trace's clock moved by the calls' offset)."""
    comm = ops[ops["is_comm"]]
    enter = {(c.group, c.gseq): c.enter_ns for c in log.calls}
    offset = statistics.median(
        s - enter[(g, q)] for s, g, q in zip(comm["start_ns"], comm["group_name"], comm["gseq"], strict=True)
    )
    return int(iteration["start_ns"] - offset), int(iteration["end_ns"] - offset)


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("paced") / "capture"
    result = runner.invoke(paced_app, [str(TINY), "-o", str(out), "--warmup", "3", "--iterations", "1"])
    assert result.exit_code == 0, result.output
    return out


def test_a_paced_capture_is_a_capture_of_the_graphs_job_held_by_its_peers(paced: Path) -> None:
    manifest = read_manifest(paced)
    meta = read_metadata(TINY)
    assert manifest.mode == "paced"
    assert manifest.notes["paced_by"] == str(TINY.resolve())
    assert manifest.job.config == meta.model
    assert sorted(r.rank for r in manifest.ranks) == sorted(manifest.layout.roles().values())
    for rank in manifest.ranks:
        result = rank.result
        assert (
            len(result.held_ns) == len(result.iteration_ns) == manifest.job.warmup + manifest.job.iterations
        )
        # The graph's peers hold every clean iteration: it waits on its pipeline neighbour at least.
        assert all(h > 0 for h in clean_unprofiled(result.held_ns, manifest.job.warmup))


def test_the_build_reads_a_paced_capture(paced: Path, tmp_path: Path) -> None:
    out = tmp_path / "graph.parquet"
    result = runner.invoke(build_app, [str(paced), "--tp", "2", "--pp", "2", "--dp", "2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert read_metadata(out).model["tp"] == 2


def test_pacing_by_a_file_that_is_not_a_graph_is_one_error_line(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.parquet"
    bogus.write_text("not parquet")
    result = runner.invoke(paced_app, [str(bogus), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert [line for line in result.output.splitlines() if line.startswith("error:")][0].startswith(
        f"error: {bogus}"
    )
    assert not (tmp_path / "out").exists()
