"""Where the co-simulation's Unix socket lives: a socket path holds 107 bytes, and a user's (or a
test runner's) TMPDIR may be longer than that leaves room for."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from prism.replay.coordinator import SOCKET_NAME, SOCKET_PATH_BYTES, socket_directory


def _socket_fits(directory: Path) -> bool:
    return len(os.fsencode(directory / SOCKET_NAME)) <= SOCKET_PATH_BYTES


def test_the_socket_folder_is_private_and_in_tmpdir_when_it_fits(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    directory = socket_directory()
    assert directory.parent == tmp_path and _socket_fits(directory)
    assert directory.stat().st_mode & 0o777 == 0o700


def test_a_tmpdir_too_long_for_a_socket_falls_back_to_tmp(tmp_path, monkeypatch) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    directory = socket_directory()
    try:
        assert directory.parent == Path("/tmp") and _socket_fits(directory)
    finally:
        directory.rmdir()


def test_no_folder_that_fits_is_one_clear_error(tmp_path, monkeypatch) -> None:
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    monkeypatch.setattr("prism.replay.coordinator.SHORT_TMP", deep)
    with pytest.raises(OSError, match="set TMPDIR to a shorter one"):
        socket_directory()
