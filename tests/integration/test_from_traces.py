"""``prism-build-graph --from-traces``: graphs of public GPU traces recorded on real hardware
(tests/data/gpu_traces), simulated as they are, reproduce each traced rank's ProfilerStep."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from prism.graph.build.cli import app
from prism.graph.io.parquet import read_metadata, read_rank
from prism.graph.io.validate import validate_graph
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import simulate
from prism.graph.traces.gpu import EdgeKind, dependencies, read_gpu_trace
from prism.graph.traces.gpu_timeline import simulate_timeline, step_times
from prism.schemas import graph_format as gf

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu_traces"
runner = CliRunner()

# name -> (trace files, world size, traced ranks)
TRACES = {
    "event_sync": (["event_sync.json.gz"], 1, [0]),
    "nccl_ddp": (["nccl_ddp_rank0.json.gz"], 2, [0]),
    "sampled": (["sampled_rank0.json.gz", "sampled_rank1.json.gz"], 128, [0, 1]),
    "h200_mlp": (["h200_mlp.json.gz"], 1, [0]),
    "h200_mlp_wide": (["h200_mlp_wide.json.gz"], 1, [0]),
    "amd_mi250_rocm": (["amd_mi250_rocm.json.gz"], 1, [0]),
    "a100_rank3_of_8": (["a100_rank3_of_8.json.gz"], 8, [3]),
    "gpu_behind_cpu_a100": (["a100_rank0_of_16.json.gz"], 16, [0]),
    "gpu_behind_cpu_v100": (["v100_epoch_times.json.gz"], 1, [0]),
    "legacy_format_v100": (["v100_resnet50_legacy.json.gz"], 1, [0]),
    "triton_a100": (["a100_triton.json.gz"], 1, [0]),
    "v100_rank1_of_2": (["v100_rank1_of_2.json.gz"], 2, [1]),
    "compare_excerpt": (["excerpts/compare_base.json.gz"], 1, [0]),
}


def _directory(tmp_path: Path, files: list[str]) -> Path:
    directory = tmp_path / "traces"
    directory.mkdir()
    for name in files:
        shutil.copy(DATA / name, directory / Path(name).name)
    return directory


@pytest.mark.parametrize("name", TRACES)
def test_a_graph_from_traces_reproduces_each_traced_step(tmp_path: Path, name: str) -> None:
    files, world, traced = TRACES[name]
    out = tmp_path / "graph.parquet"
    done = runner.invoke(app, ["--from-traces", str(_directory(tmp_path, files)), "-o", str(out)])
    assert done.exit_code == 0, done.output
    metadata = read_metadata(out)
    assert metadata.layout["dp"] == world and metadata.version == gf.VERSION
    recorded = {int(r): ns for r, ns in metadata.extra[gf.RECORDED_STEP_KEY].items()}
    assert sorted(recorded) == traced
    summary = json.loads((tmp_path / "summary.json").read_text())
    iteration = summary["ranks"]["iteration_ns"]
    assert len(iteration) == world
    for rank, ns in recorded.items():  # the step as the trace recorded it, within 1 %
        assert iteration[rank] == pytest.approx(ns, rel=0.01)
    # A rank without a trace took the rows of the traced rank below it: it runs the same step.
    filled = {int(r): p for r, p in metadata.extra["filled_from"].items()}
    assert sorted(filled) == [r for r in range(world) if r not in traced]
    for rank, source in filled.items():
        assert iteration[rank] == pytest.approx(recorded[source], rel=0.01)


@pytest.mark.parametrize("name", ["event_sync", "nccl_ddp", "h200_mlp"])
def test_the_gpu_streams_and_their_dependencies_are_the_traces(tmp_path: Path, name: str) -> None:
    (file,), world, _ = TRACES[name]
    out = tmp_path / "graph.parquet"
    done = runner.invoke(
        app, ["--from-traces", str(_directory(tmp_path, [file])), "-o", str(out), "--no-simulate"]
    )
    assert done.exit_code == 0, done.output
    trace = read_gpu_trace(DATA / file)
    metadata = read_metadata(out)
    step = metadata.build_options["step"]
    span = trace.steps[trace.steps["step"] == step].iloc[0]
    streams = metadata.extra[gf.STREAMS_KEY]
    assert streams[0] == "main thread"
    # The step: the runtime calls it made on any thread, and the GPU work they launched.
    edges = dependencies(trace)
    ev = trace.events
    calls = (
        (ev["kind"] == "runtime") & (ev["start_ns"] >= span["start_ns"]) & (ev["start_ns"] < span["end_ns"])
    )
    launch = edges[edges["kind"] == EdgeKind.LAUNCH.value]
    launched = launch["dst"][calls.to_numpy()[launch["src"]]]
    in_step = set(np.flatnonzero(calls.to_numpy())) | set(launched)
    rows = read_rank(out, 0, columns=[gf.STREAM, gf.LANE_DEPS, gf.KIND]).to_pydict()
    used = {streams[s] for s in rows[gf.STREAM]}
    assert {s for s in used if s.startswith("cuda")} == {
        f"cuda stream {s}" for s in ev.loc[launched, "stream"]
    }
    # Every launch, stream wait and synchronization among them is one lane dependency, and each
    # NCCL kernel of a collective one collective node.
    kinds = [EdgeKind.LAUNCH.value, EdgeKind.STREAM_WAIT.value, EdgeKind.SYNC.value]
    expected = edges[edges["kind"].isin(kinds) & edges["src"].isin(in_step) & edges["dst"].isin(in_step)]
    assert sum(len(d) for d in rows[gf.LANE_DEPS]) == len(expected)
    nccl = edges[(edges["kind"] == EdgeKind.COMM.value) & edges["dst"].isin(in_step)]
    assert sum(k == gf.NodeKind.COLLECTIVE.value for k in rows[gf.KIND]) == len(nccl)
    assert len(nccl) > 0 or world == 1  # a one-GPU job has no collective
    # The GPU work of the step ends where the trace's own timeline puts it (within 1 %).
    graph = load_sim_graph(out)
    result = simulate(graph, iterations=1)
    gpu_lanes = [
        lane for lane in range(graph.lanes)
        if graph.lane_rank[lane] == 0 and streams[graph_stream(out, graph, lane)].startswith("cuda")
    ]  # fmt: skip
    gpu_end = max(result.end_ns[graph.rank_ptr[lane] : graph.rank_ptr[lane + 1]].max() for lane in gpu_lanes)
    steps = step_times(trace, simulate_timeline(trace)).set_index("step")
    assert gpu_end / 1e6 == pytest.approx(steps.at[step, "gpu_recorded_ms"], rel=0.01)


def graph_stream(path: Path, graph, lane: int) -> int:
    """The stream number of a lane of rank 0."""
    streams = read_rank(path, 0, columns=[gf.STREAM])[gf.STREAM].to_numpy()
    return int(streams[graph.rank_ptr[lane] - graph.rank_ptr[0]])


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--from-traces", "{empty}"], "no trace files"),
        (["{capture}", "--from-traces", "{traces}"], "not both"),
        (["--from-traces", "{traces}", "--dp", "4"], "takes the layout from the traces"),
        (["--from-traces", "{traces}", "--step", "99"], "has no ProfilerStep#99"),
        (["--from-traces", "{traces}", "--step", "1", "--whole-trace"], "not both"),
        (["--from-traces", "{stepless}"], "--whole-trace"),
        (["{capture}"], "is not a complete capture: manifest.json is missing"),
        ([], "give a capture directory"),
    ],
)
def test_bad_requests_are_one_error_line(tmp_path: Path, argv: list[str], needle: str) -> None:
    (tmp_path / "empty").mkdir()
    traces = _directory(tmp_path, ["event_sync.json.gz"])
    stepless = tmp_path / "stepless"
    stepless.mkdir()
    shutil.copy(DATA / "alexnet.json.gz", stepless)
    names = {
        "empty": tmp_path / "empty",
        "traces": traces,
        "capture": tmp_path / "empty",
        "stepless": stepless,
    }
    done = runner.invoke(app, [a.format(**names) for a in argv] + ["-o", str(tmp_path / "g.parquet")])
    assert done.exit_code == 2
    lines = [line for line in done.output.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and needle in done.output, done.output
    assert not (tmp_path / "g.parquet").exists()


@pytest.mark.parametrize(
    "name",
    ["alexnet.json.gz", "event_sync_multi_stream.json.gz", "a100_simple_add.json.gz",
     "a100_simple_add_et_run.json.gz", "inference_rank1_legacy.json.gz"],
)  # fmt: skip
def test_a_trace_without_profiler_steps_is_built_whole_with_whole_trace(tmp_path: Path, name: str) -> None:
    """HTA's traces recorded without a schedule (AlexNet, three streams, a simple add and its
    Execution Trace run, a 2021-format inference rank): with --whole-trace each trace's window is
    the step, and the graph reproduces it."""
    out = tmp_path / "graph.parquet"
    done = runner.invoke(
        app, ["--from-traces", str(_directory(tmp_path, [name])), "--whole-trace", "-o", str(out)]
    )
    assert done.exit_code == 0, done.output
    assert "whole windows" in done.output
    trace = read_gpu_trace(DATA / name)
    cpu = trace.events[trace.events["tid"] >= 0]
    window = int(trace.events["end_ns"].max() - cpu["start_ns"].min())
    recorded = read_metadata(out).extra[gf.RECORDED_STEP_KEY]["0"]
    assert recorded == window
    iteration = json.loads((tmp_path / "summary.json").read_text())["ranks"]["iteration_ns"][0]
    assert iteration == pytest.approx(window, rel=0.01)


def _regrouped(tmp_path: Path, world: int, groups: list[list[int]]) -> Path:
    """The public DDP trace as rank 0 of a world of ``world``, its collectives in turn on each of
    ``groups`` (what a job of tensor- and data-parallel groups records)."""
    data = json.loads(gzip.decompress((DATA / "nccl_ddp_rank0.json.gz").read_bytes()))
    data["distributedInfo"]["world_size"] = world
    comms = [e for e in data["traceEvents"] if e.get("name") == "record_param_comms"]
    for i, event in enumerate(e for e in comms if e["args"].get("Process Group Ranks") not in (None, "[]")):
        group = groups[i % len(groups)]
        event["args"]["Process Group Ranks"] = str(group)
        event["args"]["Group size"] = len(group)
    directory = tmp_path / "traces"
    directory.mkdir()
    (directory / "rank0.json.gz").write_bytes(gzip.compress(json.dumps(data).encode()))
    return directory


def test_collectives_on_tensor_and_data_parallel_groups_give_their_layout(tmp_path: Path) -> None:
    # Rank 0 of a tp=2 dp=2 job: its collectives alternate between its tp group {0, 1} and its
    # dp group {0, 2}. The other ranks take its rows, each collective on their own group.
    out = tmp_path / "graph.parquet"
    done = runner.invoke(
        app, ["--from-traces", str(_regrouped(tmp_path, 4, [[0, 1], [0, 2]])), "-o", str(out)]
    )
    assert done.exit_code == 0, done.output
    metadata = read_metadata(out)
    assert (metadata.layout["tp"], metadata.layout["dp"], metadata.layout["pp"]) == (2, 2, 1)
    coll = {}
    for rank in range(4):
        rows = read_rank(out, rank, columns=[gf.COLL_ID, gf.GROUP_KIND, gf.GROUP_INDEX, gf.GROUP_SIZE])
        rows = rows.filter(pc.greater_equal(rows[gf.COLL_ID], 0)).to_pydict()
        assert set(rows[gf.GROUP_KIND]) == {"tp", "dp"} and set(rows[gf.GROUP_SIZE]) == {2}
        coll[rank] = {
            k: [c for c, g in zip(rows[gf.COLL_ID], rows[gf.GROUP_KIND], strict=True) if g == k]
            for k in ("tp", "dp")
        }
        index = {g: i for g, i in zip(rows[gf.GROUP_KIND], rows[gf.GROUP_INDEX], strict=True)}
        assert index == {"tp": rank // 2, "dp": rank % 2}  # tp groups {0,1} {2,3}; dp groups {0,2} {1,3}
    # Members of one group share its instances; other groups' instances are their own.
    assert coll[0]["tp"] == coll[1]["tp"] and coll[2]["tp"] == coll[3]["tp"] != coll[0]["tp"]
    assert coll[0]["dp"] == coll[2]["dp"] and coll[1]["dp"] == coll[3]["dp"] != coll[0]["dp"]
    # Every rank's step is the trace's, within 1 %, and the graph is a valid one.
    recorded = metadata.extra[gf.RECORDED_STEP_KEY]["0"]
    iteration = json.loads((tmp_path / "summary.json").read_text())["ranks"]["iteration_ns"]
    assert iteration == pytest.approx([recorded] * 4, rel=0.01)
    assert validate_graph(out).ok


def test_collectives_on_groups_no_layout_has_are_refused(tmp_path: Path) -> None:
    traces = _regrouped(tmp_path, 4, [[0, 1], [0, 3]])
    done = runner.invoke(app, ["--from-traces", str(traces), "-o", str(tmp_path / "g.parquet")])
    assert done.exit_code == 2
    assert "collectives over ranks [0, 3] fit no layout of 4 ranks" in done.output, done.output
    assert not (tmp_path / "g.parquet").exists()


def test_given_delays_place_the_gpu_work_instead_of_those_fitted_on_the_trace(tmp_path: Path) -> None:
    """A graph judged on its own trace must be able to take delays fitted elsewhere."""
    from prism.graph.build.from_traces import build_from_traces
    from prism.graph.sim.predict import predict
    from prism.graph.traces.gpu_timeline import LaunchModel

    directory = _directory(tmp_path, ["event_sync.json.gz"])
    fitted = build_from_traces(directory, tmp_path / "fitted.parquet")
    assert read_metadata(tmp_path / "fitted.parquet").extra["launch_model_fitted"] is True
    slow = LaunchModel(
        launch_ns=fitted.traced[0].model.launch_ns + 200_000, stream_ns=fitted.traced[0].model.stream_ns
    )
    given = build_from_traces(directory, tmp_path / "given.parquet", delays=slow)
    metadata = read_metadata(tmp_path / "given.parquet")
    assert given.traced[0].model == slow and metadata.extra["launch_model_fitted"] is False
    assert metadata.extra["launch_model"]["0"] == {"launch_ns": slow.launch_ns, "stream_ns": slow.stream_ns}
    # Its syncs wait on GPU work each launched 0.2 ms later: the step comes out longer.
    before, after = (predict(tmp_path / f"{n}.parquet").ranks["iteration_ns"][0] for n in ("fitted", "given"))
    assert after > before + 200_000


def test_ranks_that_began_their_step_out_of_step_settle_to_the_jobs_period(tmp_path: Path) -> None:
    """PARAM's 8-rank DLRM job: its ranks began the traced step up to 7.5 ms apart and ended it
    within 1 ms, held together by their collectives. The simulation runs passes until their
    periods repeat, and every rank keeps the job's one period: the step of the rank that began
    first (rank 1), which a two-pass simulation had not reached."""
    from prism.graph.build.from_traces import build_from_traces
    from prism.graph.sim.load import load_sim_graph
    from prism.graph.sim.simulate import simulate

    built = build_from_traces(
        _directory(tmp_path, [f"dlrm_rank{r}.json.gz" for r in range(8)]), tmp_path / "g.parquet"
    )
    recorded = {r: t.recorded_ns for r, t in built.traced.items()}
    assert sorted(recorded) == list(range(8)) and max(recorded, key=recorded.get) == 1
    periods = simulate(load_sim_graph(tmp_path / "g.parquet")).iteration_ns
    assert list(periods) == [periods[0]] * 8
    assert periods[0] == pytest.approx(recorded[1], rel=0.01)
