"""Bad input to the prism-* commands is one error line and exit code 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from prism.graph.build.cli import app as build_app
from prism.graph.sim.cli import app as simulate_app
from prism.replay.cli import app as replay_app

TINY = Path(__file__).parents[1] / "data" / "tiny_graph.parquet"


def _fails_cleanly(app, argv: list[str], says: str) -> None:
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert says in result.output


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--iterations", "0"], "Invalid value"),
        (["--iterations", "-3"], "Invalid value"),
    ],
)
def test_simulate_options_out_of_range(argv, says):
    _fails_cleanly(simulate_app, [str(TINY), *argv], says)


def test_simulate_out_that_is_a_directory(tmp_path):
    _fails_cleanly(simulate_app, [str(TINY), "-o", str(tmp_path)], "is a directory")
    assert list(tmp_path.iterdir()) == []


def test_replay_device_that_prism_cannot_run(tmp_path):
    _fails_cleanly(
        replay_app, [str(TINY), "--rank", "0", "--device", "tpu", "-o", str(tmp_path / "r")], "cpu or cuda"
    )
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("text", ["[]", "3", '"manifest"'])
def test_build_from_a_manifest_that_is_no_object(tmp_path, text):
    (tmp_path / "manifest.json").write_text(text)
    _fails_cleanly(
        build_app,
        [str(tmp_path), "--tp", "1", "--pp", "1", "--dp", "1", "-o", str(tmp_path / "g.parquet")],
        "not a prism capture manifest",
    )


@pytest.mark.parametrize("option", ["--microbatches", "--layers"])
def test_build_sizes_of_zero_are_refused_not_ignored(tmp_path, option):
    argv = [str(tmp_path), "--tp", "1", "--pp", "1", "--dp", "1", option, "0"]
    _fails_cleanly(build_app, argv, "Invalid value")


def test_replay_timeout_must_be_positive(tmp_path):
    _fails_cleanly(replay_app, [str(TINY), "--rank", "0", "--rank-timeout", "-5"], "Invalid value")


def test_simulate_and_replay_validate_the_whole_graph_when_asked(tmp_path):
    from test_graph_io import graph_rows, write_graph

    rows = graph_rows()
    next(r for r in rows if r["coll_id"] == 100 and r["rank"] == 1).update({"bytes": 3})  # members disagree
    graph = write_graph(tmp_path / "g.parquet", rows)
    _fails_cleanly(simulate_app, [str(graph), "--validate"], "members disagree on bytes")
    _fails_cleanly(
        replay_app, [str(graph), "--rank", "0", "--validate", "-o", str(tmp_path / "r")], "members disagree"
    )
    assert not (tmp_path / "r").exists() and not (tmp_path / "summary.json").exists()


COMMANDS = {
    "prism-capture": "prism.capture.cli",
    "prism-build-graph": "prism.graph.build.cli",
    "prism-simulate": "prism.graph.sim.cli",
    "prism-validate-graph": "prism.graph.io.validate_cli",
    "prism-calibrate": "prism.graph.comm.calibrate_cli",
    "prism-replay": "prism.replay.cli",
    "prism-capture-paced": "prism.replay.paced_cli",
    "prism-export": "prism.graph.export.cli",
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("argv", [["--no-such-option"], ["--help"], ["--warmup", "x"]])
def test_a_usage_error_is_one_error_line_naming_the_help(command, argv, monkeypatch, capsys):
    """An unknown option or a value of the wrong type: one ``error:`` line (not click's framed
    panel) that names where to look, exit 2 -- as every other error of prism."""
    import importlib

    module = importlib.import_module(COMMANDS[command])
    monkeypatch.setattr("sys.argv", [command, *argv])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    err = capsys.readouterr().err.strip().splitlines()
    if argv == ["--help"]:  # still help, exit 0
        assert stopped.value.code == 0
        return
    assert stopped.value.code == 2
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert err[0].endswith(
        f"{command} --help)"
    )  # under pytest, click names the program "python -m pytest.<argv0>"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--nproc-per-node", "2"], "--nproc-per-node: only for a program"),
        (["--roles", "first-middle-last"], "--roles: only for a program"),
        (
            ["--hidden", "64", "--dtype", "bfloat16", "--", "train.py"],
            "--hidden, --dtype: only for the built-in GPT",
        ),
    ],
)
def test_capture_options_the_job_would_not_use_are_refused(tmp_path, argv, says):
    from prism.capture.cli import app as capture_app

    _fails_cleanly(capture_app, ["-o", str(tmp_path / "c"), *argv], says)
    assert list(tmp_path.iterdir()) == []
