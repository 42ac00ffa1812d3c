"""prism-build-graph on a capture of the user's own program: the graph from its traces alone."""

from __future__ import annotations

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
from prism.peers.comm_model import CommModel
from prism.schemas import graph_format as gf
from prism.schemas.cluster import ClusterSpec, preset
from prism.schemas.comm_log import read_comm_log
from prism.schemas.graph_format import POST_NAME
from prism.schemas.iterations import clean_unprofiled
from prism.schemas.manifest import CaptureFiles, read_manifest

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
TINY = ("--steps", "50", "--hidden", "32", "--layers", "2", "--vocab", "64", "--batch", "2", "--seq", "8")


def _capture(out: Path, layout: tuple[int, int, int], *program: str, options: tuple[str, ...] = ()) -> Path:
    tp, pp, dp = layout
    args = ["--tp", str(tp), "--pp", str(pp), "--dp", str(dp), "--warmup", "4", "--iterations", "2", *options]
    result = runner.invoke(capture_app, [*args, "-o", str(out), "--", *program])
    assert result.exit_code == 0, result.output
    return out


def _build(capture: Path, out: Path, layout: tuple[int, int, int], *options: str):
    tp, pp, dp = layout
    return runner.invoke(
        build_app, [str(capture), "--tp", str(tp), "--pp", str(pp), "--dp", str(dp), "-o", str(out), *options]
    )


@pytest.fixture(scope="module")
def ddp_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp") / "cap"
    return _capture(out, (1, 1, 1024), str(ROOT / "examples" / "ddp.py"), *TINY)


@pytest.mark.slow
def test_a_ddp_program_becomes_a_valid_1024_rank_graph_that_simulates(
    ddp_capture: Path, tmp_path: Path
) -> None:
    graph = tmp_path / "graph.parquet"
    result = _build(ddp_capture, graph, (1, 1, 1024))
    assert result.exit_code == 0, result.output
    assert validate_graph(graph).ok
    meta = read_metadata(graph)
    assert meta.version == gf.VERSION and gf.PROGRAM_KEY in meta.model
    # Every rank runs rank 0's captured iteration; DDP's bucket all-reduce spans all 1024 ranks
    # and is waited for by a wait node that depends on it.
    nodes = read_rank(graph, 777).to_pandas()
    reduce = nodes.index[nodes[gf.NAME] == "all_reduce"]
    assert len(reduce) >= 1 and (nodes.loc[reduce, gf.GROUP_SIZE] == 1024).all()
    waits = nodes[nodes[gf.NAME] == "prism:wait"]
    assert sorted(d for deps in waits[gf.DEPS] for d in deps) == sorted(reduce.tolist())
    # The simulated iteration is the captured rank's own unprofiled one, plus what the job adds.
    manifest = read_manifest(ddp_capture)
    (rank,) = manifest.ranks
    unprofiled = np.median(clean_unprofiled(rank.result.iteration_ns, manifest.job.warmup))
    sim = simulate(load_sim_graph(graph), iterations=2)
    assert 0.5 * unprofiled < sim.iteration_ns[0] < 2 * unprofiled
    # Peak memory: the tensors held when the profiled iterations began, plus the iteration's peak.
    assert sim.peak_bytes[0] > rank.result.static_bytes > 0
    # The rank's own time is the timer's unprofiled one, phase by phase (the posts of its
    # bucket all-reduces, which the timer leaves to the calls, come on top).
    clean = clean_unprofiled(rank.result.phase_ns, manifest.job.warmup)
    timed = sum(np.median([p.get(kind, 0) for p in clean]) for kind in {k for p in clean for k in p})
    own = nodes[(nodes[gf.KIND] == gf.NodeKind.COMPUTE.value) & (nodes[gf.NAME] != POST_NAME)]
    assert own[gf.DUR_NS].sum() + nodes[gf.GAP_NS].sum() == pytest.approx(timed, rel=1e-3)


def test_a_programs_graph_keeps_its_captured_tensor_parallel_degree(
    ddp_capture: Path, tmp_path: Path
) -> None:
    result = _build(ddp_capture, tmp_path / "g.parquet", (2, 1, 1024))
    assert result.exit_code == 2
    assert (
        "keeps its captured tp, cp, ep and etp" in result.output and "build without --tp 2" in result.output
    )
    assert not (tmp_path / "g.parquet").exists()


def test_the_hold_of_ddps_last_bucket_is_the_graphs_wait_not_the_programs_time(tmp_path: Path) -> None:
    # A held capture blocks DDP's reducer, which waits on its buckets from C++ as backward()
    # ends, for the all-reduce's price. That block is the call's wait, which the graph charges
    # itself: it must not stay in the program's own time as well.
    spec = ClusterSpec.from_dict(preset("h100-ib").to_dict() | {"intra_latency_s": 0.01})
    spec_file = spec.save(tmp_path / "spec.toml")
    capture = _capture(
        tmp_path / "cap",
        (1, 1, 2),
        str(ROOT / "examples" / "ddp.py"),
        *TINY,
        options=("--hold-calls", str(spec_file)),
    )
    manifest = read_manifest(capture)
    reduces = [c for c in read_comm_log(CaptureFiles(capture).comm(0)).calls if c.op == "all_reduce"]
    price = CommModel(spec).duration_ns("all_reduce", reduces[-1].bytes, 2, 1)
    assert price > 15_000_000
    # The capture noted where the program blocked, and took the block out of its own time.
    steady = reduces[len(reduces) // 2 :]
    assert all(c.first_wait_ns == c.wait_ns > 0 and c.done_ns - c.wait_ns > price // 2 for c in steady)
    (rank,) = manifest.ranks
    assert min(rank.result.held_ns[1:]) > price // 2
    graph = tmp_path / "g.parquet"
    result = _build(capture, graph, (1, 1, 2), "--cluster", str(spec_file))
    assert result.exit_code == 0, result.output
    nodes = read_rank(graph, 0).to_pandas()
    last = nodes.index[nodes[gf.NAME] == "all_reduce"][-1]
    waits = nodes.index[nodes[gf.NAME] == "prism:wait"]
    assert any(last in nodes.at[w, gf.DEPS] for w in waits)
    after = nodes.loc[last + 1 :]
    after = after[after[gf.PHASE] == "bwd"]
    assert after[gf.DUR_NS].sum() + after[gf.GAP_NS].sum() < price // 2


SUBGROUP_PROGRAM = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
eights, _ = dist.new_subgroups(group_size=8)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(50):
    model(torch.ones(2, 4)).sum().backward()
    dist.all_reduce(model.weight.grad, group=eights)
    optimizer.step()
"""


def test_a_group_the_layout_does_not_have_stops_the_capture_in_one_error_line(tmp_path: Path) -> None:
    script = tmp_path / "eights.py"
    script.write_text(SUBGROUP_PROGRAM)
    args = ["--tp", "1", "--pp", "1", "--dp", "1024", "--warmup", "4", "--iterations", "2"]
    result = runner.invoke(capture_app, [*args, "-o", str(tmp_path / "cap"), "--", str(script)])
    assert result.exit_code == 2
    (line,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "group of ranks [0, 1, 2, 3, 4, 5, 6, 7] (8 ranks), which is no group of tp=1 pp=1 dp=1024" in line
    # Groups of 8 in a row: HSDP's shards (one degree changed), or tensor parallel.
    assert (
        "would match: --tp 1 --pp 1 --dp 1024 --dp-replicate 128 --order tp-dp-pp (its dp_shard group) "
        "or --tp 8 --pp 1 --dp 128 --order tp-dp-pp (its tp group)"
        in line
        and "eights.py:4" in line
    )
    assert not (tmp_path / "cap").exists()
