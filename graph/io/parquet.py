"""Write and read ``graph.parquet``, the format declared in ``prism.schemas.graph_format``.

Rows are sorted by (rank, stream, index) and every row group holds a fixed number of
consecutive ranks, so one rank is read by decoding one row group, found by binary search over
the ``rank`` statistics of the footer. Every reader parses the whole footer of a file, so a file
holds at most ``ROW_GROUPS_PER_FILE`` row groups: a larger graph is a directory of part files
(``graph/io/parts.py``), and reading one rank opens only its part. Writing is deterministic: the
same tables and metadata give byte-identical files (under the same pyarrow version, whose name is
in the footer).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prism.graph.io.parts import NotAGraphError, is_graph_directory, list_parts, replace_graph
from prism.schemas.graph_format import (
    ADDED_IN,
    COLUMNS,
    INDEX,
    LANE_COLUMNS,
    METADATA_KEY,
    PART_KEY,
    RANK,
    SCHEMA,
    STAGE,
    STREAM,
    STREAMS_KEY,
    GraphMetadata,
    PartInfo,
    no_lane_deps,
    schema_with_metadata,
    stored_columns,
)
from prism.schemas.layout import ParallelLayout

COMPRESSION = "zstd"
# Statistics only where they prune: every row group holds every stream, index and op name, so
# their min/max would only grow the footer that each read_rank parses.
STATISTICS_COLUMNS = [RANK, STAGE]
SORTING = [pq.SortingColumn(SCHEMA.get_field_index(c)) for c in (RANK, STREAM, INDEX)]
# Parquet dictionaries only for the string columns: the integer columns repeat with every rank of
# a stage, which zstd finds as well, and building their dictionaries halved the writer's speed
# (6-9 against 12-14 M rows/s, files 1.36 against 1.18 bytes a node, on the default graph).
DICTIONARY_COLUMNS = [f.name for f in SCHEMA if pa.types.is_dictionary(f.type)]
RANKS_PER_ROW_GROUP = 32
ROW_GROUPS_PER_FILE = 512
"""A reader parses the whole footer of a file, about 1.6 KiB a row group: one-shot reads of a
rank of a 131,072-rank graph took 10-12 ms (median) from files of 512 row groups of 32 ranks,
16-17 ms from files of 1,024, most of the difference the footer. A graph of more row groups
is a directory of part files of this many each (16,384 ranks by default)."""


class GraphFormatError(ValueError):
    """A file that is not a prism graph of the version this code reads."""


class GraphWriter:
    """Writes ``graph.parquet`` rank by rank; the graph appears at ``path`` only on a clean close.

    ``write_ranks`` takes tables sorted by (rank, stream, index) whose ranks continue from the
    previous call (starting at rank 0); tables are buffered until a row group of
    ``ranks_per_row_group`` ranks is complete. A graph of more than ``row_groups_per_file`` row
    groups is written as a directory of part files of that many each. Closing checks that every
    rank of the layout came. ``on_row_group`` is handed each row group as it is written (the
    build validates them).
    """

    def __init__(
        self, path: str | os.PathLike, metadata: GraphMetadata, ranks_per_row_group: int = RANKS_PER_ROW_GROUP,
        on_row_group: Callable[[pa.Table], None] | None = None, row_groups_per_file: int = ROW_GROUPS_PER_FILE,
    ):  # fmt: skip
        if ranks_per_row_group < 1 or row_groups_per_file < 1:
            raise ValueError(
                "ranks_per_row_group and row_groups_per_file must be at least 1, "
                f"got {ranks_per_row_group} and {row_groups_per_file}"
            )
        self.path = Path(path)
        self.metadata = metadata
        self.ranks_per_row_group = ranks_per_row_group
        self.world_size = ParallelLayout.from_dict(metadata.layout).world_size
        self.row_groups_per_file = row_groups_per_file
        self.ranks_per_file = ranks_per_row_group * row_groups_per_file
        self.parts = -(-self.world_size // self.ranks_per_file)
        self._schema = schema_with_metadata(metadata).remove_metadata()
        # The temporary name never reaches the files' bytes: only the rename knows it.
        self._tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self._entered = False
        self._writer: pq.ParquetWriter | None = None  # of the part being written
        self._part_groups = 0  # row groups in that part so far
        self._rows = 0  # rows written, every part
        self._pending: list[pa.Table] = []
        self._on_row_group = on_row_group
        self._group_first = 0  # first rank of the row group being buffered
        self._next_rank = 0  # rank the next table must start with
        self.row_groups = 0

    def __enter__(self) -> GraphWriter:
        if self.path.is_dir() and not is_graph_directory(self.path):  # refused before any work
            raise NotAGraphError(f"{self.path} is a directory that is not a prism graph; it is left as it is")
        _discard(self._tmp)  # a leftover of an earlier process with this pid
        if self.parts > 1:
            self._tmp.mkdir()
        self._entered = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self._abort()
            return
        try:
            self._flush(final=True)
            if self._next_rank != self.world_size:
                raise ValueError(
                    f"graph incomplete: ranks 0..{self._next_rank - 1} written, "
                    f"the layout has {self.world_size} ranks"
                )
            self._close_part()
            replace_graph(self._tmp, self.path)
        except BaseException:
            self._abort()
            raise

    def write_ranks(self, table: pa.Table) -> None:
        """Append the nodes of one or more consecutive ranks."""
        self._require_entered()
        table = _conform(table, self._schema)
        if table.num_rows == 0:
            return
        ranks = table.column(RANK).to_numpy()
        _check_sorted(ranks, table.column(STREAM).to_numpy(), table.column(INDEX).to_numpy())
        if ranks[0] != self._next_rank:
            raise ValueError(
                f"ranks must be consecutive: expected rank {self._next_rank} next, got {ranks[0]}"
            )
        if ranks[-1] >= self.world_size:
            raise ValueError(f"rank {ranks[-1]} out of range for world size {self.world_size}")
        self._next_rank = int(ranks[-1]) + 1
        self._pending.append(table)
        self._flush(final=False)

    def _flush(self, *, final: bool) -> None:
        complete = (self._next_rank - self._group_first) // self.ranks_per_row_group
        if not self._pending or not (complete or final):
            return
        buffered = pa.concat_tables(self._pending)
        ranks = buffered.column(RANK).to_numpy()
        start = 0
        for _ in range(complete):
            self._group_first += self.ranks_per_row_group
            cut = int(np.searchsorted(ranks, self._group_first))
            self._write_row_group(buffered.slice(start, cut - start))
            start = cut
        self._pending = [buffered.slice(start)] if start < buffered.num_rows else []
        if final and self._pending:
            self._write_row_group(self._pending.pop())
            self._group_first = self._next_rank

    def _write_row_group(self, table: pa.Table) -> None:
        table = _canonical(table)
        if self._writer is None or self._part_groups == self.row_groups_per_file:
            self._open_next_part()
        self._require_entered()
        assert self._writer is not None
        self._writer.write_table(table, row_group_size=table.num_rows)
        self._part_groups += 1
        self._rows += table.num_rows
        self.row_groups += 1
        if self._on_row_group is not None:
            self._on_row_group(table)

    def _open_next_part(self) -> None:
        """Close the part being written and open the next: the only one in a graph of one part, a
        file of the directory (with its ``PartInfo``) in a graph of several."""
        self._close_part()
        schema = schema_with_metadata(self.metadata)
        target = self._tmp
        if self.parts > 1:
            first = self.row_groups * self.ranks_per_row_group
            info = PartInfo(
                first_rank=first, ranks=min(self.ranks_per_file, self.world_size - first),
                first_row=self._rows, parts=self.parts,
            )  # fmt: skip
            schema = schema.with_metadata({**schema.metadata, PART_KEY: info.to_bytes()})
            target = self._tmp / info.name
        self._writer = pq.ParquetWriter(
            target,
            schema,
            compression=COMPRESSION,
            use_dictionary=DICTIONARY_COLUMNS,
            write_statistics=STATISTICS_COLUMNS,
            sorting_columns=SORTING,
            store_schema=True,  # keeps the dictionary types on read
        )
        self._part_groups = 0

    def _close_part(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _require_entered(self) -> None:
        if not self._entered:
            raise RuntimeError("GraphWriter is used as a context manager: `with GraphWriter(...) as w:`")

    def _abort(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):  # the original error matters, not this one
                self._writer.close()
            self._writer = None
        _discard(self._tmp)


def _discard(path: Path) -> None:
    """Remove a writer's own temporary file or directory, whatever it holds by now."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with the columns of ``schema``, in its order and types (``LANE_COLUMNS`` may be
    left out of a table of a graph that does not hold them)."""
    names = schema.names
    missing = [c for c in names if c not in table.column_names]
    extra = [c for c in table.column_names if c not in COLUMNS]
    if missing or extra:
        raise ValueError(f"table does not match the graph schema: missing {missing}, unknown {extra}")
    dropped = [c for c in LANE_COLUMNS if c in table.column_names and c not in names]
    if any(len(table.column(c).combine_chunks().flatten()) for c in dropped):
        raise ValueError(f"lane dependencies in a graph whose metadata names no streams ({STREAMS_KEY!r})")
    table = table.select(names)
    nulls = [c for c in names if table.column(c).null_count]
    if nulls:
        raise ValueError(f"graph columns may not hold nulls (use -1 / '' for 'does not apply'): {nulls}")
    if table.schema.equals(schema):
        return table
    try:
        return table.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise ValueError(f"table does not match the graph schema: {e}") from None


def _canonical(table: pa.Table) -> pa.Table:
    """One dictionary per string column, holding the values used, in first-use order.

    Input dictionaries may carry unused values or another order (a slice of a bigger table,
    tables built apart); this makes the bytes depend on the rows alone. One dictionary per
    column chunk also avoids Parquet's fallback to plain encoding when a dictionary changes.
    """
    table = table.unify_dictionaries()
    for i, f in enumerate(table.schema):
        if pa.types.is_dictionary(f.type):
            column = table.column(i).combine_chunks()
            used = pc.unique(column.indices)  # Arrow's unique keeps first-occurrence order
            remap = np.zeros(len(column.dictionary), np.int32)
            remap[used.to_numpy()] = np.arange(len(used), dtype=np.int32)
            indices = pc.take(pa.array(remap), column.indices)
            table = table.set_column(
                i, f, pa.DictionaryArray.from_arrays(indices, column.dictionary.take(used))
            )
    return table


def _check_sorted(rank: np.ndarray, stream: np.ndarray, index: np.ndarray) -> None:
    dr, ds, di = (np.diff(a.astype(np.int64)) for a in (rank, stream, index))
    ordered = (dr > 0) | ((dr == 0) & ((ds > 0) | ((ds == 0) & (di > 0))))
    if not ordered.all():
        i = int(np.argmin(ordered)) + 1
        raise ValueError(
            f"rows not sorted by (rank, stream, index): row {i} (rank {rank[i]}, stream {stream[i]}, "
            f"index {index[i]}) follows (rank {rank[i - 1]}, stream {stream[i - 1]}, index {index[i - 1]})"
        )
    if (dr > 1).any():
        i = int(np.argmax(dr > 1)) + 1
        raise ValueError(f"ranks must be consecutive: rank {rank[i]} follows rank {rank[i - 1]}")


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
        return last + 1 if last is not None else ParallelLayout.from_dict(self.metadata.layout).world_size

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
            return pa.chunked_array([no_lane_deps(self.num_rows)])
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
        return bisect.bisect_right([p.first_rank for p in self._parts], rank) - 1

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
            if name in self._absent:  # (lane_deps, the one column added since)
                table = table.append_column(SCHEMA.field(name), no_lane_deps(table.num_rows))
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
        part.first_row = self._check_part(part, schema, metadata)
        part.file = file
        return file

    def _check_part(self, part: _Part, schema: pa.Schema, metadata: GraphMetadata) -> int:
        """A part's ``PartInfo`` agrees with its name and the graph's ranks; its first row."""
        raw = (schema.metadata or {}).get(PART_KEY)
        world = ParallelLayout.from_dict(metadata.layout).world_size
        if part.last_rank is None:  # the graph's only file
            if raw is not None and PartInfo.from_bytes(raw).parts > 1:
                raise GraphFormatError(f"{part.path}: one part of a graph of several; read its directory")
            return 0
        if raw is None:
            raise GraphFormatError(f"{part.path}: a part file without its {PART_KEY.decode()!r} metadata")
        try:
            info = PartInfo.from_bytes(raw)
        except (ValueError, TypeError) as e:
            raise GraphFormatError(f"{part.path}: {e}") from None
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
            row_group = self._open(part).metadata.row_group(group)
            stats = row_group.column(SCHEMA.get_field_index(RANK)).statistics
            if stats is None or not stats.has_min_max:
                path = self._parts[part].path
                raise GraphFormatError(f"{path}: row group {group} has no statistics on {RANK!r}")
            self._bounds[part, group] = (stats.min, stats.max)
        return self._bounds[part, group]


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
