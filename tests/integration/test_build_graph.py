"""Capture → graph → validate, against a real full run, and prism-build-graph's handling of bad input."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from prism.capture.runner import CaptureOptions, RealMode, run_capture
from prism.capture.workloads.gpt.config import GPTConfig
from prism.graph.build.builder import BuildError, BuildOptions, build_graph
from prism.graph.build.cli import app
from prism.graph.build.profiler_overhead import Correction
from prism.graph.io.parquet import read_metadata, read_rank
from prism.graph.io.validate import validate_graph
from prism.graph.sim.noise import expected_max_normal
from prism.schemas import graph_format as gf
from prism.schemas.annotations import GLUE
from prism.schemas.cluster import preset
from prism.schemas.comm_log import read_comm_log
from prism.schemas.manifest import CaptureFiles, read_manifest

pytestmark = pytest.mark.slow

SMALL = GPTConfig(
    layers=4, hidden=64, heads=4, seq_len=32, vocab=256, microbatches=4, tp=2, pp=2, dp=2, grad_bucket_mb=0.1
)
H100 = preset("h100-ib")


@pytest.fixture(scope="module")
def full_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every rank of tp=2 pp=2 dp=2 run for real: the ground truth for comm sequences."""
    out = tmp_path_factory.mktemp("full") / "capture"
    run_capture(CaptureOptions(config=SMALL, out_dir=out, real=RealMode.ALL, warmup=1, iterations=1))
    return out


@pytest.fixture(scope="module")
def slice_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("slice") / "capture"
    config = replace(SMALL, pp=4, layers=8, microbatches=8)
    run_capture(CaptureOptions(config=config, out_dir=out, warmup=5, iterations=2))
    return out


def build(capture: Path, out: Path, profiler_correction: Correction = Correction.PHASE, **target) -> Path:
    layout = {"tp": 2, "pp": 2, "dp": 2} | target
    build_graph(
        BuildOptions(
            capture_dir=capture, out=out, cluster=H100, profiler_correction=profiler_correction, **layout
        )
    )
    return out


def comm_signature(calls) -> list[tuple]:
    return [(c.op, c.label.split(".")[0], c.bytes) for c in calls]


def test_graph_of_a_full_run_holds_the_calls_the_real_run_made(full_capture: Path, tmp_path: Path) -> None:
    graph = build(full_capture, tmp_path / "g.parquet", Correction.NONE)  # one warm-up iteration: none clean
    files = CaptureFiles(full_capture)
    for rank in range(SMALL.layout.world_size):
        logged = read_comm_log(files.comm(rank)).calls
        per_iteration = len(logged) // 2  # one warm-up + one profiled iteration
        real = [
            (op, "pp" if op in ("send", "recv") else axis, n)
            for op, axis, n in comm_signature(logged[-per_iteration:])
        ]
        nodes = read_rank(graph, rank).to_pandas()
        comm = nodes[nodes[gf.KIND] != gf.NodeKind.COMPUTE.value]
        built = list(zip(comm[gf.NAME], comm[gf.GROUP_KIND], comm[gf.BYTES], strict=True))
        assert built == real, f"rank {rank}"
        peers = comm.loc[comm[gf.PEER] >= 0, gf.PEER].tolist()
        assert peers == [c.peer for c in logged[-per_iteration:] if c.peer is not None]


def test_slice_extrapolates_to_other_pp_dp_and_microbatches(slice_capture: Path, tmp_path: Path) -> None:
    graph = build(slice_capture, tmp_path / "g.parquet", pp=8, dp=4, microbatches=16)
    meta = read_metadata(graph)
    assert meta.layout["pp"] == 8 and meta.model["microbatches"] == 16 and meta.model["layers"] == 8
    last = read_rank(graph, 2 * 4 * 7).to_pandas()  # tp0 dp0 of the last stage
    fwd_blocks = last[(last[gf.PHASE] == "fwd") & (last[gf.LAYER] == 7)][gf.MB].unique()
    assert sorted(fwd_blocks) == list(range(16))
    assert (last[gf.STAGE] == 7).all() and (last[gf.SRC_RANK] == 2 * 2 * 3).all()


def test_same_inputs_give_the_same_file(slice_capture: Path, tmp_path: Path) -> None:
    a = build(slice_capture, tmp_path / "a.parquet", pp=4)
    b = build(slice_capture, tmp_path / "b.parquet", pp=4)
    assert a.read_bytes() == b.read_bytes()


def test_durations_come_from_the_capture_and_the_comm_model(slice_capture: Path, tmp_path: Path) -> None:
    graph = build(slice_capture, tmp_path / "g.parquet", pp=4)
    nodes = read_rank(graph, 0).to_pandas()
    compute = nodes[nodes[gf.KIND] == gf.NodeKind.COMPUTE.value]
    assert (compute[gf.DUR_NS] >= 0).all() and compute[gf.DUR_NS].sum() > 0
    dp = nodes[nodes[gf.GROUP_KIND] == "dp"]
    assert len(dp) > 0 and (dp[gf.DUR_NS] > 0).all()
    assert np.all(np.diff(dp[gf.BYTES].to_numpy()) <= dp[gf.BYTES].max())


def rank0(capture: Path, out: Path, correction: Correction) -> tuple[pd.DataFrame, dict | None]:
    """Rank 0's nodes of the pp=4 graph built with ``correction``, and the graph's time scales."""
    graph = build(capture, out, correction, pp=4)
    return read_rank(graph, 0).to_pandas(), read_metadata(graph).extra["time_scale"]


def test_profiler_correction_scales_compute_to_the_unprofiled_iterations(
    slice_capture: Path, tmp_path: Path
) -> None:
    manifest = read_manifest(slice_capture)
    as_measured, none = rank0(slice_capture, tmp_path / "raw.parquet", Correction.NONE)
    corrected, scales = rank0(slice_capture, tmp_path / "g.parquet", Correction.ROLE)
    assert none is None and set(scales) == {r.role.value for r in manifest.ranks}
    first = scales["first"]
    assert first["phase_factors"] == {}
    result = next(r.result for r in manifest.ranks if r.rank == first["rank"])
    clean = result.iteration_ns[1 : manifest.job.warmup - 1]
    expected = np.median(clean) / np.median(result.iteration_ns[manifest.job.warmup :])
    assert first["factor"] == pytest.approx(expected, abs=1e-6)  # stored rounded to 6 places
    compute = as_measured[gf.KIND] == gf.NodeKind.COMPUTE.value
    ratio = corrected.loc[compute, gf.DUR_NS].sum() / as_measured.loc[compute, gf.DUR_NS].sum()
    assert ratio == pytest.approx(first["factor"], rel=1e-3)
    comm = as_measured[gf.KIND] == gf.NodeKind.COLLECTIVE.value
    assert (corrected.loc[comm, gf.DUR_NS] == as_measured.loc[comm, gf.DUR_NS]).all()


def test_profiler_correction_by_phase_predicts_each_phase_as_it_ran_unprofiled(
    slice_capture: Path, tmp_path: Path
) -> None:
    manifest = read_manifest(slice_capture)
    as_measured, _ = rank0(slice_capture, tmp_path / "raw.parquet", Correction.NONE)
    corrected, scales = rank0(slice_capture, tmp_path / "g.parquet", Correction.PHASE)
    first = scales["first"]
    factors = first["phase_factors"]
    assert {"fwd", "bwd", "optim", GLUE} <= set(factors)
    for phase in ("fwd", "bwd", "optim"):
        on = (as_measured[gf.KIND] == gf.NodeKind.COMPUTE.value) & (as_measured[gf.PHASE] == phase)
        ratio = corrected.loc[on, gf.DUR_NS].sum() / as_measured.loc[on, gf.DUR_NS].sum()
        assert ratio == pytest.approx(factors[phase], rel=0.01), phase
    # The graph's step is the captured rank's unprofiled one: its factor is taken against what
    # the template holds of it, so the scaled template lands on the timer's unprofiled median.
    result = next(r.result for r in manifest.ranks if r.rank == first["rank"])
    unprofiled_ms = np.median([p["optim"] for p in result.phase_ns[1 : manifest.job.warmup - 1]]) / 1e6
    optim = corrected[corrected[gf.PHASE] == "optim"]
    graph_ms = (optim[gf.DUR_NS].sum() + optim[gf.GAP_NS].sum()) / 1e6  # the graph holds one iteration
    assert graph_ms == pytest.approx(unprofiled_ms, rel=1e-3)
    # The glue outside every block (zeroing gradients, the loss read back, some of it outside
    # the trace's iteration mark) is the timer's unprofiled median of it, exactly.
    glue_ms = np.median([p[GLUE] for p in result.phase_ns[1 : manifest.job.warmup - 1]]) / 1e6
    outside = corrected[corrected[gf.PHASE] == "iter"]
    compute = outside[gf.KIND] == gf.NodeKind.COMPUTE.value
    graph_glue_ms = (outside.loc[compute, gf.DUR_NS].sum() + outside[gf.GAP_NS].sum()) / 1e6
    assert graph_glue_ms == pytest.approx(glue_ms, rel=1e-3)


def test_collectives_wait_for_the_captured_ranks_per_call_noise(slice_capture: Path, tmp_path: Path) -> None:
    manifest = read_manifest(slice_capture)
    graph = build(slice_capture, tmp_path / "g.parquet", pp=4)
    scales = read_metadata(graph).extra["time_scale"]
    # Each captured rank's calls come a little early or late every iteration (a real capture:
    # never exactly on time), measured from its comm log's clean unprofiled iterations.
    assert manifest.job.warmup >= 5 and all(s["call_jitter_ns"] > 0 for s in scales.values())
    nodes = read_rank(graph, 0).to_pandas()
    tp = nodes[(nodes[gf.GROUP_KIND] == "tp") & (nodes[gf.KIND] == gf.NodeKind.COLLECTIVE.value)]
    # The skew is at least what the jitter alone gives two members: e_2 * jitter.
    jitter = scales[next(r.role.value for r in manifest.ranks if r.rank == 0)]["call_jitter_ns"]
    assert len(tp) > 0 and (tp[gf.SKEW_NS] >= np.floor(expected_max_normal(2) * jitter) - 1).all()


def test_the_build_says_how_much_of_each_roles_profiled_iteration_its_correction_takes_out(
    slice_capture: Path, tmp_path: Path
) -> None:
    out = tmp_path / "g.parquet"
    args = [str(slice_capture), "--tp", "2", "--pp", "4", "--dp", "2", "-o", str(out)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    scales = read_metadata(out).extra["time_scale"]
    for scale in scales.values():
        taken = scale["profiled_ms"] - scale["unprofiled_ms"]
        assert f"{taken:.1f} of a profiled {scale['profiled_ms']:.1f} ms own iteration" in text
        # and the noise every collective's skew grows with, with what it rests on
        assert f"{100 * scale['noise_cv']:.1f} % from {scale['clean_iterations']} iterations" in text
    # 5 warm-up iterations leave 3 clean ones: too few for a steady noise estimate, and it says so.
    assert all(s["clean_iterations"] == 3 for s in scales.values())
    assert "warning: the arrival noise of rank(s)" in text and "--warmup 10 or more" in text


# -- bad input: one error line, exit 2, nothing written ----------------------------------------


def run_cli(*args: str):
    return CliRunner().invoke(app, list(args))


def assert_refused(result, needle: str, out: Path) -> None:
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], result.output
    assert not out.exists()


def test_missing_capture_directory(tmp_path: Path) -> None:
    out = tmp_path / "g.parquet"
    assert_refused(
        run_cli(str(tmp_path / "nope"), "--tp", "2", "--pp", "2", "--dp", "2", "-o", str(out)),
        "manifest.json is missing",
        out,
    )


def test_a_graph_too_large_for_the_machine_is_refused_before_anything_is_written(
    slice_capture: Path, tmp_path: Path
) -> None:
    out = tmp_path / "g.parquet"
    # 80 M ranks: terabytes of graph, on any machine.
    result = run_cli(str(slice_capture), "--tp", "2", "--pp", "4", "--dp", "10000000", "-o", str(out))
    assert_refused(result, "GiB of memory", out)
    assert list(tmp_path.iterdir()) == []


def test_an_output_directory_that_is_not_a_graph_is_refused_and_kept(
    slice_capture: Path, tmp_path: Path
) -> None:
    out = tmp_path / "results"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    result = run_cli(str(slice_capture), "--tp", "2", "--pp", "4", "--dp", "2", "-o", str(out))
    assert result.exit_code == 2 and "is a directory that is not a prism graph" in result.output
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_a_graph_of_part_files_replaces_a_graph_file(slice_capture: Path, tmp_path: Path) -> None:
    out = tmp_path / "g.parquet"
    args = [str(slice_capture), "--tp", "2", "--pp", "4", "--dp", "2", "-o", str(out), "--no-simulate"]
    assert run_cli(*args).exit_code == 0 and out.is_file()
    # one rank a row group: 16 row groups, over a file's 512 once dp is 128
    result = run_cli(*args[:5], "--dp", "128", *args[7:], "--ranks-per-row-group", "1")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "ranks-0000000-0000511.parquet",
        "ranks-0000512-0001023.parquet",
    ]
    assert validate_graph(out).ok and read_metadata(out).layout["dp"] == 128
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.parquet"]  # nothing staged left beside it


def test_tp_must_match_the_capture(slice_capture: Path, tmp_path: Path) -> None:
    out = tmp_path / "g.parquet"
    assert_refused(
        run_cli(str(slice_capture), "--tp", "4", "--pp", "4", "--dp", "2", "-o", str(out)),
        "re-capture with --tp 4",
        out,
    )


def test_layers_must_split_over_stages(slice_capture: Path, tmp_path: Path) -> None:
    out = tmp_path / "g.parquet"
    result = run_cli(str(slice_capture), "--tp", "2", "--pp", "3", "--dp", "2", "-o", str(out))
    assert_refused(result, "layers (8) must be divisible by pp (3)", out)


def test_role_missing_from_the_capture(full_capture: Path, tmp_path: Path) -> None:
    out = tmp_path / "g.parquet"
    result = run_cli(
        str(full_capture), "--tp", "2", "--pp", "4", "--dp", "2", "--layers", "8", "-o", str(out),
        "--profiler-correction", "none",
    )  # fmt: skip
    assert_refused(result, "needs a 'middle' pipeline stage", out)


def test_a_graph_into_missing_folders_gets_them(slice_capture: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs" / "today" / "graph.parquet"
    result = run_cli(
        str(slice_capture), "--tp", "2", "--pp", "4", "--dp", "2", "--no-simulate", "-o", str(out)
    )
    assert result.exit_code == 0, result.output
    assert validate_graph(out).ok


def test_a_correction_without_a_clean_iteration_is_refused(full_capture: Path, tmp_path: Path) -> None:
    # One warm-up iteration: the profiler's cost cannot be taken out, so the graph would be of
    # profiled iterations; say so and what to do rather than predict them.
    out = tmp_path / "g.parquet"
    result = run_cli(str(full_capture), "--tp", "2", "--pp", "2", "--dp", "2", "-o", str(out))
    assert_refused(result, "--warmup 10 (at least 3), or build with --profiler-correction none", out)


def test_unknown_manifest_version(slice_capture: Path, tmp_path: Path) -> None:
    capture = tmp_path / "capture"
    shutil.copytree(slice_capture, capture)
    manifest = json.loads((capture / "manifest.json").read_text())
    (capture / "manifest.json").write_text(json.dumps(manifest | {"version": 99}))
    out = tmp_path / "g.parquet"
    assert_refused(
        run_cli(str(capture), "--tp", "2", "--pp", "4", "--dp", "2", "-o", str(out)), "version 99", out
    )


def test_corrupt_trace(slice_capture: Path, tmp_path: Path) -> None:
    capture = tmp_path / "capture"
    shutil.copytree(slice_capture, capture)
    CaptureFiles(capture).kineto(0).write_bytes(b"\x1f\x8b not really gzip")
    out = tmp_path / "g.parquet"
    result = run_cli(str(capture), "--tp", "2", "--pp", "4", "--dp", "2", "-o", str(out))
    assert_refused(result, "rank0.trace.json.gz", out)


def test_build_error_is_raised_by_the_library_too(slice_capture: Path, tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="re-capture"):
        build(slice_capture, tmp_path / "g.parquet", tp=1)


def test_build_simulates_and_what_ifs_move_the_prediction(slice_capture: Path, tmp_path: Path) -> None:
    from prism.graph.sim.cli import app as simulate_app
    from prism.schemas.summary import read_summary

    out = tmp_path / "g.parquet"
    built = run_cli(str(slice_capture), "--tp", "2", "--pp", "4", "--dp", "2", "-o", str(out))
    assert built.exit_code == 0, built.output
    as_built = read_summary(tmp_path / "summary.json")
    assert len(as_built.ranks["iteration_ns"]) == 16 and min(as_built.ranks["iteration_ns"]) > 0
    assert all(p > 0 for p in as_built.ranks["peak_bytes"])
    runner = CliRunner()
    slow = runner.invoke(
        simulate_app, [str(out), "--slow-rank", "5:+300%", "-o", str(tmp_path / "slow.json")]
    )
    assert slow.exit_code == 0, slow.output
    what_if = read_summary(tmp_path / "slow.json")
    assert what_if.what_if["slow_ranks"] == [{"rank": 5, "factor": 4.0}]
    # Rank 5 computes 4x as long; the job is never faster. (Whether the job is slower depends on
    # the capture's timing: on a loaded CI host one stage's stalls left slack that absorbed it.)
    assert what_if.ranks["compute_ns"][5] > 3.5 * as_built.ranks["compute_ns"][5]
    assert max(what_if.ranks["iteration_ns"]) >= max(as_built.ranks["iteration_ns"])
    others = [r for r in range(16) if r != 5]
    assert [what_if.ranks["compute_ns"][r] for r in others] == [
        as_built.ranks["compute_ns"][r] for r in others
    ]
    bad = runner.invoke(simulate_app, [str(out), "--slow-rank", "five"])
    assert bad.exit_code == 2 and "bad slow rank" in bad.output


@pytest.mark.parametrize(("tp", "pp", "dp"), [(2, 2, 1), (1, 1, 2)], ids=["dp1", "dp-is-the-world"])
def test_small_layouts_without_a_dp_axis_of_their_own(tmp_path: Path, tp: int, pp: int, dp: int) -> None:
    """dp=1 runs no gradient all-reduce; with dp = world size the DP group is the whole world."""
    config = replace(SMALL, tp=tp, pp=pp, dp=dp)
    capture = tmp_path / "capture"
    run_capture(CaptureOptions(config=config, out_dir=capture, real=RealMode.ALL, warmup=0, iterations=1))
    graph = build(capture, tmp_path / "g.parquet", Correction.NONE, tp=tp, pp=pp, dp=dp)
    nodes = read_rank(graph, 0).to_pandas()
    dp_calls = nodes[nodes[gf.GROUP_KIND] == "dp"]
    assert (len(dp_calls) > 0) == (dp > 1)
    assert "world" not in set(nodes[gf.GROUP_KIND])
