"""prism-capture from the command line: bad input fails fast and cleanly; a small run succeeds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from prism.capture.cli import app
from prism.schemas.manifest import read_manifest

runner = CliRunner()


def run_cli(*args: str):
    return runner.invoke(app, list(args))


def error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    return next(line for line in lines if line.startswith("error:"))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--tp", "3"], "heads (8) must be divisible by tp (3)"),
        (["--pp", "5"], "layers (32) must be divisible by pp (5)"),
        (["--microbatches", "8"], "microbatches (8) must be at least pp (16)"),
        (["--hidden", "100", "--heads", "8", "--tp", "1"], "hidden (100) must be divisible by heads (8)"),
        (["--vocab", "1001", "--tp", "2", "--heads", "2"], "vocab (1001) must be divisible by tp (2)"),
        (["--tp", "0"], "tp must be a positive integer"),
        (["--dtype", "int8"], "dtype must be one of"),
        (["--real", "all"], "--real all would start 8192 rank processes"),
        (["--iterations", "0"], "--iterations must be at least 1"),
    ],
)
def test_impossible_input_is_one_error_line_and_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    out = tmp_path / "cap"
    result = run_cli(*args, "-o", str(out))
    assert result.exit_code == 2, result.output
    assert needle in error_line(result)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error when CUDA is absent")
def test_cuda_asked_for_but_absent(tmp_path: Path) -> None:
    result = run_cli("--device", "cuda", "-o", str(tmp_path / "cap"))
    assert result.exit_code == 2
    assert "CUDA is not available" in error_line(result)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_output(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    result = run_cli("-o", str(a_file / "cap"))
    assert result.exit_code == 2
    assert "cannot write" in error_line(result)


def test_non_empty_output_needs_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = run_cli("-o", str(out))
    assert result.exit_code == 2
    assert "--overwrite" in error_line(result)
    assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.slow
def test_small_slice_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    cmd = [
        sys.executable, "-m", "prism.capture.cli", "--tp", "2", "--pp", "4", "--dp", "4", "--layers", "4",
        "--hidden", "64", "--heads", "2", "--seq-len", "16", "--vocab", "128", "--microbatches", "4",
        "--warmup", "0", "--iterations", "1", "-o", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = read_manifest(out)
    assert [r.rank for r in manifest.ranks] == [0, 8, 24]
    assert "capture of tp=2 pp=4 dp=4" in done.stderr


def test_a_spec_that_cannot_be_read_for_host_work_is_one_error_line(tmp_path: Path) -> None:
    result = run_cli("--host-work", str(tmp_path / "missing.toml"), "-o", str(tmp_path / "cap"))
    assert result.exit_code == 2
    assert "cannot read cluster spec" in error_line(result)
    assert list(tmp_path.iterdir()) == []


def tiny_job(*, tp: int, dp: int) -> tuple[str, ...]:
    """Options of a one-layer GPT that captures in seconds."""
    return (
        "--tp", str(tp), "--pp", "1", "--dp", str(dp), "--layers", "1", "--hidden", "32", "--heads", "2",
        "--seq-len", "8", "--vocab", "64", "--microbatches", "1", "--warmup", "3", "--iterations", "1",
    )  # fmt: skip


def test_host_work_of_a_spec_reaches_every_rank_job(tmp_path: Path) -> None:
    from prism.schemas.cluster import ClusterSpec, preset

    spec = ClusterSpec.from_dict(preset("h100-ib").to_dict() | {"host_ns_per_byte": {"all_reduce": 0.4}})
    out = tmp_path / "cap"
    result = run_cli(
        *tiny_job(tp=1, dp=2), "--host-work", str(spec.save(tmp_path / "spec.toml")), "-o", str(out)
    )
    assert result.exit_code == 0, result.output
    assert dict(read_manifest(out).job.host_ns_per_byte) == {"all_reduce": 0.4}


def test_held_calls_take_their_price_under_the_spec(tmp_path: Path) -> None:
    from prism.peers.comm_model import CommModel
    from prism.schemas.cluster import ClusterSpec, preset
    from prism.schemas.comm_log import read_comm_log
    from prism.schemas.manifest import CaptureFiles

    four_ms_an_all_reduce = {"intra_latency_s": 0.002}
    spec = ClusterSpec.from_dict(preset("h100-ib").to_dict() | four_ms_an_all_reduce)
    out = tmp_path / "cap"
    result = run_cli(
        *tiny_job(tp=2, dp=1), "--hold-calls", str(spec.save(tmp_path / "spec.toml")), "-o", str(out)
    )
    assert result.exit_code == 0, result.output
    assert read_manifest(out).job.hold_calls == spec
    model = CommModel(spec)
    reduces = [c for c in read_comm_log(CaptureFiles(out).comm(0)).calls if c.op == "all_reduce"]
    assert len(reduces) >= 5  # the tp layer's all-reduces of every iteration
    for call in reduces:
        price = model.duration_ns("all_reduce", call.bytes, 2, 1)
        assert call.done_ns - call.enter_ns >= price >= 4_000_000
