"""Fuzzing every reader of what prism writes: a real tiny capture and its graph, then each file
corrupted (a JSON value replaced, a key dropped, the file truncated, bytes flipped). The property:
the reader returns, or raises its one documented error, never anything else (a KeyError, a
TypeError, a crash). ``PRISM_FUZZ_EXAMPLES`` sets the examples per reader (CI: 25; for a long
local run, e.g. ``PRISM_FUZZ_EXAMPLES=2000 pytest tests/integration/test_fuzz_readers.py``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prism.capture.runner import CaptureOptions, run_capture
from prism.graph.build.builder import BuildOptions, build_graph
from prism.graph.build.normalize import normalize_rank
from prism.graph.io.parquet import GraphFormatError, read_metadata, read_rank
from prism.graph.io.validate import validate_graph
from prism.graph.sim.simulate import SimulationError, load_sim_graph, simulate
from prism.graph.traces.kineto import NormalizeError
from prism.schemas.cluster import ClusterSpec, ClusterSpecError, preset
from prism.schemas.comm_log import CommLogError, read_comm_log
from prism.schemas.manifest import CaptureFiles, ManifestError, read_manifest
from prism.schemas.workload import GPTConfig

EXAMPLES = int(os.environ.get("PRISM_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 25,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)  # fmt: skip
CONFIG = GPTConfig(layers=2, hidden=32, heads=2, seq_len=16, vocab=128, microbatches=2, tp=1, pp=2, dp=2)

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fuzz") / "capture"
    run_capture(CaptureOptions(config=CONFIG, out_dir=out, warmup=3, iterations=1))
    return out


@pytest.fixture(scope="module")
def graph(capture: Path) -> Path:
    out = capture.parent / "graph.parquet"
    build_graph(BuildOptions(capture_dir=capture, out=out, tp=1, pp=2, dp=2, cluster=preset("h100-ib")))
    return out


@st.composite
def corrupted_json(draw: st.DrawFn, doc: object) -> bytes:
    """``doc`` with one corruption: a value somewhere replaced or a key dropped, or its text cut."""
    how = draw(st.sampled_from(["replace", "drop", "truncate"]))
    text = json.dumps(doc)
    if how == "truncate":
        return text.encode()[: draw(st.integers(0, max(len(text) - 1, 0)))]
    doc = json.loads(text)  # a copy to change
    parent, key = None, None
    node = doc
    while isinstance(node, dict | list) and node and draw(st.integers(0, 3)) > 0:  # walk down a random path
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        parent, key = node, draw(st.sampled_from(keys))
        node = node[key]
    if parent is None:
        return json.dumps(draw(JSON_VALUES)).encode()
    if how == "drop" and isinstance(parent, dict):
        del parent[key]
    else:
        parent[key] = draw(JSON_VALUES)
    return json.dumps(doc).encode()


@st.composite
def corrupted_bytes(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` cut short, or with a few bytes overwritten."""
    if draw(st.booleans()):
        return data[: draw(st.integers(0, len(data) - 1))]
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        out[draw(st.integers(0, len(out) - 1))] = draw(st.integers(0, 255))
    return bytes(out)


def _copy(capture: Path, tmp_path: Path) -> Path:
    target = tmp_path / "capture"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(capture, target)
    return target


@FUZZ
@given(data=st.data())
def test_manifest(capture: Path, tmp_path: Path, data: st.DataObject) -> None:
    copy = _copy(capture, tmp_path)
    path = CaptureFiles(copy).manifest
    path.write_bytes(data.draw(corrupted_json(json.loads(path.read_text()))))
    try:
        read_manifest(copy)
    except ManifestError:
        pass


@FUZZ
@given(data=st.data())
def test_comm_log(capture: Path, tmp_path: Path, data: st.DataObject) -> None:
    source = CaptureFiles(capture).comm(0)
    path = tmp_path / "rank0.comm.json"
    path.write_bytes(data.draw(corrupted_json(json.loads(source.read_text()))))
    try:
        read_comm_log(path)
    except CommLogError:
        pass


@FUZZ
@given(data=st.data())
def test_kineto_trace_and_execution_trace(capture: Path, tmp_path: Path, data: st.DataObject) -> None:
    copy = _copy(capture, tmp_path)
    files = CaptureFiles(copy)
    path = data.draw(st.sampled_from([files.kineto(0), files.et(0), files.comm(0)]))
    raw = path.read_bytes()
    if data.draw(st.booleans()) and not path.suffix == ".gz":
        path.write_bytes(data.draw(corrupted_json(json.loads(raw))))
    else:
        path.write_bytes(data.draw(corrupted_bytes(raw)))
    try:
        normalize_rank(copy, 0)
    except (NormalizeError, ManifestError, CommLogError):
        pass


@FUZZ
@given(data=st.data())
def test_cluster_spec(tmp_path: Path, data: st.DataObject) -> None:
    text = preset("h100-ib").save(tmp_path / "spec.toml").read_text()
    lines = text.splitlines()
    k = data.draw(st.integers(0, len(lines) - 1))
    value = data.draw(st.sampled_from(["-1", "0", "1e400", '"x"', "[]", "{}", "nan", "true", "", "= ="]))
    key = lines[k].split("=")[0] if "=" in lines[k] else lines[k]
    lines[k] = (
        f"{key}= {value}"
        if data.draw(st.booleans())
        else lines[k][: data.draw(st.integers(0, len(lines[k])))]
    )
    try:
        ClusterSpec.from_toml("\n".join(lines))
    except ClusterSpecError:
        pass


@FUZZ
@given(data=st.data())
def test_graph_file(graph: Path, tmp_path: Path, data: st.DataObject) -> None:
    path = tmp_path / "graph.parquet"
    path.write_bytes(data.draw(corrupted_bytes(graph.read_bytes())))
    try:
        read_metadata(path)
        read_rank(path, 1)
        validate_graph(path)
        simulate(load_sim_graph(path), iterations=1)
    except (GraphFormatError, SimulationError):
        pass


def test_a_manifest_whose_layout_contradicts_its_job(capture: Path, tmp_path: Path) -> None:
    copy = _copy(capture, tmp_path)
    path = CaptureFiles(copy).manifest
    data = json.loads(path.read_text())
    data["layout"]["dp"] = 4  # edited by hand: the job ran dp=2
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="contradicts its job"):
        read_manifest(copy)


# -- the commands: exit 0 with a result, or one error line and exit 2, nothing half-written ------
def _clean_exit(result, out_dir: Path, written: str | None) -> None:
    assert result.exit_code in (0, 2), (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        assert "error:" in result.output
        assert written is None or not (out_dir / written).exists()
    assert not [p for p in out_dir.iterdir() if p.name.startswith(".")]  # no staged or temporary file


@FUZZ
@given(data=st.data())
def test_prism_build_graph_on_a_corrupted_capture(capture: Path, tmp_path: Path, data: st.DataObject) -> None:
    from typer.testing import CliRunner

    from prism.graph.build.cli import app

    copy = _copy(capture, tmp_path)
    files = CaptureFiles(copy)
    path = data.draw(st.sampled_from([files.manifest, files.comm(2), files.kineto(2), files.et(0)]))
    raw = path.read_bytes()
    if path.suffix == ".json" and data.draw(st.booleans()):
        path.write_bytes(data.draw(corrupted_json(json.loads(raw))))
    else:
        path.write_bytes(data.draw(corrupted_bytes(raw)))
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    argv = [str(copy), "--tp", "1", "--pp", "2", "--dp", "2", "-o", str(out / "graph.parquet")]
    _clean_exit(CliRunner().invoke(app, argv), out, "graph.parquet")


@FUZZ
@given(data=st.data())
def test_prism_simulate_and_validate_on_a_corrupted_graph(
    graph: Path, tmp_path: Path, data: st.DataObject
) -> None:
    from typer.testing import CliRunner

    from prism.graph.io.validate_cli import app as validate_app
    from prism.graph.sim.cli import app as simulate_app

    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    damaged = out / "graph.parquet"
    damaged.write_bytes(data.draw(corrupted_bytes(graph.read_bytes())))
    _clean_exit(CliRunner().invoke(simulate_app, [str(damaged)]), out, "summary.json")
    _clean_exit(CliRunner().invoke(validate_app, [str(damaged)]), out, None)
