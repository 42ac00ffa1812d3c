"""A graph on disk: one Parquet file, or a directory of part files (``PartInfo``).

Whichever it is, these put a graph in place, remove it and size it, and never touch a path
that is not a graph (a directory of other files given as an output by mistake).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from prism.schemas.graph_format import PART_PATTERN


class NotAGraphError(ValueError):
    """A path that holds something other than a prism graph, where one was to be replaced."""


@dataclass(frozen=True)
class PartFile:
    """A part file as its name lists it."""

    path: Path
    first_rank: int
    last_rank: int


def list_parts(directory: Path) -> list[PartFile]:
    """The part files of a graph directory, by first rank; their names must cover ranks 0.. without
    a gap or an overlap (dot files are left aside). Raises ValueError naming what is wrong."""
    parts, strays = [], []
    for entry in os.scandir(directory):
        if entry.name.startswith("."):
            continue
        match = PART_PATTERN.fullmatch(entry.name)
        if match is None or not entry.is_file():
            strays.append(entry.name)
            continue
        parts.append(PartFile(Path(entry.path), int(match[1]), int(match[2])))
    if strays:
        raise ValueError(f"{directory}: not a graph directory: {sorted(strays)[0]!r} is not a part file")
    if not parts:
        raise ValueError(f"{directory}: not a graph directory: it holds no part file")
    parts.sort(key=lambda p: p.first_rank)
    expected = 0
    for part in parts:
        if part.first_rank != expected or part.last_rank < part.first_rank:
            raise ValueError(
                f"{directory}: part {part.path.name} does not follow rank {expected - 1} "
                "(a part file is missing or renamed)"
            )
        expected = part.last_rank + 1
    return parts


def is_graph_directory(path: Path) -> bool:
    try:
        list_parts(path)
    except (ValueError, OSError):
        return False
    return True


def refuse_other_directory(path: Path) -> None:
    """Raise NotAGraphError where ``path`` is a directory that is not a graph (a graph may be
    written, replaced or removed there otherwise)."""
    if path.is_dir() and not is_graph_directory(path):
        raise NotAGraphError(f"{path} is a directory that is not a prism graph; it is left as it is")


def remove_graph(path: Path) -> None:
    """Remove the graph at ``path``, a file or a graph directory (nothing if absent)."""
    if path.is_dir() and not path.is_symlink():
        refuse_other_directory(path)
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def replace_graph(new: Path, target: Path) -> None:
    """Put the graph at ``new`` in place of whatever graph is at ``target``.

    A file replaces a file at once (``os.replace``); where either is a directory, the old one is
    first renamed aside, so that ``target`` is never a mix of both."""
    if not (new.is_dir() or target.is_dir()) or not target.exists():
        os.replace(new, target)
        return
    refuse_other_directory(target)
    aside = target.with_name(f".{target.name}.{os.getpid()}.old")
    remove_graph(aside)
    os.replace(target, aside)
    os.replace(new, target)
    remove_graph(aside)


def graph_bytes(path: Path) -> int:
    """Bytes the graph takes on disk (its files together)."""
    if path.is_dir():
        return sum(part.path.stat().st_size for part in list_parts(path))
    return path.stat().st_size
