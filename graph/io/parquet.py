"""Write and read ``graph.parquet``, the format declared in ``prism.schemas.graph_format``.

Rows are sorted by (rank, stream, index) and every row group holds a fixed number of
consecutive ranks, so one rank is read by decoding one row group, found by binary search over
the ``rank`` statistics of the footer. Writing is deterministic: the same tables and metadata
give a byte-identical file (under the same pyarrow version, whose name is in the footer).
"""

from __future__ import annotations

import bisect
import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prism.schemas.graph_format import (
    ADDED_IN,
    COLUMNS,
    INDEX,
    LANE_COLUMNS,
    METADATA_KEY,
    RANK,
    SCHEMA,
    STAGE,
    STREAM,
    STREAMS_KEY,
    GraphMetadata,
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
MIN_RANKS_PER_ROW_GROUP = 32
MAX_ROW_GROUPS = 1024
"""A reader parses the whole footer, about 1.6 KiB a row group: at 1,024 row groups a one-shot
``read_rank`` spends ~12 ms opening the file and ~13 ms decoding its row group of 128 ranks
(131,072 ranks); 4,096 row groups of 32 took 45 ms to open alone."""


def ranks_per_row_group(world_size: int) -> int:
    """Ranks per row group by default: 32, more where the world would need over MAX_ROW_GROUPS."""
    return max(MIN_RANKS_PER_ROW_GROUP, -(-world_size // MAX_ROW_GROUPS))


class GraphFormatError(ValueError):
    """A file that is not a prism graph of the version this code reads."""


class GraphWriter:
    """Writes ``graph.parquet`` rank by rank; the file appears at ``path`` only on a clean close.

    ``write_ranks`` takes tables sorted by (rank, stream, index) whose ranks continue from the
    previous call (starting at rank 0); tables are buffered until a row group of
    ``ranks_per_row_group`` ranks is complete. Closing checks that every rank of the layout came.
    ``on_row_group`` is handed each row group as it is written (the build validates them).
    """

    def __init__(
        self, path: str | os.PathLike, metadata: GraphMetadata, ranks_per_row_group: int = 32,
        on_row_group: Callable[[pa.Table], None] | None = None,
    ):  # fmt: skip
        if ranks_per_row_group < 1:
            raise ValueError(f"ranks_per_row_group must be at least 1, got {ranks_per_row_group}")
        self.path = Path(path)
        self.metadata = metadata
        self.ranks_per_row_group = ranks_per_row_group
        self.world_size = ParallelLayout.from_dict(metadata.layout).world_size
        self._schema = schema_with_metadata(metadata).remove_metadata()
        # The temporary name never reaches the file's bytes: only the rename knows it.
        self._tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.Table] = []
        self._on_row_group = on_row_group
        self._group_first = 0  # first rank of the row group being buffered
        self._next_rank = 0  # rank the next table must start with
        self.row_groups = 0

    def __enter__(self) -> GraphWriter:
        self._writer = pq.ParquetWriter(
            self._tmp,
            self._schema.with_metadata(schema_with_metadata(self.metadata).metadata),
            compression=COMPRESSION,
            use_dictionary=DICTIONARY_COLUMNS,
            write_statistics=STATISTICS_COLUMNS,
            sorting_columns=SORTING,
            store_schema=True,  # keeps the dictionary types on read
        )
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
            self._require_open().close()
            os.replace(self._tmp, self.path)
        except BaseException:
            self._abort()
            raise

    def write_ranks(self, table: pa.Table) -> None:
        """Append the nodes of one or more consecutive ranks."""
        self._require_open()
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
        self._require_open().write_table(table, row_group_size=table.num_rows)
        self.row_groups += 1
        if self._on_row_group is not None:
            self._on_row_group(table)

    def _require_open(self) -> pq.ParquetWriter:
        if self._writer is None:
            raise RuntimeError("GraphWriter is used as a context manager: `with GraphWriter(...) as w:`")
        return self._writer

    def _abort(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):  # the original error matters, not this one
                self._writer.close()
        self._tmp.unlink(missing_ok=True)


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


class GraphReader:
    """An open ``graph.parquet``: its metadata, one rank at a time, or one row group at a time."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"{self.path}: no such file")
        try:
            self._file = pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError, UnicodeDecodeError) as e:  # a footer's names can decode badly
            raise GraphFormatError(f"{self.path}: not a Parquet file ({e})") from None
        self.metadata = _parse_metadata(self.path, self._file.schema_arrow)
        self._absent = _check_columns(self.path, self._file.schema_arrow, self.metadata)
        self._bounds: dict[int, tuple[int, int]] = {}

    def __enter__(self) -> GraphReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    @property
    def num_row_groups(self) -> int:
        return self._file.metadata.num_row_groups

    def row_groups_of(self, rank: int) -> list[int]:
        """Row groups whose rank statistics include ``rank`` (binary search: rows are sorted)."""
        n = self.num_row_groups
        first = bisect.bisect_left(range(n), rank, key=lambda i: self._rank_bounds(i)[1])
        last = first
        while last < n and self._rank_bounds(last)[0] <= rank:
            last += 1
        return list(range(first, last))

    def read_rank(self, rank: int, columns: Sequence[str] | None = None) -> pa.Table:
        """Nodes of one rank (empty if the file has none), reading only its row group(s)."""
        return pa.concat_tables(self.read_ranks([rank], columns))

    def read_ranks(self, ranks: Sequence[int], columns: Sequence[str] | None = None) -> list[pa.Table]:
        """Nodes of ``ranks`` (sorted, distinct): one table per row group that holds any of them,
        read one at a time (a single empty table if none does)."""
        wanted = list(columns) if columns is not None else list(COLUMNS)
        read = wanted if RANK in wanted else [*wanted, RANK]
        ranks = np.asarray(ranks, np.int64)
        if len(ranks) and (np.diff(ranks) <= 0).any():
            raise ValueError("ranks to read must be sorted and distinct")
        groups = sorted({g for r in ranks.tolist() for g in self.row_groups_of(r)})
        tables = []
        for group in groups:
            table = self.read_row_groups([group], read)
            tables.append(
                table.filter(pa.array(np.isin(table.column(RANK).to_numpy(), ranks))).select(wanted)
            )
        return tables or [SCHEMA.empty_table().select(wanted)]

    def read_row_groups(self, groups: Sequence[int], columns: Sequence[str] | None = None) -> pa.Table:
        """These row groups, checked as ``iter_rank_chunks`` checks each."""
        wanted = list(columns) if columns is not None else list(COLUMNS)
        with self._damage_is_format_error():
            table = self._file.read_row_groups(list(groups), columns=self._stored(wanted))
            table.validate(full=True)
        return self._completed(table, wanted)

    def iter_rank_chunks(self, columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
        """One row group (``ranks_per_row_group`` consecutive ranks) at a time."""
        wanted = list(columns) if columns is not None else list(COLUMNS)
        for i in range(self.num_row_groups):
            with self._damage_is_format_error():
                chunk = self._file.read_row_group(i, columns=self._stored(wanted))
                chunk.validate(full=True)
            yield self._completed(chunk, wanted)

    def _stored(self, wanted: list[str]) -> list[str]:
        """The columns of ``wanted`` the file holds (one of an earlier version lacks later ones)."""
        return [c for c in wanted if c not in self._absent]

    def _completed(self, table: pa.Table, wanted: list[str]) -> pa.Table:
        """``table`` with the columns the file lacks given their empty value, in ``wanted``'s order."""
        if not self._absent or not any(c in self._absent for c in wanted):
            return table
        for name in wanted:
            if name in self._absent:  # (lane_deps, the one column added since)
                table = table.append_column(SCHEMA.field(name), no_lane_deps(table.num_rows))
        return table.select(wanted)

    @property
    def num_rows(self) -> int:
        return self._file.metadata.num_rows

    def read_column(self, column: str) -> pa.ChunkedArray:
        """One column of every node of the graph."""
        if column in self._absent:
            return pa.chunked_array([no_lane_deps(self.num_rows)])
        with self._damage_is_format_error():
            table = self._file.read(columns=[column])
            table.validate(full=True)
            return table.column(column)

    def first_row(self, rank: int) -> int:
        """Global row of ``rank``'s first node: whole row groups before it by their statistics,
        then the rows before it in the one it starts in."""
        row = 0
        for group in range(self.num_row_groups):
            if self._rank_bounds(group)[1] < rank:
                row += self._file.metadata.row_group(group).num_rows
                continue
            with self._damage_is_format_error():
                ranks = self._file.read_row_group(group, columns=[RANK]).column(RANK).to_numpy()
            return row + int(np.searchsorted(ranks, rank))
        return row

    @contextlib.contextmanager
    def _damage_is_format_error(self) -> Iterator[None]:
        """A row group that does not decode (a file cut short or overwritten), or decodes to values
        Arrow cannot use (a dictionary index past its dictionary), is a GraphFormatError: the
        full validation is a few ms per million rows, and without it such a value crashes its reader."""
        try:
            yield
        except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
            raise GraphFormatError(f"{self.path}: damaged, a row group does not decode ({e})") from None

    def _rank_bounds(self, group: int) -> tuple[int, int]:
        if group not in self._bounds:
            stats = self._file.metadata.row_group(group).column(SCHEMA.get_field_index(RANK)).statistics
            if stats is None or not stats.has_min_max:
                raise GraphFormatError(f"{self.path}: row group {group} has no statistics on {RANK!r}")
            self._bounds[group] = (stats.min, stats.max)
        return self._bounds[group]


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
