"""Check that ``graph.parquet`` is a well-formed full-scale graph, streaming over its row groups.

Per row group: sort order, contiguous indices, stage of each rank, ``deps`` pointing backwards,
``lane_deps`` pointing at nodes of the rank's other streams.
The comm rows are kept (as numpy arrays) until the scan has passed every rank that could hold
the rest of their collective instance or transfer pair (the last member of the group their row
names, the later of a send's two ranks), then checked: every collective instance has exactly its
group's members with equal attributes; every send meets exactly one recv. Rows are sorted by
rank, so tensor-parallel collectives and pipeline transfers are checked a row group or two after
they are read and memory stays flat in the world size; only collectives over groups that span
the world (data parallel, ``world``) wait for the end (those checks: ``prism.graph.io.validate_comm``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism.graph.io.lanes import lane_dep_rows
from prism.graph.io.parquet import GraphReader
from prism.graph.io.validate_comm import (
    _COLL_KEEP,
    _KEPT_TYPES,
    _P2P_KEEP,
    _STRINGS,
    Cols,
    _check_p2p,
    _coll_key,
    _Collectives,
    _later_rank,
    _pair_key,
    _Pending,
    _Problems,
    _Strings,
    group_table,
)
from prism.schemas import graph_format as gf
from prism.schemas.layout import AXES, LayoutError, ParallelLayout

_INTS = (gf.RANK, gf.STREAM, gf.INDEX, gf.STAGE, gf.COLL_ID, gf.GROUP_INDEX, gf.GROUP_SIZE)
_INTS += (gf.PEER, gf.P2P_SEQ, gf.BYTES)
_AMOUNTS = (gf.DUR_NS, gf.GAP_NS, gf.SKEW_NS, gf.ALLOC_BYTES, gf.FREE_BYTES)
"""Durations and memory: never negative, and a rank's sum of times far from int64's end."""
MAX_RANK_NS = 2**56
"""A rank's durations, gaps and skews summed over one iteration above this (833 days) are a
corrupt value, not a job: the simulation adds them up over ranks and iterations in int64 ns."""


class GraphValidationError(ValueError):
    """A graph that failed validation."""


@dataclass(frozen=True, kw_only=True)
class ValidationReport:
    """What validate_graph found."""

    path: str
    """The file checked."""
    problems: tuple[str, ...]
    """One line per problem, at most MAX_PROBLEMS of them."""
    problem_count: int
    """All problems found, including those past the cap."""
    ranks: int = 0
    """Distinct ranks present."""
    nodes: int = 0
    """Rows of the file."""
    collectives: int = 0
    """Collective instances (distinct coll_id)."""
    p2p_pairs: int = 0
    """Matched send/recv pairs."""
    bytes_by_group: dict[str, int] = field(default_factory=dict)
    """Payload bytes summed over members (collectives) or over sends (p2p), by group kind."""

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    def raise_if_failed(self) -> None:
        if not self.ok:
            more = f" (and {self.problem_count - 1} more problems)" if self.problem_count > 1 else ""
            raise GraphValidationError(f"{self.path}: {self.problems[0]}{more}")


def validate_graph(
    path: str | os.PathLike, *, progress: Callable[[int, int], None] | None = None
) -> ValidationReport:
    """Validate a graph file (GraphFormatError if it is not a prism graph of this version).

    ``progress(done, total)`` is called after each row group.
    """
    with GraphReader(path) as reader:
        try:
            layout = ParallelLayout.from_dict(reader.metadata.layout)
        except (LayoutError, KeyError, TypeError) as e:
            return ValidationReport(
                path=str(path), problems=(f"metadata layout is invalid: {e}",), problem_count=1
            )
        scan = _Scan(layout, streams=gf.STREAMS_KEY in reader.metadata.extra)
        _check_model(reader.metadata.model, layout, scan.problems)
        for done, chunk in enumerate(
            reader.iter_rank_chunks([*_INTS, *_STRINGS, *_AMOUNTS, gf.DEPS, gf.LANE_DEPS, gf.SPLIT_BYTES]),
            start=1,
        ):
            scan.chunk(chunk)
            if progress is not None:
                progress(done, reader.num_row_groups)
    return scan.report(str(path))


class RowGroupValidator:
    """Validates a graph's row groups as they are written, on a thread of its own.

    What ``validate_graph`` checks of a file, checked of the row groups a ``GraphWriter`` hands
    to ``put`` (its ``on_row_group``), without reading them back. The check runs beside the
    writing: numpy's array operations and Parquet's encoder release the GIL, so on a machine with
    two cores or more the build's validation costs little wall time. A context manager: leaving
    it stops the thread, leaving it on an exception lets the thread go unwaited; ``report`` waits
    for the last row group and gives the verdict.
    """

    def __init__(self, layout: ParallelLayout, model: dict) -> None:
        self._scan = _Scan(layout)
        _check_model(model, layout, self._scan.problems)
        self._queue: queue.Queue[pa.Table | None] = queue.Queue(maxsize=4)  # bounded: memory stays flat
        self._error: BaseException | None = None
        self._abandoned = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prism-validate", daemon=True)
        self._thread.start()

    def __enter__(self) -> RowGroupValidator:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self._stop()
        else:
            self._abandon()

    def put(self, table: pa.Table) -> None:
        """Check ``table``, the next row group in rank order (queued; returns at once)."""
        if self._error is not None:
            raise self._error
        self._queue.put(table)

    def report(self, path: str) -> ValidationReport:
        """The verdict on every row group put, once the thread has checked them all."""
        self._stop()
        if self._error is not None:
            raise self._error
        return self._scan.report(path)

    def _stop(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _abandon(self) -> None:
        """Left on an error or a signal: no verdict is wanted, so the thread is not waited for. A
        signal raised inside the queue's ``notify`` can lose the wakeup that would end the thread
        (a released waiter left behind, CPython's gh-92530 fixed only in part), and waiting for it
        would hang the stopped command. The daemon thread ends at its next row group or with the process."""
        self._abandoned.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)

    def _run(self) -> None:
        while not self._abandoned.is_set() and (table := self._queue.get()) is not None:
            if self._error is None:  # after a failure keep taking, so that put never blocks
                try:
                    self._scan.chunk(table)
                except BaseException as e:  # handed to the writing thread by put and report
                    self._error = e


def _check_model(model: dict, layout: ParallelLayout, problems: _Problems) -> None:
    for axis in AXES:
        if axis in model and model[axis] != layout.degree(axis):
            problems.add(f"metadata model has {axis}={model[axis]}, the layout {axis}={layout.degree(axis)}")


class _Scan:
    """Per-row-group checks; keeps the comm rows for the cross-rank checks at the end."""

    def __init__(self, layout: ParallelLayout, *, streams: bool = False) -> None:
        self.layout, self.world = layout, layout.world_size
        self.streams = streams  # the metadata names several streams a rank
        self.problems, self.strings = _Problems(), _Strings()
        self.kinds = {k: self.strings.id(k.value) for k in gf.NodeKind}
        self.seen = np.zeros(self.world, bool)
        self.last = (-1, -1, -1)  # (rank, stream, index) of the previous row group's last row
        self.nodes = 0
        self.coll = _Pending(_COLL_KEEP)
        self.p2p = _Pending(_P2P_KEEP)
        self.collectives = self.p2p_pairs = 0
        self.nbytes: dict[str, int] = {}

    def chunk(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        c = {name: table.column(name).to_numpy().astype(np.int64) for name in _INTS}
        c |= {name: self.strings.codes(table.column(name)) for name in _STRINGS}
        self.nodes += table.num_rows
        self._order(c)
        self._ranks_stages_kinds(c)
        self._deps(c, table.column(gf.DEPS).combine_chunks())
        if gf.LANE_DEPS in table.column_names:
            self._lane_deps(c, table.column(gf.LANE_DEPS).combine_chunks())
        if not self.streams:  # read as one stream a rank: nothing may be off stream 0
            r, s, index = c[gf.RANK], c[gf.STREAM], c[gf.INDEX]
            self.problems.per_rank(s != 0, r, lambda k: (
                f"rank {r[k]} stream {s[k]} index {index[k]}: a stream beyond 0 in a graph whose metadata "
                f"names no streams ({gf.STREAMS_KEY!r})"))  # fmt: skip
        self._amounts(c, table)
        if gf.SPLIT_BYTES in table.column_names:
            self._splits(c, table.column(gf.SPLIT_BYTES).combine_chunks())
        kind = c[gf.KIND]
        coll = kind == self.kinds[gf.NodeKind.COLLECTIVE]
        p2p = (kind == self.kinds[gf.NodeKind.SEND]) | (kind == self.kinds[gf.NodeKind.RECV])
        # Collective rows are the bulk of what is kept: int32 where the schema has no more.
        rows = {k: c[k][coll].astype(_KEPT_TYPES.get(k, np.int32)) for k in _COLL_KEEP}
        self.coll.add(rows, self._last_member(rows), self.last[0])
        rows = {k: c[k][p2p] for k in _P2P_KEEP}
        self.p2p.add(rows, _later_rank(rows, self.world), self.last[0])
        self.last = (int(c[gf.RANK][-1]), int(c[gf.STREAM][-1]), int(c[gf.INDEX][-1]))
        # A rank's rows may continue in the next row group: only the ranks before the last are done.
        self._check_settled(self.last[0] - 1)

    def _last_member(self, rows: Cols) -> np.ndarray:
        """Per collective row, the last rank of the group it names (the world's end for a group the
        layout has not, -1 without a coll_id: checked at once)."""
        last = np.full(rows[gf.RANK].size, self.world, np.int64)
        last[rows[gf.COLL_ID] < 0] = -1
        kinds, index = rows[gf.GROUP_KIND], rows[gf.GROUP_INDEX]
        for kind in np.unique(kinds):
            name = self.strings.names[kind]
            table = group_table(self.layout, name)
            count = 0 if table is None else table.count
            sel = (kinds == kind) & (index >= 0) & (index < count) & (rows[gf.COLL_ID] >= 0)
            if sel.any():
                last[sel] = table.last[index[sel]]
        return last

    def _check_settled(self, passed: int) -> None:
        """Check the collective instances and transfer pairs no rank after ``passed`` can add to."""
        settled = self.coll.take(passed, _coll_key)
        if settled:
            check = _Collectives(settled, self.layout, self.strings, self.problems)
            self.collectives += check.check(self.nbytes)
        settled = self.p2p.take(passed, _pair_key)
        if settled:
            self.p2p_pairs += _check_p2p(settled, self, self.nbytes)

    def _order(self, c: Cols) -> None:
        r, s, i = c[gf.RANK], c[gf.STREAM], c[gf.INDEX]
        pr, ps, pi = (np.r_[prev, a[:-1]] for prev, a in zip(self.last, (r, s, i), strict=True))
        ordered = (r > pr) | ((r == pr) & ((s > ps) | ((s == ps) & (i > pi))))
        new = (r != pr) | (s != ps)
        contiguous = np.where(new, i == 0, i == pi + 1)
        self.problems.per_rank(~ordered, r, lambda k: (
            f"rows not sorted by (rank, stream, index): rank {r[k]} stream {s[k]} index {i[k]} "
            f"follows rank {pr[k]} stream {ps[k]} index {pi[k]}"))  # fmt: skip
        self.problems.per_rank(ordered & ~contiguous, r, lambda k: (
            f"rank {r[k]} stream {s[k]}: index {i[k]} where {0 if new[k] else pi[k] + 1} was expected "
            "(indices run 0, 1, 2, ... within (rank, stream))"))  # fmt: skip

    def _ranks_stages_kinds(self, c: Cols) -> None:
        r, index, stage, kind = c[gf.RANK], c[gf.INDEX], c[gf.STAGE], c[gf.KIND]
        inside = (r >= 0) & (r < self.world)
        self.problems.per_rank(~inside, r, lambda k: f"rank {r[k]} out of range for world size {self.world}")
        self.seen[r[inside]] = True
        expected = (r // self.layout.stride("pp")) % self.layout.pp
        self.problems.per_rank(inside & (stage != expected), r, lambda k: (
            f"rank {r[k]} index {index[k]}: stage {stage[k]}, but the layout puts rank {r[k]} "
            f"in stage {expected[k]}"))  # fmt: skip
        unknown = ~np.isin(kind, list(self.kinds.values()))
        self.problems.per_rank(unknown, r, lambda k: (
            f"rank {r[k]} index {index[k]}: unknown kind {self.strings.names[kind[k]]!r}"))  # fmt: skip

    def _amounts(self, c: Cols, table: pa.Table) -> None:
        r, index = c[gf.RANK], c[gf.INDEX]
        amounts = {name: table.column(name).to_numpy() for name in _AMOUNTS}
        for name, values in amounts.items():
            self.problems.per_rank(values < 0, r, lambda k, n=name, v=values: (
                f"rank {r[k]} index {index[k]}: {n} {v[k]} is negative"))  # fmt: skip
        # Per rank, in float: an int64 sum of corrupt values would wrap around unseen.
        time = sum(amounts[n].astype(np.float64) for n in (gf.DUR_NS, gf.GAP_NS, gf.SKEW_NS))
        ranks, starts = np.unique(r, return_index=True)
        totals = np.add.reduceat(time, starts)
        for rank, total in zip(ranks[totals > MAX_RANK_NS], totals[totals > MAX_RANK_NS], strict=True):
            self.problems.add(
                f"rank {rank}: durations, gaps and skews add up to {total:.3g} ns in one iteration, far past "
                "any job (a corrupt value; the simulation's int64 clock would overflow)"
            )

    def _splits(self, c: Cols, splits: pa.ListArray) -> None:
        """An all-to-all's splits: one per member, none negative, summing to its bytes; no other
        node has any."""
        r, index = c[gf.RANK], c[gf.INDEX]
        length = pc.list_value_length(splits).to_numpy(zero_copy_only=False).astype(np.int64)
        has = length > 0
        if not has.any():
            return
        values = pc.list_flatten(splits).to_numpy().astype(np.float64)  # float: corrupt sums never wrap
        parent = pc.list_parent_indices(splits).to_numpy()
        total = np.bincount(parent, weights=values, minlength=len(length))
        negative = np.bincount(parent, weights=values < 0, minlength=len(length)) > 0
        all_to_all = (c[gf.KIND] == self.kinds[gf.NodeKind.COLLECTIVE]) & (
            c[gf.NAME] == self.strings.id("all_to_all")
        )
        size, nbytes = c[gf.GROUP_SIZE], c[gf.BYTES]
        self.problems.per_rank(has & ~all_to_all, r, lambda k: (
            f"rank {r[k]} index {index[k]}: {gf.SPLIT_BYTES} on a node that is no all_to_all"))  # fmt: skip
        bad = has & all_to_all & ((length != size) | negative | (total != nbytes))
        self.problems.per_rank(bad, r, lambda k: (
            f"rank {r[k]} index {index[k]}: all_to_all {gf.SPLIT_BYTES} of {length[k]} members summing to "
            f"{total[k]:.0f} (none may be negative), where its group has {size[k]} and it sends {nbytes[k]} bytes"))  # fmt: skip

    def _deps(self, c: Cols, deps: pa.ListArray) -> None:
        parent = pc.list_parent_indices(deps).to_numpy()
        target = pc.list_flatten(deps).to_numpy().astype(np.int64)
        rank, stream, index = (c[k][parent] for k in (gf.RANK, gf.STREAM, gf.INDEX))
        bad = (target < 0) | (target >= index)
        self.problems.per_rank(bad, rank, lambda k: (
            f"rank {rank[k]} stream {stream[k]} index {index[k]}: deps entry {target[k]} "
            "does not point to an earlier node of its (rank, stream)"))  # fmt: skip

    def _lane_deps(self, c: Cols, lane_deps: pa.ListArray) -> None:
        parent = pc.list_parent_indices(lane_deps).to_numpy()
        if not len(parent):
            return
        values = pc.list_flatten(lane_deps).flatten()
        to_stream, to_index, lag = (v.to_numpy().astype(np.int64) for v in values)
        rank, stream, index = (c[k][parent] for k in (gf.RANK, gf.STREAM, gf.INDEX))
        _, named = lane_dep_rows(c[gf.RANK], c[gf.STREAM], parent, to_stream, to_index)
        self.problems.per_rank(~named, rank, lambda k: (
            f"rank {rank[k]} stream {stream[k]} index {index[k]}: lane_deps entry (stream {to_stream[k]}, "
            f"index {to_index[k]}) is no node of another stream of the rank"))  # fmt: skip
        self.problems.per_rank(lag < 0, rank, lambda k: (
            f"rank {rank[k]} stream {stream[k]} index {index[k]}: lane_deps lag {lag[k]} is negative"))  # fmt: skip

    def report(self, path: str) -> ValidationReport:
        missing = np.flatnonzero(~self.seen)
        if missing.size:
            listed = ", ".join(map(str, missing[:10])) + (", ..." if missing.size > 10 else "")
            self.problems.add(f"{missing.size} of {self.world} ranks missing: {listed}")
        self._check_settled(self.world)
        return ValidationReport(
            path=path, problems=tuple(self.problems.lines), problem_count=self.problems.count,
            ranks=int(self.seen.sum()), nodes=self.nodes, collectives=self.collectives,
            p2p_pairs=self.p2p_pairs, bytes_by_group=dict(sorted(self.nbytes.items())),
        )  # fmt: skip
