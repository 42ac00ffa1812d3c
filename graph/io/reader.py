"""``GraphReader``: a graph file or directory read one rank, one row group or one column at a
time, each file checked as it is opened."""

from __future__ import annotations

import bisect
import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from prism.graph.io.file_layout import GraphFormatError
from prism.graph.io.parts import list_parts
from prism.schemas.graph_format import (
    ADDED_IN,
    COLUMNS,
    METADATA_KEY,
    PART_KEY,
    RANK,
    SCHEMA,
    GraphMetadata,
    PartInfo,
    empty_lists,
    stored_columns,
)
from prism.schemas.layout import LayoutError, ParallelLayout


@dataclass
class _Part:
    """One file of a graph: the only one, or a part of its directory (ranks as its name says)."""

    path: Path
    first_rank: int
    last_rank: int | None  # None: the graph's only file, whose ranks its metadata gives
    file: pq.ParquetFile | None = None
    first_row: int = 0


class GraphReader:
    """An open graph: its metadata, one rank at a time, or one row group at a time.

    ``path`` is a graph file or a graph directory; a directory's part files are opened only as
    they are needed (reading one rank opens one), each checked against the others then."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"{self.path}: no such file")
        self._metadata: GraphMetadata | None = None
        self._absent: frozenset[str] = frozenset()
        self._bounds: dict[tuple[int, int], tuple[int, int]] = {}
        if self.path.is_dir():
            try:
                listed = list_parts(self.path)
            except ValueError as e:
                raise GraphFormatError(str(e)) from None
            self._parts = [_Part(p.path, p.first_rank, p.last_rank) for p in listed]
        else:
            self._parts = [_Part(self.path, 0, None)]
        self._first_ranks = [p.first_rank for p in self._parts]
        if self._parts[0].last_rank is None:
            self._open(0)  # a bad file is an error at once

    def __enter__(self) -> GraphReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for part in self._parts:
            if part.file is not None:
                part.file.close()
                part.file = None

    @property
    def metadata(self) -> GraphMetadata:
        """The graph's metadata (of the first part opened: every part holds the same)."""
        if self._metadata is None:
            self._open(0)
        assert self._metadata is not None
        return self._metadata

    @property
    def world_size(self) -> int:
        """Ranks in the graph (a directory's from the names of its parts, opening none)."""
        last = self._parts[-1].last_rank
        return last + 1 if last is not None else _world_of(self._parts[0].path, self.metadata)

    @property
    def num_parts(self) -> int:
        """Files of the graph: 1, or the part files of its directory."""
        return len(self._parts)

    @property
    def num_row_groups(self) -> int:
        return sum(self._open(k).metadata.num_row_groups for k in range(len(self._parts)))

    @property
    def num_rows(self) -> int:
        return sum(self._open(k).metadata.num_rows for k in range(len(self._parts)))

    def read_rank(self, rank: int, columns: Sequence[str] | None = None) -> pa.Table:
        """Nodes of one rank (empty if the graph has none), reading only its row group(s)."""
        return pa.concat_tables(self.read_ranks([rank], columns))

    def read_ranks(self, ranks: Sequence[int], columns: Sequence[str] | None = None) -> list[pa.Table]:
        """Nodes of ``ranks`` (sorted, distinct): one table per row group that holds any of them,
        read one at a time (a single empty table if none does)."""
        wanted = list(columns) if columns is not None else list(COLUMNS)
        read = wanted if RANK in wanted else [*wanted, RANK]
        ranks = np.asarray(ranks, np.int64)
        if len(ranks) and (np.diff(ranks) <= 0).any():
            raise ValueError("ranks to read must be sorted and distinct")
        groups: dict[tuple[int, int], None] = {}  # in rank order, each once
        for rank in ranks.tolist():
            part = self._part_of(rank)
            if part is not None:
                groups.update(dict.fromkeys((part, g) for g in self._row_groups_of(part, rank)))
        tables = []
        for part, group in groups:
            table = self._read_row_group(part, group, read)
            tables.append(
                table.filter(pa.array(np.isin(table.column(RANK).to_numpy(), ranks))).select(wanted)
            )
        return tables or [SCHEMA.empty_table().select(wanted)]

    def iter_rank_chunks(self, columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
        """One row group (``ranks_per_row_group`` consecutive ranks) at a time, in rank order."""
        wanted = list(columns) if columns is not None else list(COLUMNS)
        for part in range(len(self._parts)):
            for group in range(self._open(part).metadata.num_row_groups):
                yield self._read_row_group(part, group, wanted)

    def read_column(self, column: str) -> pa.ChunkedArray:
        """One column of every node of the graph."""
        if column in self._absent:
            return pa.chunked_array([empty_lists(column, self.num_rows)])
        chunks = []
        for part in range(len(self._parts)):
            file = self._open(part)
            with self._damage_is_format_error(part):
                table = file.read(columns=[column])
                table.validate(full=True)
            chunks.extend(table.column(column).chunks)
        return pa.chunked_array(chunks, SCHEMA.field(column).type)

    def first_row(self, rank: int) -> int:
        """Global row of ``rank``'s first node (the row count, past the last rank): the rows of the
        parts and whole row groups before it, then those before it in the one it starts in."""
        part = self._part_of(rank)
        if part is None:
            return self.num_rows if rank >= 0 else 0
        file = self._open(part)
        row = self._parts[part].first_row
        for group in range(file.metadata.num_row_groups):
            if self._rank_bounds(part, group)[1] < rank:
                row += file.metadata.row_group(group).num_rows
                continue
            with self._damage_is_format_error(part):
                ranks = file.read_row_group(group, columns=[RANK]).column(RANK).to_numpy()
            return row + int(np.searchsorted(ranks, rank))
        return row

    def _part_of(self, rank: int) -> int | None:
        """The part that holds ``rank``, None for a rank outside the graph."""
        if not 0 <= rank < self.world_size:
            if rank > 0:  # past the last part's name: that part says whether the graph has more
                self._open(len(self._parts) - 1)
            return None
        return bisect.bisect_right(self._first_ranks, rank) - 1

    def _row_groups_of(self, part: int, rank: int) -> list[int]:
        """Row groups of ``part`` whose rank statistics include ``rank`` (binary search: rows are sorted)."""
        n = self._open(part).metadata.num_row_groups
        first = bisect.bisect_left(range(n), rank, key=lambda g: self._rank_bounds(part, g)[1])
        last = first
        while last < n and self._rank_bounds(part, last)[0] <= rank:
            last += 1
        return list(range(first, last))

    def _read_row_group(self, part: int, group: int, wanted: list[str]) -> pa.Table:
        """One row group, fully validated, with the columns the file lacks completed."""
        file = self._open(part)
        with self._damage_is_format_error(part):
            table = file.read_row_group(group, columns=[c for c in wanted if c not in self._absent])
            table.validate(full=True)
        return self._completed(table, wanted)

    def _completed(self, table: pa.Table, wanted: list[str]) -> pa.Table:
        """``table`` with the columns the file lacks given their empty value, in ``wanted``'s order."""
        if not self._absent or not any(c in self._absent for c in wanted):
            return table
        for name in wanted:
            if name in self._absent:  # (a list column added since the file's version)
                table = table.append_column(SCHEMA.field(name), empty_lists(name, table.num_rows))
        return table.select(wanted)

    def _open(self, index: int) -> pq.ParquetFile:
        """The file of part ``index``, opened and checked against the parts opened before."""
        part = self._parts[index]
        if part.file is not None:
            return part.file
        try:
            file = pq.ParquetFile(part.path)
        except (pa.ArrowException, OSError, UnicodeDecodeError) as e:  # a footer's names can decode badly
            raise GraphFormatError(f"{part.path}: not a Parquet file ({e})") from None
        schema = file.schema_arrow
        metadata = _parse_metadata(part.path, schema)
        absent = _check_columns(part.path, schema, metadata)
        if self._metadata is None:
            self._metadata, self._absent = metadata, absent
        elif metadata != self._metadata:
            raise GraphFormatError(f"{part.path}: its metadata is not that of the graph's other parts")
        part.first_row = self._check_part(part, file, schema, metadata)
        part.file = file
        return file

    def _check_part(
        self, part: _Part, file: pq.ParquetFile, schema: pa.Schema, metadata: GraphMetadata
    ) -> int:
        """A part's ``PartInfo`` agrees with its name and the graph's ranks; its first row."""
        raw = (schema.metadata or {}).get(PART_KEY)
        if raw is None and part.last_rank is not None:
            raise GraphFormatError(f"{part.path}: a part file without its {PART_KEY.decode()!r} metadata")
        try:
            info = None if raw is None else PartInfo.from_bytes(raw)
        except (ValueError, TypeError) as e:
            raise GraphFormatError(f"{part.path}: {e}") from None
        if part.last_rank is None:  # the graph's only file
            if info is not None and info.parts > 1:
                raise GraphFormatError(f"{part.path}: one part of a graph of several; read its directory")
            _check_rank_span(part.path, file, metadata)
            return 0
        world = _world_of(part.path, metadata)
        held = (info.first_rank, info.first_rank + info.ranks - 1, info.parts, world)
        listed = (part.first_rank, part.last_rank, len(self._parts), self.world_size)
        if held != listed:
            raise GraphFormatError(
                f"{part.path}: holds ranks {held[0]}..{held[1]} of {held[3]}, one of {held[2]} parts; "
                f"the directory lists it as ranks {listed[0]}..{listed[1]} of {listed[3]}, one of "
                f"{listed[2]} parts (a part file is missing, renamed or of another graph)"
            )
        if info.first_rank == 0 and info.first_row != 0:
            raise GraphFormatError(f"{part.path}: the first part starts at row {info.first_row}")
        return info.first_row

    @contextlib.contextmanager
    def _damage_is_format_error(self, part: int) -> Iterator[None]:
        """A row group that does not decode (a file cut short or overwritten), or decodes to values
        Arrow cannot use (a dictionary index past its dictionary), is a GraphFormatError: the
        full validation is a few ms per million rows, and without it such a value crashes its reader."""
        try:
            yield
        except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
            path = self._parts[part].path
            raise GraphFormatError(f"{path}: damaged, a row group does not decode ({e})") from None

    def _rank_bounds(self, part: int, group: int) -> tuple[int, int]:
        if (part, group) not in self._bounds:
            bounds = _row_group_ranks(self._open(part), group)
            if bounds is None:
                path = self._parts[part].path
                raise GraphFormatError(f"{path}: row group {group} has no statistics on {RANK!r}")
            self._bounds[part, group] = bounds
        return self._bounds[part, group]


def _check_rank_span(path: Path, file: pq.ParquetFile, metadata: GraphMetadata) -> None:
    """A graph file's rows end at the last rank of its metadata's world, by the footer's rank
    statistics (no row read): a layout edited to more or fewer ranks than the rows hold is an error
    at open, not ranks that simulate as idle or fall outside every group."""
    groups = file.metadata.num_row_groups
    bounds = _row_group_ranks(file, groups - 1) if groups else None
    world = _world_of(path, metadata)
    if bounds is not None and bounds[1] != world - 1:
        raise GraphFormatError(
            f"{path}: its rows end at rank {bounds[1]}, its metadata's layout has {world} ranks (0..{world - 1})"
        )


def _world_of(path: Path, metadata: GraphMetadata) -> int:
    """The world size of the metadata's layout (a GraphFormatError for a layout that is none)."""
    try:
        return ParallelLayout.from_dict(metadata.layout).world_size
    except (LayoutError, KeyError, TypeError, ValueError) as e:
        raise GraphFormatError(
            f"{path}: the metadata's layout is not one ({type(e).__name__}: {e})"
        ) from None


def _row_group_ranks(file: pq.ParquetFile, group: int) -> tuple[int, int] | None:
    """The first and last rank of a row group, from the footer's statistics (None without them)."""
    stats = file.metadata.row_group(group).column(SCHEMA.get_field_index(RANK)).statistics
    return (stats.min, stats.max) if stats is not None and stats.has_min_max else None


def _parse_metadata(path: Path, schema: pa.Schema) -> GraphMetadata:
    raw = (schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise GraphFormatError(f"{path}: not a prism graph (no {METADATA_KEY.decode()!r} metadata)")
    try:
        return GraphMetadata.from_bytes(raw)
    except (ValueError, TypeError) as e:
        raise GraphFormatError(f"{path}: {e}") from None


def _check_columns(path: Path, schema: pa.Schema, metadata: GraphMetadata) -> frozenset[str]:
    """Every column the file is to hold is there with its type (``stored_columns``; one of an
    earlier version lacks the later ones); returns the columns it lacks."""
    absent = set()
    stored = stored_columns(metadata)
    for field in SCHEMA:
        if field.name not in schema.names:
            if metadata.version < ADDED_IN.get(field.name, 0) or field.name not in stored:
                absent.add(field.name)
                continue
            raise GraphFormatError(f"{path}: column {field.name!r} is missing")
        found = schema.field(field.name).type
        if found != field.type:
            raise GraphFormatError(f"{path}: column {field.name!r} has type {found}, expected {field.type}")
    return frozenset(absent)


def read_metadata(path: str | os.PathLike) -> GraphMetadata:
    """File-level metadata of a graph (reads the footer only)."""
    with GraphReader(path) as reader:
        return reader.metadata


def read_rank(path: str | os.PathLike, rank: int, columns: Sequence[str] | None = None) -> pa.Table:
    """Nodes of one rank, decoding only the row group that holds it."""
    with GraphReader(path) as reader:
        return reader.read_rank(rank, columns)


def iter_rank_chunks(path: str | os.PathLike, columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
    """Row groups one at a time (bounded memory). Opens the file now, so errors raise here."""
    reader = GraphReader(path)

    def chunks() -> Iterator[pa.Table]:
        with reader:
            yield from reader.iter_rank_chunks(columns)

    return chunks()
