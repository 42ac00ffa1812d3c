"""``GraphWriter``: a graph written rank by rank, in row groups of consecutive ranks and, past
``ROW_GROUPS_PER_FILE`` row groups, in part files; deterministic bytes for the same rows."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prism.graph.io.file_layout import (
    COMPRESSION,
    DICTIONARY_COLUMNS,
    RANKS_PER_ROW_GROUP,
    ROW_GROUPS_PER_FILE,
    SORTING,
    STATISTICS_COLUMNS,
)
from prism.graph.io.parts import refuse_other_directory, replace_graph
from prism.schemas.graph_format import (
    ADDED_IN,
    COLUMNS,
    INDEX,
    LANE_COLUMNS,
    PART_KEY,
    RANK,
    SCHEMA,
    STREAM,
    STREAMS_KEY,
    GraphMetadata,
    PartInfo,
    empty_lists,
    schema_with_metadata,
)
from prism.schemas.layout import ParallelLayout


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
        self._rows = 0  # rows written, every part
        self._pending: list[pa.Table] = []
        self._on_row_group = on_row_group
        self._group_first = 0  # first rank of the row group being buffered
        self._next_rank = 0  # rank the next table must start with
        self.row_groups = 0

    def __enter__(self) -> GraphWriter:
        refuse_other_directory(self.path)  # before any work
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
        if self.row_groups % self.row_groups_per_file == 0:  # the first of a part
            self._open_next_part()
        assert self._writer is not None
        self._writer.write_table(table, row_group_size=table.num_rows)
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
    for column in ADDED_IN:  # list columns a table may leave out: every node's list empty
        if column in names and column not in table.column_names:
            table = table.append_column(SCHEMA.field(column), empty_lists(column, table.num_rows))
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
