"""Fuzzing every reader of what prism writes: a real tiny capture and its graph, then each file
corrupted (a JSON value replaced, a key dropped, the file truncated, bytes flipped). The property:
the reader returns, or raises its one documented error, never anything else (a KeyError, a
TypeError, a crash). ``PRISM_FUZZ_EXAMPLES`` sets the examples per reader (CI: 25; for a long
local run, e.g. ``PRISM_FUZZ_EXAMPLES=2000 pytest tests/integration/test_fuzz_*.py``)."""

from __future__ import annotations

import gzip
import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from fuzzing import copy_capture, corrupted_bytes, corrupted_json, edited_graph, fuzz
from hypothesis import given
from hypothesis import strategies as st

from prism.graph.build.from_traces import TraceGraphError, build_from_traces
from prism.graph.build.normalize import normalize_rank
from prism.graph.io.parquet import GraphFormatError, GraphReader, GraphWriter, read_metadata, read_rank
from prism.graph.io.validate import validate_graph
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import SimulationError, simulate
from prism.graph.traces.gpu import dependencies, read_gpu_trace
from prism.graph.traces.kineto import NormalizeError
from prism.schemas.cluster import ClusterSpec, ClusterSpecError, preset
from prism.schemas.comm_log import CommLogError, read_comm_log
from prism.schemas.manifest import CaptureFiles, ManifestError, read_manifest


@fuzz()
@given(data=st.data())
def test_manifest(fuzz_capture: Path, tmp_path: Path, data: st.DataObject) -> None:
    copy = copy_capture(fuzz_capture, tmp_path)
    path = CaptureFiles(copy).manifest
    path.write_bytes(data.draw(corrupted_json(json.loads(path.read_text()))))
    try:
        read_manifest(copy)
    except ManifestError:
        pass


@fuzz()
@given(data=st.data())
def test_comm_log(fuzz_capture: Path, tmp_path: Path, data: st.DataObject) -> None:
    source = CaptureFiles(fuzz_capture).comm(0)
    path = tmp_path / "rank0.comm.json"
    path.write_bytes(data.draw(corrupted_json(json.loads(source.read_text()))))
    try:
        read_comm_log(path)
    except CommLogError:
        pass


@fuzz()
@given(data=st.data())
def test_kineto_trace_and_execution_trace(fuzz_capture: Path, tmp_path: Path, data: st.DataObject) -> None:
    copy = copy_capture(fuzz_capture, tmp_path)
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


GPU_TRACES = Path(__file__).resolve().parents[1] / "data" / "gpu_traces"


@fuzz()
@given(data=st.data())
def test_gpu_trace(tmp_path: Path, data: st.DataObject) -> None:
    source = GPU_TRACES / data.draw(
        st.sampled_from(["event_sync.json.gz", "event_sync_multi_stream.json.gz"])
    )
    if data.draw(st.booleans()):
        path = tmp_path / "trace.json"
        path.write_bytes(data.draw(corrupted_json(json.loads(gzip.decompress(source.read_bytes())))))
    else:
        path = tmp_path / "trace.json.gz"
        path.write_bytes(data.draw(corrupted_bytes(source.read_bytes())))
    try:
        dependencies(read_gpu_trace(path))
    except NormalizeError:
        pass


@fuzz()
@given(data=st.data())
def test_trace_directory(tmp_path: Path, data: st.DataObject) -> None:
    # One or two traces, each whole or corrupted, as prism-build-graph --from-traces reads them.
    directory = tmp_path / "traces"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    for k in range(data.draw(st.integers(1, 2))):
        source = GPU_TRACES / data.draw(
            st.sampled_from(["event_sync.json.gz", "event_sync_multi_stream.json.gz"])
        )
        raw = json.loads(gzip.decompress(source.read_bytes()))
        if data.draw(st.booleans()):  # as a rank of a job of two
            raw["distributedInfo"] = {"rank": data.draw(st.sampled_from([0, 1, 1, 2, -1])), "world_size": 2}
        text = json.dumps(raw).encode()
        if data.draw(st.booleans()):
            text = data.draw(corrupted_json(json.loads(text)))
        (directory / f"rank{k}.json").write_bytes(text)
    try:
        build_from_traces(
            directory, tmp_path / "graph.parquet", step=data.draw(st.sampled_from([None, 100, 7]))
        )
        assert validate_graph(tmp_path / "graph.parquet").ok
        simulate(load_sim_graph(tmp_path / "graph.parquet"), iterations=1)
    except (NormalizeError, TraceGraphError):
        pass


_SPEC_WITH_TABLES = replace(
    preset("h100-ib"),
    busy_call={"512": 3.0, "65536": 2.0},
    wake_compute={"500": 1e-4, "4000": 4e-4},
    measured={"all_reduce": {2: ((512, 1e-3), (65536, 2e-3))}},
)


@fuzz()
@given(data=st.data())
def test_cluster_spec(tmp_path: Path, data: st.DataObject) -> None:
    text = _SPEC_WITH_TABLES.save(tmp_path / "spec.toml").read_text()
    lines = text.splitlines()
    k = data.draw(st.integers(0, len(lines) - 1))
    value = data.draw(st.sampled_from(["-1", "0", "1e400", '"x"', "[]", "{}", "nan", "true", "", "= ="]))
    key = lines[k].split("=")[0] if "=" in lines[k] else lines[k]
    if data.draw(st.booleans()):  # a table's key: odd digits and signs must be refused, not crash
        key = data.draw(st.sampled_from(['"²"', '"٣"', '"-5"', '"0"', '"x"', '"1.5"'])) + " "
    lines[k] = (
        f"{key}= {value}"
        if data.draw(st.booleans())
        else lines[k][: data.draw(st.integers(0, len(lines[k])))]
    )
    try:
        ClusterSpec.from_toml("\n".join(lines))
    except ClusterSpecError:
        pass


def _read_every_way(path: Path, rank: int) -> None:
    """Metadata, one rank, the validator and the simulation: each reads, or raises its documented error."""
    try:
        read_metadata(path)
        read_rank(path, rank)
        validate_graph(path)
        simulate(load_sim_graph(path), iterations=1)
    except (GraphFormatError, SimulationError):
        pass


@fuzz()
@given(data=st.data())
def test_graph_file(fuzz_graph: Path, fuzz_lane_graph: Path, tmp_path: Path, data: st.DataObject) -> None:
    path = tmp_path / "graph.parquet"
    source = data.draw(st.sampled_from([fuzz_graph, fuzz_lane_graph]))  # one stream a rank, or GPU streams
    if data.draw(st.booleans()):
        path.write_bytes(data.draw(corrupted_bytes(source.read_bytes())))
    else:
        data.draw(edited_graph(source, path))
    _read_every_way(path, rank=1)


@fuzz()
@given(data=st.data())
def test_graph_directory(fuzz_graph: Path, tmp_path: Path, data: st.DataObject) -> None:
    """A graph of four part files (a rank each), one of them damaged, removed, renamed or
    overwritten by another, or a stray file beside them."""
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "graph.parquet"  # tmp_path outlives an example
    with (
        GraphReader(fuzz_graph) as reader,
        GraphWriter(path, reader.metadata, 1, row_groups_per_file=1) as writer,
    ):
        for chunk in reader.iter_rank_chunks():
            writer.write_ranks(chunk)
    parts = sorted(path.iterdir())
    part = data.draw(st.sampled_from(parts))
    damage = data.draw(st.sampled_from(["bytes", "remove", "rename", "overwrite", "stray"]))
    if damage == "bytes":
        part.write_bytes(data.draw(corrupted_bytes(part.read_bytes())))
    elif damage == "remove":
        part.unlink()
    elif damage == "rename":
        first, last = data.draw(st.integers(0, 9)), data.draw(st.integers(0, 9))
        part.rename(
            path / data.draw(st.sampled_from([f"ranks-{first}-{last}.parquet", f"part-{first}.parquet"]))
        )
    elif damage == "overwrite":
        part.write_bytes(data.draw(st.sampled_from(parts)).read_bytes())
    else:
        (path / data.draw(st.sampled_from(["x", "_SUCCESS", "ranks-9-9.parquet"]))).write_bytes(b"")
    _read_every_way(path, rank=3)


def test_a_manifest_whose_layout_contradicts_its_job(fuzz_capture: Path, tmp_path: Path) -> None:
    copy = copy_capture(fuzz_capture, tmp_path)
    path = CaptureFiles(copy).manifest
    data = json.loads(path.read_text())
    data["layout"]["dp"] = 4  # edited by hand: the job ran dp=2
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="contradicts its job"):
        read_manifest(copy)
