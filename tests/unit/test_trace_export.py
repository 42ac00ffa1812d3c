"""export_trace: a rank's Chrome trace is staged in its own output folder, never the system's."""

from __future__ import annotations

import gzip
import json
import tempfile

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from prism.capture.profiling import export_trace


def _profiled() -> profile:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(8, 8).matmul(torch.ones(8, 8))
    return prof


@pytest.mark.parametrize("name", ["rank0.trace.json.gz", "rank0.json"])
def test_a_trace_is_written_whole_without_the_system_temporary_folder(tmp_path, monkeypatch, name):
    # torch stages a .gz export under tempfile's folder; one that does not exist makes that fail.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-folder"))
    out = tmp_path / "run"
    out.mkdir()
    export_trace(_profiled(), out / name)
    raw = (out / name).read_bytes()
    trace = json.loads(gzip.decompress(raw) if name.endswith(".gz") else raw)
    assert any(e.get("name") == "aten::matmul" for e in trace["traceEvents"])
    assert [p.name for p in out.iterdir()] == [name]  # no staged copy left beside it
