"""Smoke test of prism.fidelity and benchmarks/fidelity.py: one tiny case, one repeat; fields and JSON, no accuracy claim."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from prism.fidelity import parse_case
from prism.fidelity.explain import BUBBLE, COMMUNICATION, PHASES
from prism.fidelity.load import MatchedLoad
from prism.schemas.cluster import preset

TINY = "tp=1 pp=2 dp=1 layers=2 hidden=32 heads=2 seq=16 mbs=1 microbatches=2 vocab=128"
RECORD_TYPES = {
    "case": str,
    "rank": int,
    "source": str,
    "real_iter_ms": float,
    "pred_iter_ms": float,
    "iter_err_pct": float,
    "real_peak_bytes": int,
    "pred_peak_bytes": int,
    "mem_err_pct": float,
    "real_repeats_ms": list,
    "pred_repeats_ms": list,
    "real_sem_pct": (float, type(None)),
    "paired_err_pct": float,
    "paired_se_pct": (float, type(None)),
    "real_bracket_drift_pct": (float, type(None)),
    "real_after_vs_before_pct": (float, type(None)),
    "err_ci95_pct": (list, type(None)),
    "real_spread_pct": float,
    "within_noise": bool,
    "real_steal_pct": float,
    "pred_steal_pct": (float, type(None)),  # a simulation's: no run
    "real_reruns": int,
    "pred_reruns": int,
    "real_window_s": float,
}
REPLAY_RECORD_TYPES = RECORD_TYPES | {
    "pred_corrected_ms": float,
    "corrected_err_pct": float,
    "graph_phase_err": dict,
}


BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_script(name: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run a script of benchmarks/ as a user does, in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *argv], capture_output=True, text=True, timeout=900
    )


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    # Any valid spec will do for a smoke test; it keeps the test from calibrating.
    return preset("h100-ib").save(tmp_path / "spec.toml")


def _check_record(record: dict) -> None:
    # Every record has the iteration by phase beside the total, real against predicted (a
    # simulation's, a replayed rank's wall time); a replay's also against its graph's phases.
    types = (REPLAY_RECORD_TYPES if record["source"] == "replay" else RECORD_TYPES) | {"phase_err": dict}
    assert set(record) == set(types)
    phases = record["phase_err"]
    assert set(phases) == set(PHASES)
    # The simulated phases add up to its iteration; the real ones, each the median of its
    # per-iteration time, to every iteration, so to about the median one (a part's tail moves it).
    for side, total, within in (("measured_ms", "real_iter_ms", 0.1), ("predicted_ms", "pred_iter_ms", 0.02)):
        assert sum(p[side] for p in phases.values()) == pytest.approx(record[total], rel=within)
        assert phases["forward"][side] > 0 and phases["backward"][side] > 0
        # A pipeline stage waits for its neighbour in transfers: the bubble, and no collective.
        # Either stage may find its neighbour never late (a first stage whose own compute
        # outlasts the last's, on a busy machine or in the graph of a noisy capture); the test
        # asks some rank of the simulation to wait. The posts of its transfers are its own
        # time, not bubble.
        where = (record["source"], record["rank"], side, phases)
        assert phases[BUBBLE][side] >= 0 and phases[COMMUNICATION][side] == 0, where
    for key, kind in types.items():
        assert isinstance(record[key], kind), (key, record[key])
    assert record["source"] in ("simulation", "paced", "replay")
    assert record["real_iter_ms"] > 0 and record["pred_iter_ms"] > 0
    assert record["real_peak_bytes"] > 0 and record["pred_peak_bytes"] > 0
    # One value per repeat, their median the record's; one repeat has no standard error.
    assert len(record["real_repeats_ms"]) == len(record["pred_repeats_ms"]) >= 1
    assert record["real_iter_ms"] == pytest.approx(statistics.median(record["real_repeats_ms"]), abs=1e-3)
    assert (record["real_sem_pct"] is None) == (len(record["real_repeats_ms"]) == 1)
    if len(record["real_repeats_ms"]) == 1:  # one repeat: its error is the median's
        assert record["paired_err_pct"] == pytest.approx(record["iter_err_pct"], abs=0.02)


@pytest.mark.slow
def test_one_case_through_the_cli_then_repriced(spec_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "fidelity.json"
    argv = ["--case", TINY, "--repeats", "1", "--warmup", "3", "--iterations", "1"]
    argv += ["--cluster-spec", str(spec_file), "--no-probe", "--json", str(out), "--paced"]
    done = run_script("fidelity.py", *argv, "--work-dir", str(tmp_path / "wd"))
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    # Every rank simulated (and paced); each role's rank (pp=2: both) replayed against the graph.
    for source in ("simulation", "paced", "replay"):
        assert [r["rank"] for r in data["records"] if r["source"] == source] == [0, 1]
    assert isinstance(data["paced_mean_abs_iter_err_pct"], float)
    for record in data["records"]:
        _check_record(record)
        # The real side ran right before and right after the replay: its time is their mean.
        assert record["real_bracket_drift_pct"] is not None
    # The pipeline's stages wait for each other somewhere in the simulated iteration.
    simulated = [r for r in data["records"] if r["source"] == "simulation"]
    assert any(r["phase_err"][BUBBLE]["predicted_ms"] > 0 for r in simulated), simulated
    # With --paced the replay runs against the paced capture's graph.
    (repeat,) = (tmp_path / "wd").glob("*/repeat0")
    assert json.loads((repeat / "replay" / "report.json").read_text())["graph"].endswith("paced.parquet")
    assert (repeat / "real" / "manifest.json").is_file() and (
        repeat / "real_after" / "manifest.json"
    ).is_file()
    assert isinstance(data["mean_abs_iter_err_pct"], float)
    assert isinstance(data["mean_abs_mem_err_pct"], float)
    assert {"nproc", "cpu_model", "date"} <= set(data["meta"]["machine"])
    # The pipeline's transfers of the one clean unprofiled iteration (warm-up 3: iteration 1).
    sends = [r for r in data["collectives"] if r["op"] == "send"]
    assert sends and all(r["calls"] > 0 for r in sends)

    # Re-priced from the kept slices: the same spec reproduces the run's prediction, and a
    # measured table that makes each one-node send cost 20 ms lengthens it.
    slow = replace(preset("h100-ib"), measured={"p2p": {2: ((0, 0.02),)}})
    slow_file = slow.save(tmp_path / "slow.toml")
    respec_out = tmp_path / "respec.json"
    # Switched off one at a time (--without), the measured table prices as --no-table does; a
    # second run (--also, here the same one) pools with the first, by family.
    argv = [str(out), str(tmp_path / "wd"), f"same={spec_file}", f"slow={slow_file}", "--no-table", "slow"]
    argv += ["--without", "measured", "--without", "skew", "--also", f"{out}={tmp_path / 'wd'}"]
    done = run_script("fidelity_respec.py", *argv, "--json", str(respec_out))
    assert done.returncode == 0, done.stderr
    repriced = json.loads(respec_out.read_text())
    names = ["same", "slow", "slow-line", "same-no-measured", "slow-no-measured", "slow-line-no-measured"]
    names += [f"{name}-no-skew" for name in names]
    assert sorted((r["run"], r["spec"], r["rank"]) for r in repriced) == sorted(
        (run, name, rank) for run in (0, 1) for name in names for rank in (0, 1)
    )
    rows = {(r["spec"], r["rank"]): r for r in repriced if r["run"] == 0}
    for rank, record in enumerate(r for r in data["records"] if r["source"] == "simulation"):
        assert rows[("same", rank)]["pred_ms"] == pytest.approx(record["pred_iter_ms"], rel=1e-3)
        assert rows[("slow", rank)]["pred_ms"] > rows[("slow-line", rank)]["pred_ms"] + 20
        assert rows[("slow-no-measured", rank)]["pred_ms"] == rows[("slow-line", rank)]["pred_ms"]
        assert rows[("same-no-skew", rank)]["pred_ms"] <= rows[("same", rank)]["pred_ms"]  # a wait only adds
    assert "GPT pp first stage" in done.stdout and "GPT pp last stage" in done.stdout  # the families table
    # The paced captures likewise reproduce the 'paced' rows, and are rebuilt under a second
    # profiler correction beside them.
    argv = [str(out), str(tmp_path / "wd"), f"same={spec_file}", "--capture", "paced"]
    argv += ["--correction", "phase", "--correction", "role", "--json", str(respec_out)]
    done = run_script("fidelity_respec.py", *argv)
    assert done.returncode == 0, done.stderr
    rows = json.loads(respec_out.read_text())
    assert {r["spec"] for r in rows} == {"same/phase", "same/role"}
    paced = [r for r in data["records"] if r["source"] == "paced"]
    for row, record in zip([r for r in rows if r["spec"] == "same/phase"], paced, strict=True):
        assert row["pred_ms"] == pytest.approx(record["pred_iter_ms"], rel=1e-3)


def test_bad_case_is_one_error_line() -> None:
    done = run_script("fidelity.py", "--case", "tp=1 pp=2 colour=blue")
    assert done.returncode == 2
    assert "unknown case key 'colour'" in done.stdout


@pytest.mark.slow
def test_matched_load_runs_the_other_ranks_beside_each_batch(tmp_path: Path) -> None:
    from prism.capture.runner import CaptureOptions, RealMode, run_capture

    config = parse_case(TINY)
    ran: list[tuple[int, int | None]] = []

    class Watch(MatchedLoad):
        def batch_done(self, ranks: tuple[int, ...]) -> None:
            ran.extend((rank, proc.poll()) for rank, proc in self._procs)
            super().batch_done(ranks)

    options = CaptureOptions(
        config=config, real=RealMode.ROLES, warmup=1, iterations=1, out_dir=tmp_path / "cap"
    )
    with Watch(config, warmup=1, iterations=1) as load:
        run_capture(options, hooks=load)
        assert load.started == [(1,), (0,)]  # pp=2: the other stage's rank beside each role
        # Each ran its whole job beside the batch (or was still running when it ended).
        assert [rank for rank, _ in ran] == [1, 0] and all(code in (None, 0) for _, code in ran)
        assert load._procs == []


def test_matched_load_that_dies_is_an_error(tmp_path: Path) -> None:
    with MatchedLoad(parse_case(TINY), warmup=1, iterations=1) as load:
        load._job.write_text("not json")  # the load process cannot start
        load.batch_starting((0,), {})
        load._procs[0][1].wait(timeout=60)
        with pytest.raises(RuntimeError, match="load process of rank 1 failed"):
            load.batch_done((0,))


def test_load_ranks_keep_their_temporary_files_in_the_loads_own_folder(monkeypatch) -> None:
    # Load ranks are killed when the batch ends, leaving whatever temporary files they had open:
    # those must land in the load's folder, removed with it, not in /tmp.
    import prism.fidelity.load as load_module

    envs = []

    class Started:
        pid = 0

        def __init__(self, command, **kwargs) -> None:
            envs.append(kwargs["env"])

        def poll(self) -> int:
            return 0

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(load_module.subprocess, "Popen", Started)
    with MatchedLoad(parse_case(TINY), warmup=1, iterations=1) as load:
        load.batch_starting((0,), {})
        (env,) = envs  # pp=2: the other stage's rank
        scratch = Path(env["TMPDIR"])
        assert env["LOCAL_RANK"] == "0"  # as the launcher sets it: programs read it (torchtitan)
        assert scratch.is_dir() and Path(load._dir.name) in scratch.parents
        load.batch_done((0,))
    assert not scratch.exists()


@pytest.mark.slow
def test_a_graph_built_for_a_job_larger_than_its_capture(spec_file: Path, tmp_path: Path) -> None:
    from prism.fidelity import RunSettings, captured_config, run_case_detailed
    from prism.graph.io.parquet import read_metadata
    from prism.schemas.cluster import ClusterSpec
    from prism.schemas.manifest import read_manifest

    # Three layers a stage (first, middle, last) and more microbatches than the pipeline holds in
    # flight: every schedule section and layer position the larger job runs was captured.
    text = "tp=1 pp=2 dp=1 layers=8 hidden=32 heads=2 seq=16 mbs=1 microbatches=8 vocab=128 captured_layers=6 captured_microbatches=4"  # fmt: skip
    job, captured = parse_case(text), captured_config(text)
    settings = RunSettings(warmup=3, iterations=1, replay=False, work_dir=tmp_path / "wd")
    result = run_case_detailed(job, 1, ClusterSpec.load(spec_file), settings, captured=captured)
    assert {r["case"] for r in result.records} == {text}
    (repeat,) = (tmp_path / "wd").glob("*/repeat0")
    # The slice ran the smaller job, the real run and the graph the case's own.
    slice_job = read_manifest(repeat / "slice").job.config
    assert (slice_job["layers"], slice_job["microbatches"]) == (6, 4)
    real_job = read_manifest(repeat / "real").job.config
    assert (real_job["layers"], real_job["microbatches"]) == (8, 8)
    model = read_metadata(repeat / "graph.parquet").model
    assert (model["layers"], model["microbatches"]) == (8, 8), model
    # The peak memory of layers and microbatches that never ran in the capture is the real run's.
    for record in result.records:
        assert record["real_peak_bytes"] == record["pred_peak_bytes"], record


@pytest.mark.slow
def test_each_case_priced_by_a_calibration_of_its_own(tmp_path: Path) -> None:
    second = "tp=2 pp=1 dp=1 layers=2 hidden=32 heads=2 seq=16 mbs=1 microbatches=1 vocab=128"
    out = tmp_path / "fidelity.json"
    argv = ["--case", TINY, "--case", second, "--repeats", "1", "--warmup", "3", "--iterations", "1"]
    argv += ["--no-replay", "--no-probe", "--recalibrate-each", "--calibrate-reps", "2"]
    argv += ["--calibrate-sizes", "64KiB,1MiB,4MiB", "--calibrate-into", str(tmp_path / "spec.toml")]
    done = run_script("fidelity.py", *argv, "--json", str(out))
    assert done.returncode == 0, done.stderr
    sources = json.loads(out.read_text())["meta"]["cluster_spec"]
    assert [s.split(" ")[0] for s in sources] == [
        str(tmp_path / "spec-1.toml"),
        str(tmp_path / "spec-2.toml"),
    ]
    assert all((tmp_path / f"spec-{i}.toml").is_file() for i in (1, 2))


def test_recalibrating_each_case_and_a_given_spec_are_refused_together(spec_file: Path) -> None:
    done = run_script("fidelity.py", "--recalibrate-each", "--cluster-spec", str(spec_file))
    assert done.returncode == 2 and "--recalibrate-each calibrates for each case" in done.stderr
