"""Fuzzing the prism-* commands with what users and other tools hand them: captures and graphs
corrupted or edited, option values of every kind, programs that break. The property of every
command: exit 0 with its result, or one ``error:`` line and exit 2; never a traceback, a hang or a
half-written output. ``PRISM_FUZZ_EXAMPLES`` raises the examples (see tests/integration/fuzzing.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fuzzing import (
    clean_exit,
    copy_capture,
    corrupted_bytes,
    corrupted_json,
    edited_graph,
    edited_layout,
    edited_metadata,
    fresh_dir,
    fuzz,
)
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from prism.capture.cli import app as capture_app
from prism.graph.build.cli import app as build_app
from prism.graph.comm.calibrate_cli import app as calibrate_app
from prism.graph.export.cli import app as export_app
from prism.graph.io.validate_cli import app as validate_app
from prism.graph.sim.cli import app as simulate_app
from prism.replay.cli import app as replay_app
from prism.replay.paced_cli import app as paced_app
from prism.schemas.manifest import CaptureFiles, read_manifest


@fuzz()
@given(data=st.data())
def test_prism_build_graph_on_a_corrupted_capture(
    fuzz_capture: Path, tmp_path: Path, data: st.DataObject
) -> None:
    copy = copy_capture(fuzz_capture, tmp_path)
    files = CaptureFiles(copy)
    path = data.draw(st.sampled_from([files.manifest, files.comm(2), files.kineto(2), files.et(0)]))
    raw = path.read_bytes()
    if path.suffix == ".json" and data.draw(st.booleans()):
        path.write_bytes(data.draw(corrupted_json(json.loads(raw))))
    else:
        path.write_bytes(data.draw(corrupted_bytes(raw)))
    out = fresh_dir(tmp_path / "out")
    argv = [str(copy), "--tp", "1", "--pp", "2", "--dp", "2", "-o", str(out / "graph.parquet")]
    clean_exit(CliRunner().invoke(build_app, argv), out, "graph.parquet")


def _damaged_graph(data: st.DataObject, graph: Path, out: Path) -> tuple[Path, str]:
    damaged = out / "graph.parquet"
    if data.draw(st.booleans()):
        damaged.write_bytes(data.draw(corrupted_bytes(graph.read_bytes())))
        return damaged, "bytes corrupted"
    return damaged, data.draw(edited_graph(graph, damaged))


@fuzz()
@given(data=st.data())
def test_prism_simulate_validate_and_export_on_a_damaged_graph(
    fuzz_graph: Path, fuzz_lane_graph: Path, tmp_path: Path, data: st.DataObject
) -> None:
    out = fresh_dir(tmp_path / "out")
    source = data.draw(st.sampled_from([fuzz_graph, fuzz_lane_graph]))  # one stream a rank, or GPU streams
    damaged, what = _damaged_graph(data, source, out)
    clean_exit(CliRunner().invoke(simulate_app, [str(damaged)]), out, "summary.json", what)
    clean_exit(CliRunner().invoke(validate_app, [str(damaged)]), out, None, what)
    trace = ["trace", str(damaged), "--rank", "1", "-o", str(out / "t.json.gz")]
    clean_exit(CliRunner().invoke(export_app, trace), out, "t.json.gz", what)
    chakra = ["chakra", str(damaged), "-o", str(out / "et")]
    clean_exit(CliRunner().invoke(export_app, chakra), out, "et", what)


@fuzz(examples=10)
@given(data=st.data())
def test_a_graph_whose_layout_disagrees_with_its_rows_is_refused(
    fuzz_graph: Path, tmp_path: Path, data: st.DataObject
) -> None:
    """Metadata that says another world than the rows hold: every command refuses it (exit 2),
    where ranks would otherwise simulate as idle or fall outside every group."""
    out = fresh_dir(tmp_path / "out")
    damaged = out / "damaged.parquet"
    what = data.draw(edited_layout(fuzz_graph, damaged))
    for app, argv, written in (
        (simulate_app, [str(damaged)], "summary.json"),
        (validate_app, [str(damaged)], None),
        (export_app, ["trace", str(damaged), "--rank", "1", "-o", str(out / "t.json.gz")], "t.json.gz"),
        (export_app, ["chakra", str(damaged), "-o", str(out / "et")], "et"),
    ):
        result = CliRunner().invoke(app, argv)
        clean_exit(result, out, written, what)
        assert result.exit_code == 2, (what, argv, result.output)


@fuzz()
@given(data=st.data())
def test_prism_simulate_validate_and_export_on_edited_metadata(
    fuzz_graph: Path, tmp_path: Path, data: st.DataObject
) -> None:
    """Any value of a graph's metadata replaced, a key dropped or its text cut: each command runs
    or refuses it with one line."""
    out = fresh_dir(tmp_path / "out")
    damaged = out / "damaged.parquet"
    what = data.draw(edited_metadata(fuzz_graph, damaged))
    for app, argv, written in (
        (simulate_app, [str(damaged)], "summary.json"),
        (simulate_app, [str(damaged), "--cluster", "h100-ib", "-o", str(out / "s.json")], "s.json"),
        (validate_app, [str(damaged)], None),
        (export_app, ["trace", str(damaged), "--rank", "1", "-o", str(out / "t.json.gz")], "t.json.gz"),
        (export_app, ["chakra", str(damaged), "-o", str(out / "et")], "et"),
    ):
        clean_exit(CliRunner().invoke(app, argv), out, written, what)


@pytest.mark.slow
@fuzz(examples=5)  # each a replay or a paced capture of two processes: ~10 s
@given(data=st.data())
def test_prism_replay_and_capture_paced_on_a_damaged_graph(
    fuzz_graph: Path, tmp_path: Path, data: st.DataObject
) -> None:
    """Rank processes and the co-simulation start for a graph that loads: an edit that passes the
    load checks runs (a virtual rank made slow makes the real one wait: the rank timeout ends it)."""
    out = fresh_dir(tmp_path / "out")
    damaged, what = _damaged_graph(data, fuzz_graph, out)
    timing = ["--warmup", "3", "--iterations", "1", "--rank-timeout", "20"]
    if data.draw(st.booleans()):
        argv = [str(damaged), "--rank", "1", *timing, "-o", str(out / "replay")]
        clean_exit(CliRunner().invoke(replay_app, argv), out, "replay", what)
    else:
        argv = [str(damaged), *timing, "-o", str(out / "paced")]
        clean_exit(CliRunner().invoke(paced_app, argv), out, "paced", what)


# Values for the options of prism-capture: mostly out of range or of the wrong kind, some valid.
_SIZES = st.sampled_from(["-1", "0", "1", "2", "3", "x", "1.5", "", "99999999999999999999"])
CAPTURE_OPTIONS = {
    "--tp": _SIZES, "--pp": _SIZES, "--dp": _SIZES, "--layers": _SIZES, "--heads": _SIZES,
    "--microbatches": _SIZES, "--iterations": _SIZES, "--warmup": _SIZES, "--threads": _SIZES,
    "--hidden": st.sampled_from(["0", "-32", "31", "64", "x", "2" * 30]),
    "--dtype": st.sampled_from(["float32", "bfloat16", "int8", "", "float"]),
    "--grad-bucket-mb": st.sampled_from(["0", "-1", "nan", "inf", "0.001", "x"]),
    "--device": st.sampled_from(["cpu", "cuda", "tpu", ""]),
    "--real": st.sampled_from(["roles", "all", "some"]),
    "--order": st.sampled_from(["tp-dp-pp", "pp-dp-tp", "xyz", "tp-tp-pp"]),
    "--ranks": st.sampled_from(["0", "0,3", "0,0", "9", "-1", "a,b", ","]),
    "--rank-timeout": st.sampled_from(["0", "-5", "nan", "120"]),
    "--nproc-per-node": st.sampled_from(["0", "2"]),
}  # fmt: skip
TINY = ["--tp", "1", "--pp", "2", "--dp", "2", "--layers", "2", "--hidden", "32", "--heads", "2", "--seq-len", "16",
        "--vocab", "128", "--microbatches", "2", "--warmup", "3", "--iterations", "1"]  # fmt: skip


@pytest.mark.slow
@fuzz(examples=8)
@given(data=st.data())
def test_prism_capture_options(tmp_path: Path, data: st.DataObject) -> None:
    """A valid draw runs a real capture of the tiny model (the last value of an option wins)."""
    names = data.draw(st.lists(st.sampled_from(sorted(CAPTURE_OPTIONS)), min_size=1, max_size=3, unique=True))
    given_options = [x for name in names for x in (name, data.draw(CAPTURE_OPTIONS[name]))]
    out = fresh_dir(tmp_path / "out")
    result = CliRunner().invoke(capture_app, [*TINY, *given_options, "-o", str(out / "cap")])
    clean_exit(result, out, "cap", " ".join(given_options))
    if result.exit_code == 0:
        assert read_manifest(out / "cap").ranks


# Programs that break the ways programs do, each in one line of a tiny DDP training script.
_PROGRAM = """
import os, signal, sys, time
import torch, torch.distributed as dist
{before_init}
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range({steps}):
    model(torch.ones(2, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    if step == {at}:
        {in_loop}
"""
BREAKS = {
    "syntax error": ("def broken(:", "pass"),
    "raises at import": ("raise RuntimeError('no config file')", "pass"),
    "exits non-zero": ("sys.exit(3)", "pass"),
    "never initialises": ("sys.exit(0)", "pass"),
    "raises in a step": ("", "raise ValueError('loss is nan')"),
    "exits in a step": ("", "sys.exit(0)"),
    "killed in a step": ("", "os.kill(os.getpid(), signal.SIGKILL)"),
    "hangs in a step": ("", "time.sleep(3600)"),
    "unsupported call": ("", "dist.all_to_all_single(torch.ones(3), torch.ones(3))"),
}


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(BREAKS))
@fuzz(examples=1)
@given(at=st.integers(0, 2))
def test_prism_capture_on_a_program_that_breaks(tmp_path: Path, how: str, at: int) -> None:
    """It breaks before the captured steps are done (warm-up 3 and 2 profiled: after step 0, 1 or 2;
    after step 4 the capture has what it needs and ends the program itself): an error line
    with the rank's last log lines, or the rank timeout for the hang; nothing left behind."""
    before_init, in_loop = BREAKS[how]
    program = tmp_path / "train.py"
    program.write_text(_PROGRAM.format(before_init=before_init, in_loop=in_loop, steps=10, at=at))
    out = fresh_dir(tmp_path / "out")
    argv = ["--tp", "1", "--pp", "1", "--dp", "4", "--warmup", "3", "--iterations", "2", "--rank-timeout", "15"]  # fmt: skip
    result = CliRunner().invoke(capture_app, [*argv, "-o", str(out / "cap"), "--", str(program)])
    clean_exit(result, out, "cap", how)
    assert result.exit_code == 2, (how, result.output)


CALIBRATE_OPTIONS = {
    "--sizes": st.sampled_from(["4KiB", "0", "-5", "abc", "1e30", ",", "3", "16MiB,4"]),
    "--ops": st.sampled_from(["all_reduce", "foo", ",", "all_reduce,bogus"]),
    "--reps": st.sampled_from(["0", "-1", "x", "1"]),
    "--max-procs": st.sampled_from(["0", "1", "2", "x"]),
    "--timeout": st.sampled_from(["0", "-1", "nan", "inf", "5"]),
    "--compute-between-ms": st.sampled_from(["-1", "nan", "inf", "0"]),
    "--wake-gaps-ms": st.sampled_from(["x", "-1", "inf", "0", ""]),
    "--wake-rounds": st.sampled_from(["0", "-3", "x"]),
}  # fmt: skip


@fuzz()
@given(data=st.data())
def test_prism_calibrate_options_and_captures(
    fuzz_capture: Path, tmp_path: Path, data: st.DataObject
) -> None:
    """--no-bench fits a capture's logged calls alone (no microbenchmark processes): options of
    every kind, and --capture paths that are corrupted, missing or hold no delegated call."""
    copy = copy_capture(fuzz_capture, tmp_path)
    log = CaptureFiles(copy).comm(0)
    if data.draw(st.booleans()):
        log.write_bytes(data.draw(corrupted_json(json.loads(log.read_text()))))
    names = data.draw(st.lists(st.sampled_from(sorted(CALIBRATE_OPTIONS)), max_size=3, unique=True))
    given_options = [x for name in names for x in (name, data.draw(CALIBRATE_OPTIONS[name]))]
    capture = data.draw(st.sampled_from([str(copy), str(log), str(tmp_path / "missing")]))
    out = fresh_dir(tmp_path / "out")
    argv = ["--no-bench", "--capture", capture, *given_options, "-o", str(out / "spec.toml")]
    clean_exit(CliRunner().invoke(calibrate_app, argv), out, "spec.toml", " ".join(argv))
