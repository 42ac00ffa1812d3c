"""Capture the tiny default slice (target tp=8 pp=16 dp=64) once and check what it recorded."""

from __future__ import annotations

import gzip
import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from prism.capture.runner import CaptureOptions, run_capture
from prism.capture.workloads.gpt.config import GPTConfig
from prism.schemas.annotations import Direction, Part, Phase, try_parse_mark
from prism.schemas.comm_log import read_comm_log
from prism.schemas.layout import Role
from prism.schemas.manifest import CaptureFiles, read_manifest

pytestmark = pytest.mark.slow

CONFIG = GPTConfig()  # the built-in default: tiny model at tp=8 pp=16 dp=64
WARMUP, ITERATIONS = 1, 1


@pytest.fixture(scope="module")
def capture_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("slice") / "capture"
    run_capture(CaptureOptions(config=CONFIG, out_dir=out, warmup=WARMUP, iterations=ITERATIONS))
    return out


def load_kineto(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def marks_of(trace: dict) -> list:
    return [
        m for e in trace["traceEvents"] if e.get("ph") == "X" and (m := try_parse_mark(e["name"])) is not None
    ]


def test_manifest_names_one_rank_per_role(capture_dir: Path) -> None:
    manifest = read_manifest(capture_dir)
    assert manifest.layout.world_size == 8192
    assert {r.role: r.rank for r in manifest.ranks} == {Role.FIRST: 0, Role.MIDDLE: 512, Role.LAST: 7680}
    assert manifest.mode == "roles"
    assert manifest.job.config == CONFIG.to_dict()
    assert "{rank}" in manifest.rerun_command and "prism.capture.rank_main" in manifest.rerun_command
    for r in manifest.ranks:
        assert len(r.result.iteration_ns) == WARMUP + ITERATIONS
        assert (r.result.losses[-1] is not None) == (r.role == Role.LAST)
    # Nothing else was left beside the capture.
    assert [p.name for p in capture_dir.parent.iterdir()] == ["capture"]


def test_one_kineto_trace_and_one_et_per_real_rank(capture_dir: Path) -> None:
    files = CaptureFiles(capture_dir)
    ranks = [r.rank for r in read_manifest(capture_dir).ranks]
    assert sorted(p.name for p in files.kineto_dir.iterdir()) == sorted(files.kineto(r).name for r in ranks)
    for rank in ranks:
        trace = load_kineto(files.kineto(rank))
        assert trace["distributedInfo"]["rank"] == rank
        assert trace["distributedInfo"]["world_size"] == 8192
        assert any(e.get("name") == "[memory]" for e in trace["traceEvents"])
        et = json.loads(files.et(rank).read_text())
        assert len(et["nodes"]) > 100


def test_execution_trace_joins_kineto_cpu_ops(capture_dir: Path) -> None:
    files = CaptureFiles(capture_dir)
    for r in read_manifest(capture_dir).ranks:
        et = json.loads(files.et(r.rank).read_text())
        rf_ids = {a["value"] for n in et["nodes"] for a in n["attrs"] if a["name"] == "rf_id"}
        cpu_ops = [e for e in load_kineto(files.kineto(r.rank))["traceEvents"] if e.get("cat") == "cpu_op"]
        joined = sum(e["args"].get("Record function id") in rf_ids for e in cpu_ops)
        assert len(cpu_ops) > 100
        assert joined / len(cpu_ops) >= 0.99, f"rank {r.rank}: {joined}/{len(cpu_ops)} cpu_ops joined"


def expected_blocks(stage: int) -> Counter:
    """(phase, layer, part, dir) of every mark a stage emits per microbatch."""
    blocks = Counter()
    for phase in (Phase.FORWARD, Phase.BACKWARD):
        blocks[(phase, None, None, None)] += 1
        for layer in CONFIG.stage_layers(stage):
            blocks[(phase, layer, None, None)] += 1
        parts = ([Part.EMBED] if stage == 0 else []) + (
            [Part.HEAD, Part.LOSS] if stage == CONFIG.pp - 1 else []
        )
        for part in parts:
            blocks[(phase, None, part, None)] += 1
    if stage > 0:
        blocks[(Phase.RECV, None, None, Direction.FORWARD)] += 1
        blocks[(Phase.SEND, None, None, Direction.BACKWARD)] += 1
    if stage < CONFIG.pp - 1:
        blocks[(Phase.SEND, None, None, Direction.FORWARD)] += 1
        blocks[(Phase.RECV, None, None, Direction.BACKWARD)] += 1
    return blocks


def test_every_block_is_marked_for_every_microbatch(capture_dir: Path) -> None:
    files = CaptureFiles(capture_dir)
    manifest = read_manifest(capture_dir)
    for r in manifest.ranks:
        marks = marks_of(load_kineto(files.kineto(r.rank)))
        per_mb: dict[int, Counter] = {}
        for m in marks:
            if m.mb is not None:
                assert m.stage == r.stage
                per_mb.setdefault(m.mb, Counter())[(m.phase, m.layer, m.part, m.dir)] += 1
        assert sorted(per_mb) == list(range(CONFIG.microbatches))
        for mb, seen in per_mb.items():
            assert seen == Counter({k: v * ITERATIONS for k, v in expected_blocks(r.stage).items()}), (
                f"rank {r.rank} microbatch {mb}"
            )
        phases = Counter(m.phase for m in marks)
        assert phases[Phase.ITERATION] == ITERATIONS
        assert phases[Phase.OPTIMIZER] == ITERATIONS
        assert phases[Phase.GRAD_SYNC] >= ITERATIONS
        peers = {m.peer for m in marks if m.phase in (Phase.SEND, Phase.RECV)}
        layout = manifest.layout
        assert peers == {
            p for p in (layout.pipeline_prev(r.rank), layout.pipeline_next(r.rank)) if p is not None
        }


def test_comm_log_binds_calls_to_layout_groups(capture_dir: Path) -> None:
    files = CaptureFiles(capture_dir)
    manifest = read_manifest(capture_dir)
    layout = manifest.layout
    for r in manifest.ranks:
        log = read_comm_log(files.comm(r.rank))
        assert log.rank == r.rank and log.world_size == 8192
        labels = Counter(c.label.split(".")[0] for c in log.calls)
        assert labels["tp"] > 0 and labels["dp"] > 0
        tp_label = f"tp.{layout.group_index(r.rank, 'tp')}"
        assert {c.label for c in log.calls if c.label.startswith("tp")} == {tp_label}
        p2p = [c for c in log.calls if c.op in ("send", "recv")]
        assert p2p and all(
            c.bytes == CONFIG.micro_batch_size * CONFIG.seq_len * CONFIG.hidden * 4 for c in p2p
        )
        assert not any(c.delegated for c in log.calls)
        # Per-group sequence numbers count up from 0 on every group.
        for group in {c.group for c in log.calls}:
            assert [c.gseq for c in log.calls if c.group == group] == list(
                range(sum(c.group == group for c in log.calls))
            )


def test_hta_loads_each_trace_with_its_rank(capture_dir: Path) -> None:
    from hta.trace_analysis import TraceAnalysis

    ranks = sorted(r.rank for r in read_manifest(capture_dir).ranks)
    ta = TraceAnalysis(trace_dir=str(CaptureFiles(capture_dir).kineto_dir))
    assert sorted(ta.t.get_ranks()) == ranks
    for rank in ranks:
        assert len(ta.t.get_trace(rank)) > 100


def test_rerun_command_runs_one_rank_alone(capture_dir: Path, tmp_path: Path) -> None:
    """Replay starts ranks with the manifest's command: it must work for a rank on its own."""
    manifest = read_manifest(capture_dir)
    middle = manifest.rank_of_role(Role.MIDDLE)
    values = {"{capture_dir}": str(capture_dir), "{rank}": str(middle.rank), "{out_dir}": str(tmp_path)}
    argv = [values.get(arg, arg) for arg in manifest.rerun_command]
    argv = [arg.replace("{capture_dir}", str(capture_dir)) for arg in argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rerun = CaptureFiles(tmp_path)
    assert all(p.is_file() for p in rerun.rank_files(middle.rank))
    original = read_comm_log(CaptureFiles(capture_dir).comm(middle.rank)).calls
    again = read_comm_log(rerun.comm(middle.rank)).calls
    assert [(c.op, c.label, c.gseq, c.bytes) for c in again] == [
        (c.op, c.label, c.gseq, c.bytes) for c in original
    ]


def test_default_slice_builds_the_full_scale_graph(capture_dir: Path, tmp_path: Path) -> None:
    """capture → graph → validate on the built-in default: all 8192 ranks, every group complete."""
    from prism.graph.build.builder import BuildOptions, build_graph
    from prism.graph.build.profiler_overhead import Correction
    from prism.graph.io.parquet import read_rank
    from prism.schemas.cluster import preset

    out = tmp_path / "graph.parquet"
    result = build_graph(
        BuildOptions(
            capture_dir=capture_dir, out=out, tp=8, pp=16, dp=64, cluster=preset("h100-ib"),
            profiler_correction=Correction.NONE,  # one warm-up iteration: none clean to correct by
        )
    )  # fmt: skip
    assert result.report.ok and result.report.ranks == 8192
    # A middle rank far from any captured one runs its own stage's program, bound to its own groups.
    rank = CONFIG.layout.rank(tp=5, dp=37, pp=9)
    nodes = read_rank(out, rank).to_pandas()
    assert (nodes["stage"] == 9).all() and set(nodes["src_rank"]) == {512}
    tp = nodes[nodes["group_kind"] == "tp"]
    assert set(tp["group_index"]) == {CONFIG.layout.group_index(rank, "tp")}
    peers = set(nodes.loc[nodes["peer"] >= 0, "peer"])
    assert peers == {CONFIG.layout.pipeline_prev(rank), CONFIG.layout.pipeline_next(rank)}
