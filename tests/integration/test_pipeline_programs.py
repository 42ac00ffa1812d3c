"""torch.distributed.pipelining programs, captured at 1,024 and 8,192 ranks, built, validated,
simulated, and a stage replayed.

The stages infer the shapes between them on the first step (no example inputs), so these only
work because the value pass records what the stages send each other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from prism.capture.cli import app as capture_app
from prism.graph.build.cli import app as build_app
from prism.graph.io.parquet import read_metadata, read_rank
from prism.graph.io.validate import validate_graph
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import simulate
from prism.schemas import graph_format as gf
from prism.schemas.iterations import clean_unprofiled
from prism.schemas.manifest import CaptureFiles, read_manifest
from prism.schemas.received_values import read_received_values
from tests.integration.programs import captured_and_built, replayed

ROOT = Path(__file__).resolve().parents[2]
PP = ROOT / "examples" / "pp.py"
TINY = ("--steps", "50", "--hidden", "32", "--vocab", "64", "--batch", "4", "--seq", "8")
runner = CliRunner()

pytestmark = pytest.mark.slow


def capture_build_simulate(tmp_path: Path, schedule: str, pp: int, dp: int) -> tuple[Path, Path]:
    layout = ("--tp", "1", "--pp", str(pp), "--dp", str(dp))
    program = (str(PP), "--pp", str(pp), "--schedule", schedule, *TINY)
    return captured_and_built(tmp_path / "cap", layout, program, warmup=3)


SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"]


@pytest.fixture(scope="module")
def schedule_graph(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """The capture and graph of a schedule at pp=2 dp=512, made on first use and kept for the module."""
    return functools.cache(
        lambda schedule: capture_build_simulate(tmp_path_factory.mktemp(schedule), schedule, pp=2, dp=512)
    )


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_becomes_a_valid_1024_rank_graph(schedule_graph, schedule: str) -> None:
    capture, graph = schedule_graph(schedule)
    # The value pass ran the first pipeline together; what stage 1 received from stage 0 (the
    # vote, then the pickled shapes) is what it received when captured alone.
    files = CaptureFiles(capture)
    rank, received = read_received_values(files.values(512))
    assert rank == 512 and any(r is not None for r in received[0])
    # A rank of another pipeline sends its activations to its own next stage, and as many
    # transfers go one way as come back the other.
    nodes = read_rank(graph, 777).to_pandas()  # stage 1 of pipeline dp=265
    sends = nodes[nodes[gf.KIND] == gf.NodeKind.SEND.value]
    recvs = nodes[nodes[gf.KIND] == gf.NodeKind.RECV.value]
    assert set(sends[gf.PEER]) == set(recvs[gf.PEER]) == {265}
    # Each stage's simulated iteration holds its captured one (the rank ran alone, its
    # neighbours answering at once) plus the pipeline's bubbles, which the slowest stage sets,
    # and not several times the slowest stage's own (one clean iteration each: 3 warm-up).
    manifest = read_manifest(capture)
    sim = simulate(load_sim_graph(graph), iterations=2)
    alone = {
        c.rank: np.median(clean_unprofiled(c.result.iteration_ns, manifest.job.warmup))
        for c in manifest.ranks
    }
    for captured in manifest.ranks:
        simulated = sim.iteration_ns[captured.rank]
        assert 0.7 * alone[captured.rank] < simulated < 3 * max(alone.values()), (captured.rank, alone)
        assert sim.peak_bytes[captured.rank] > captured.result.static_bytes > 0


@pytest.mark.parametrize(
    ("schedule", "why"),
    [
        # 4 microbatches of a schedule of two stages a rank are one round of its steady state, its
        # warm-up and cool-down around it: none repeats
        ("Interleaved1F1B", "forward passes run 2 modules and no 2 alike rounds"),
        ("ZBVZeroBubble", "forward passes run 2 modules and no 2 alike rounds"),
    ],
)
def test_schedules_whose_passes_do_not_repeat_are_not_built_at_another_microbatch_count(
    schedule_graph, schedule: str, why: str, tmp_path: Path
) -> None:
    capture, _ = schedule_graph(schedule)
    out = tmp_path / "g.parquet"
    result = runner.invoke(build_app, [str(capture), "--microbatches", "8", "-o", str(out)])
    assert result.exit_code == 2 and why in result.output, result.output
    assert not out.exists()


@pytest.mark.parametrize(
    ("schedule", "rank"), [("1F1B", 517), ("ZBVZeroBubble", 9), ("Interleaved1F1B", 521)]
)
def test_a_stage_replays_with_its_memory_and_the_values_its_neighbour_sends(
    schedule_graph, schedule: str, rank: int
) -> None:
    _, graph = schedule_graph(schedule)
    # Stage 1's shapes come from stage 0: the graph keeps what each stage received.
    assert set(read_metadata(graph).extra[gf.RECEIVED_VALUES_KEY]) == {"0", "1"}
    assert abs(replayed(graph, rank).mem_err_pct) < 0.1


def test_an_interleaved_schedule_at_8192_ranks_wraps_from_the_last_stage_to_the_first(tmp_path: Path) -> None:
    _, graph = capture_build_simulate(tmp_path, "Interleaved1F1B", pp=4, dp=2048)
    last_stage = read_rank(graph, 3 * 2048 + 5).to_pandas()  # holds stages 3 and 7 of 8
    sends = last_stage[last_stage[gf.KIND] == gf.NodeKind.SEND.value]
    assert 5 in set(sends[gf.PEER])  # stage 3 feeds stage 4, held by the first rank of its pipeline


def test_a_pipeline_of_another_length_than_pp_is_one_error(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    program = [str(PP), "--pp", "4", *TINY]  # four stages, captured as if there were two
    result = runner.invoke(
        capture_app,
        [
            "--tp",
            "1",
            "--pp",
            "2",
            "--dp",
            "2",
            "--warmup",
            "3",
            "--iterations",
            "2",
            "-o",
            str(out),
            "--",
            *program,
        ],
    )
    assert result.exit_code == 2
    assert "outside its pipeline in tp=1 pp=2 dp=2" in result.output
    assert "capture with the --pp (and --order) it builds" in result.output
    assert not out.exists()


def _capture_middles(tmp_path: Path, schedule: str) -> tuple[Path, list[str]]:
    layout = ["--tp", "1", "--pp", "6", "--dp", "192"]  # 1,152 ranks
    out = tmp_path / "cap"
    program = [str(PP), "--pp", "6", "--schedule", schedule, "--microbatches", "6", *TINY, "--batch", "6"]
    result = runner.invoke(
        capture_app,
        [
            *layout,
            "--roles",
            "first-middle-last",
            "--warmup",
            "3",
            "--iterations",
            "2",
            "-o",
            str(out),
            "--",
            *program,
        ],
    )
    assert result.exit_code == 0, result.output
    assert sorted(r.stage for r in read_manifest(out).ranks) == [0, 1, 4, 5]
    return out, layout


def test_first_middle_last_stands_middle_stages_in_for_the_rest_when_they_agree(tmp_path: Path) -> None:
    capture, layout = _capture_middles(tmp_path, "GPipe")
    graph = tmp_path / "graph.parquet"
    result = runner.invoke(build_app, [str(capture), *layout, "-o", str(graph)])
    assert result.exit_code == 0, result.output
    assert validate_graph(graph).ok
    # Stage 2 was not captured: its ranks run stage 1's calls, with their own pipeline neighbours.
    nodes = read_rank(graph, 2 * 192 + 7).to_pandas()
    assert (nodes[gf.SRC_RANK] == 192).all()
    sends = nodes[nodes[gf.KIND] == gf.NodeKind.SEND.value]
    assert set(sends[gf.PEER]) == {1 * 192 + 7, 3 * 192 + 7}  # gradients back, activations on


def test_middle_stages_that_made_other_calls_are_refused_with_the_first_difference(tmp_path: Path) -> None:
    capture, layout = _capture_middles(tmp_path, "1F1B")  # warm-up forwards differ by stage
    result = runner.invoke(build_app, [str(capture), *layout, "-o", str(tmp_path / "g.parquet")])
    assert result.exit_code == 2
    assert "ranks 192 and 768 both stand for every middle stage" in result.output
    assert "differ at call" in result.output and "--roles pipeline" in result.output
