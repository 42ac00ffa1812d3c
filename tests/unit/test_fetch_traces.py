"""benchmarks/fetch_traces.py: a public trace is kept only when its content is the blob its
repository's tree records; the committed list names every trace completely."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fetch_traces.py"
_spec = importlib.util.spec_from_file_location("fetch_traces", SCRIPT)
fetch_traces = importlib.util.module_from_spec(_spec)
sys.modules["fetch_traces"] = fetch_traces  # its dataclass looks its module up
_spec.loader.exec_module(fetch_traces)


def test_a_files_id_is_the_one_git_gives_it() -> None:
    # `git hash-object` of an empty file and of "hello\n".
    assert fetch_traces.git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert fetch_traces.git_blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def _listed(tmp_path: Path, content: bytes, blob: str) -> tuple[Path, Path]:
    source = tmp_path / "checkout"
    (source / "tests" / "data").mkdir(parents=True)
    (source / "tests" / "data" / "t.json.gz").write_bytes(content)
    listed = tmp_path / "list.toml"
    listed.write_text(
        f'[[trace]]\njob = "a job"\ndir = "job"\nfile = "rank0.json.gz"\nrepo = "o/r"\ncommit = "{"0" * 40}"\n'
        f'path = "tests/data/t.json.gz"\ngit_blob = "{blob}"\nwhat = "a trace"\n'
    )
    return source, listed


def test_a_trace_whose_content_is_its_blob_is_kept_once(tmp_path: Path, capsys) -> None:
    source, listed = _listed(tmp_path, b"hello\n", "ce013625030ba8dba906f756967f9e9ca394464a")
    out = tmp_path / "traces"
    argv = ["--source", str(source), "--list", str(listed), "--out", str(out)]
    assert fetch_traces.main(argv) == 0
    assert (out / "job" / "rank0.json.gz").read_bytes() == b"hello\n"
    assert fetch_traces.main(argv) == 0
    assert "already there" in capsys.readouterr().out


def test_a_trace_of_other_content_is_not_kept(tmp_path: Path, capsys) -> None:
    source, listed = _listed(tmp_path, b"edited\n", "ce013625030ba8dba906f756967f9e9ca394464a")
    out = tmp_path / "traces"
    assert fetch_traces.main(["--source", str(source), "--list", str(listed), "--out", str(out)]) == 1
    assert "the list says ce013625" in capsys.readouterr().out
    assert not (out / "job").exists()


def test_the_committed_list_names_each_trace_at_a_pinned_commit_with_its_blob() -> None:
    traces = fetch_traces.read_list(fetch_traces.LIST)
    assert len(traces) >= 4
    for trace in traces:
        assert re.fullmatch(r"[0-9a-f]{40}", trace.commit) and re.fullmatch(r"[0-9a-f]{40}", trace.git_blob)
        assert trace.url.startswith(f"https://raw.githubusercontent.com/{trace.repo}/{trace.commit}/")
    assert len({(t.dir, t.file) for t in traces}) == len(traces)


def test_an_incomplete_entry_is_one_line(tmp_path: Path) -> None:
    listed = tmp_path / "list.toml"
    listed.write_text('[[trace]]\njob = "a job"\n')
    with pytest.raises(SystemExit, match="trace 1"):
        fetch_traces.read_list(listed)
