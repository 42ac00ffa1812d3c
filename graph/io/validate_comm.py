"""The cross-rank checks of a graph's validation: collective instances and transfer pairs.

A comm row is kept (as numpy arrays) until the scan (``prism.graph.io.validate``) has passed
every rank that could hold the rest of its collective instance or transfer pair (the last
member of the group its row names, the later of a send's two ranks), then checked: every
collective instance has exactly its group's members with equal attributes; every send meets
exactly one recv. Also the problem list and string ids the whole validation shares.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from prism.schemas import graph_format as gf
from prism.schemas.layout import LayoutError, ParallelLayout
from prism.schemas.layout_arrays import fine_coords, group_indices

if TYPE_CHECKING:  # validate.py runs these checks: no import cycle at run time
    from prism.graph.io.validate import _Scan

MAX_PROBLEMS = 100
"""Problems kept in a report (all are counted)."""
WORLD = "world"
P2P = "p2p"
_COLL_KEEP = (gf.COLL_ID, gf.RANK, gf.INDEX, gf.BYTES, gf.NAME, gf.GROUP_KIND, gf.GROUP_INDEX, gf.GROUP_SIZE)
_P2P_KEEP = (gf.RANK, gf.INDEX, gf.KIND, gf.PEER, gf.P2P_SEQ, gf.BYTES, gf.GROUP_KIND, gf.GROUP_SIZE)
_KEPT_TYPES = {gf.COLL_ID: np.int64, gf.BYTES: np.int64}
Cols = dict[str, np.ndarray]
_STRINGS = (gf.KIND, gf.NAME, gf.GROUP_KIND)
"""The string columns the validation reads, as ids (``_Strings``)."""


class _Problems:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.count = 0

    def add(self, line: str) -> None:
        self.extend(1, lambda _: line)

    def extend(self, total: int, describe: Callable[[int], str]) -> None:
        """``total`` problems; only those kept are described (describe(k) for the k-th)."""
        room = max(0, MAX_PROBLEMS - len(self.lines))
        self.lines.extend(describe(k) for k in range(min(total, room)))
        self.count += total

    def per_rank(self, bad: np.ndarray, rank: np.ndarray, describe: Callable[[int], str]) -> None:
        """One problem per rank that has bad rows, describing (by row) its first one."""
        _, first = np.unique(rank[bad], return_index=True)
        rows = np.flatnonzero(bad)[np.sort(first)]
        self.extend(rows.size, lambda k: describe(int(rows[k])))


class _Strings:
    """One integer id per distinct string across row groups (each row group has its own dictionary)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []

    def id(self, s: str) -> int:
        if s not in self.ids:
            self.ids[s] = len(self.names)
            self.names.append(s)
        return self.ids[s]

    def codes(self, column: pa.ChunkedArray) -> np.ndarray:
        parts = [np.empty(0, np.int64)]
        for chunk in column.chunks:
            lookup = np.asarray([self.id(s) for s in chunk.dictionary.to_pylist()], np.int64)
            parts.append(lookup[chunk.indices.to_numpy(zero_copy_only=False)])
        return np.concatenate(parts)


def _later_rank(rows: Cols, world: int) -> np.ndarray:
    """Per send or recv row, the later of its two ranks (-1 for a peer outside the world: the row
    is reported at once)."""
    rank, peer = rows[gf.RANK], rows[gf.PEER]
    return np.where((peer >= 0) & (peer < world), np.maximum(rank, peer), -1)


class _Pending:
    """Comm rows read but not yet checked, each with the last rank that can complete its set.

    Rows that cannot complete soon (``until`` more than ``FAR_RANKS`` past the scan, e.g. a data
    parallel group's, whose last member is a pipeline stage's stretch away) wait apart, in
    buckets of ``FAR_RANKS`` ranks of ``until``, so that each row group's check looks only at the
    rows near the scan, and bringing them near touches only the buckets due."""

    FAR_RANKS = 4096

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self.rows: Cols = {}
        self.until = np.empty(0, np.int64)
        self.far: dict[int, list[tuple[np.ndarray, Cols]]] = {}  # bucket -> blocks of (until, rows)
        self.due: list[int] = []  # the far buckets, a heap

    def add(self, rows: Cols, until: np.ndarray, passed: int) -> None:
        far = until > passed + self.FAR_RANKS
        if far.any():
            far_until = until[far]
            bucket = far_until // max(self.FAR_RANKS, 1)
            for b in np.unique(bucket).tolist():
                sel = bucket == b
                if b not in self.far:
                    self.far[b] = []
                    heapq.heappush(self.due, b)
                self.far[b].append((far_until[sel], {k: v[far][sel] for k, v in rows.items()}))
            rows, until = {k: v[~far] for k, v in rows.items()}, until[~far]
        self._join(rows, until)

    def _join(self, rows: Cols, until: np.ndarray) -> None:
        if not until.size:
            return
        self.rows = {k: np.concatenate([self.rows[k], rows[k]]) for k in rows} if self.rows else rows
        self.until = np.concatenate([self.until, until])

    def _bring_near(self, passed: int) -> None:
        """Move the far buckets that hold rows completing within ``FAR_RANKS`` of ``passed`` to
        the near rows (a bucket's later rows with them: they wait there as well)."""
        while self.due and self.due[0] * max(self.FAR_RANKS, 1) <= passed + self.FAR_RANKS:
            blocks = self.far.pop(heapq.heappop(self.due))
            until = np.concatenate([u for u, _ in blocks])
            self._join({k: np.concatenate([r[k] for _, r in blocks]) for k in self.columns}, until)

    def take(self, passed: int, key: Callable[[Cols], np.ndarray]) -> Cols:
        """Remove and return the rows of every set (rows of one ``key``) whose near rows all have
        ``until <= passed``."""
        self._bring_near(passed)
        if not self.until.size or int(self.until.min()) > passed:
            return {}
        sets, inverse = np.unique(key(self.rows), return_inverse=True)
        latest = np.full(sets.size, -1, np.int64)
        np.maximum.at(latest, inverse, self.until)
        done = latest[inverse] <= passed
        if not done.any():
            return {}
        taken = {k: v[done] for k, v in self.rows.items()}
        self.rows, self.until = {k: v[~done] for k, v in self.rows.items()}, self.until[~done]
        return taken


def _coll_key(rows: Cols) -> np.ndarray:
    return rows[gf.COLL_ID]


def _pair_key(rows: Cols) -> np.ndarray:
    """A transfer's (lower rank, higher rank): the n-th send and its recv share it."""
    rank, peer = rows[gf.RANK].astype(np.int64), rows[gf.PEER].astype(np.int64)
    return np.minimum(rank, peer) * (1 << 32) + np.maximum(rank, peer)


class _Collectives:
    """Collective rows sorted by (coll_id, rank), one run of rows per instance."""

    def __init__(self, c: Cols, layout: ParallelLayout, strings: _Strings, problems: _Problems) -> None:
        self.layout, self.strings, self.problems = layout, strings, problems
        c = c or {k: np.empty(0, np.int64) for k in _COLL_KEEP}
        no_id = c[gf.COLL_ID] < 0
        problems.per_rank(no_id, c[gf.RANK], lambda k: (
            f"rank {c[gf.RANK][k]} index {c[gf.INDEX][k]}: collective without coll_id"))  # fmt: skip
        order = np.lexsort((c[gf.RANK], c[gf.COLL_ID]))
        self.c = {k: v[order[~no_id[order]]] for k, v in c.items()}
        cid = self.c[gf.COLL_ID]
        self.starts = np.flatnonzero(np.r_[True, cid[1:] != cid[:-1]]) if cid.size else cid
        self.counts = np.diff(np.r_[self.starts, cid.size])
        self.inst = np.repeat(np.arange(self.starts.size), self.counts)  # instance of each row
        self.bad = np.zeros(self.starts.size, bool)  # instances already reported

    def first(self, col: str) -> np.ndarray:
        return self.c[col][self.starts]

    def members(self, j: int, col: str = gf.RANK) -> np.ndarray:
        return self.c[col][self.starts[j] : self.starts[j] + self.counts[j]]

    def label(self, j: int) -> str:
        kind = self.strings.names[self.first(gf.GROUP_KIND)[j]]
        return f"coll_id {self.first(gf.COLL_ID)[j]} ({kind} group {self.first(gf.GROUP_INDEX)[j]})"

    def check(self, nbytes: dict[str, int]) -> int:
        for col in (gf.BYTES, gf.NAME, gf.GROUP_KIND, gf.GROUP_INDEX, gf.GROUP_SIZE):
            self._equal(col)
        kind_of_row = self.first(gf.GROUP_KIND)[self.inst]
        for kind in np.unique(kind_of_row):
            name = self.strings.names[kind]
            nbytes[name] = nbytes.get(name, 0) + int(self.c[gf.BYTES][kind_of_row == kind].sum())
        self._membership(self._groups())
        return int(self.starts.size)

    def _equal(self, col: str) -> None:
        values = self.c[col]
        differ = np.unique(self.inst[values != values[self.starts][self.inst]])
        self.bad[differ] = True

        def describe(k: int) -> str:
            ranks, vals = self.members(differ[k])[:4], self.members(differ[k], col)[:4]
            shown = ", ".join(f"rank {r}: {self._show(col, v)}" for r, v in zip(ranks, vals, strict=True))
            return f"coll_id {self.first(gf.COLL_ID)[differ[k]]}: members disagree on {col} ({shown}, ...)"

        self.problems.extend(differ.size, describe)

    def _show(self, col: str, value: int) -> str:
        return repr(self.strings.names[value]) if col in _STRINGS else str(value)

    def _groups(self) -> np.ndarray:
        """Each instance's group size by the layout; marks instances of unknown groups bad."""
        n, kinds, index = self.starts.size, self.first(gf.GROUP_KIND), self.first(gf.GROUP_INDEX)
        degree = np.zeros(n, np.int64)
        for kind in np.unique(kinds):
            sel = np.flatnonzero(kinds == kind)
            name = self.strings.names[kind]
            table = group_table(self.layout, name)
            count = 0 if table is None else table.count
            unknown = sel[(index[sel] < 0) | (index[sel] >= count)]
            self.bad[unknown] = True
            self.problems.extend(unknown.size, lambda k, u=unknown, g=name: (
                f"coll_id {self.first(gf.COLL_ID)[u[k]]}: the layout {self.layout} has no {g!r} "
                f"group {index[u[k]]}"))  # fmt: skip
            if table is not None:
                degree[sel] = table.degree
        size = self.first(gf.GROUP_SIZE)
        wrong = np.flatnonzero(~self.bad & (size != degree))
        self.problems.extend(wrong.size, lambda k: (
            f"{self.label(wrong[k])}: group_size {size[wrong[k]]}, the group has {degree[wrong[k]]} ranks"))  # fmt: skip
        return degree

    def _membership(self, degree: np.ndarray) -> None:
        """An instance's ranks are its group's, each once: as many as the group has, each in it."""
        rank, inst = self.c[gf.RANK], self.inst
        kinds, index = self.first(gf.GROUP_KIND), self.first(gf.GROUP_INDEX)
        in_group = np.zeros(rank.size, bool)
        for kind in np.unique(kinds):
            table = group_table(self.layout, self.strings.names[kind])
            rows = np.flatnonzero(kinds[inst] == kind)
            if table is not None and rows.size:
                group = index[inst[rows]]
                known = (group >= 0) & (group < table.count)
                in_group[rows[known]] = table.index[rank[rows[known]]] == group[known]
        repeated = np.r_[False, (rank[1:] == rank[:-1]) & (inst[1:] == inst[:-1])] if rank.size else in_group
        row_ok = in_group & ~repeated
        all_ok = np.logical_and.reduceat(row_ok, self.starts) if rank.size else row_ok
        wrong = np.flatnonzero(~self.bad & ((self.counts != degree) | ~all_ok))

        def describe(k: int) -> str:
            j = wrong[k]
            table = group_table(self.layout, self.strings.names[kinds[j]])
            return f"{self.label(j)}: " + _membership(table.members(int(index[j])), self.members(j))

        self.problems.extend(wrong.size, describe)


@dataclass(frozen=True)
class GroupTable:
    """Every rank's group index along one kind of a layout, and each group's last member."""

    index: np.ndarray
    degree: int
    count: int
    last: np.ndarray

    def members(self, group: int) -> np.ndarray:
        return np.flatnonzero(self.index == group)


@lru_cache(maxsize=32)
def group_table(layout: ParallelLayout, kind: str) -> GroupTable | None:
    """The table of ``kind`` in ``layout``; None for a kind the layout has not."""
    try:
        degree = layout.degree(kind)
    except LayoutError:
        return None
    ranks = np.arange(layout.world_size, dtype=np.int64)
    index = group_indices(layout, kind, fine_coords(layout, ranks))
    last = np.zeros(layout.group_count(kind), np.int64)
    np.maximum.at(last, index, ranks)
    return GroupTable(index=index, degree=degree, count=layout.group_count(kind), last=last)


def _membership(expected: np.ndarray, actual: np.ndarray) -> str:
    values, counts = np.unique(actual, return_counts=True)
    parts = [f"rank {r} missing" for r in np.setdiff1d(expected, actual)[:5]]
    parts += [f"rank {r} appears {n} times" for r, n in zip(values, counts, strict=True) if n > 1][:5]
    parts += [f"rank {r} is not a member" for r in np.setdiff1d(actual, expected)[:5]]
    return "; ".join(parts)


def _check_p2p(c: Cols, scan: _Scan, nbytes: dict[str, int]) -> int:
    """The n-th send a -> b meets the n-th recv at b from a (p2p_seq n), with equal bytes."""
    if not c or c[gf.RANK].size == 0:
        return 0
    problems, world = scan.problems, scan.world
    rank, peer, seq, size = c[gf.RANK], c[gf.PEER], c[gf.P2P_SEQ], c[gf.GROUP_SIZE]
    is_send = c[gf.KIND] == scan.kinds[gf.NodeKind.SEND]
    invalid = (peer < 0) | (peer >= world) | (peer == rank) | (seq < 0) | (size != 2)
    problems.per_rank(invalid, rank, lambda k: (
        f"rank {rank[k]} index {c[gf.INDEX][k]}: {'send' if is_send[k] else 'recv'} with peer {peer[k]}, "
        f"p2p_seq {seq[k]}, group_size {size[k]} (needs another rank, p2p_seq >= 0, group_size 2)"))  # fmt: skip
    span = max(int(seq.max()), 0) + 1
    key = (np.where(is_send, rank, peer) * world + np.where(is_send, peer, rank)) * span + seq
    sends = _side(key, is_send & ~invalid, "send", span, world, problems)
    recvs = _side(key, ~is_send & ~invalid, "recv", span, world, problems)
    both, si, ri = np.intersect1d(sends[0], recvs[0], assume_unique=True, return_indices=True)
    for side, (keys, _), other in (("send", sends, "recv"), ("recv", recvs, "send")):
        alone = np.setdiff1d(keys, both, assume_unique=True)
        problems.extend(alone.size, lambda k, a=alone, s=side, o=other: (
            f"{s} {_pair(a[k], span, world)} has no matching {o}"))  # fmt: skip
    sb, rb = c[gf.BYTES][sends[1][si]], c[gf.BYTES][recvs[1][ri]]
    unequal = np.flatnonzero(sb != rb)
    problems.extend(unequal.size, lambda k: (
        f"send {_pair(both[unequal[k]], span, world)}: {sb[unequal[k]]} bytes sent, "
        f"the recv expects {rb[unequal[k]]}"))  # fmt: skip
    kinds = c[gf.GROUP_KIND][sends[1][si]]
    for kind in np.unique(kinds):
        name = scan.strings.names[kind] or P2P
        nbytes[name] = nbytes.get(name, 0) + int(sb[kinds == kind].sum())
    return int(both.size)


def _side(
    key: np.ndarray, mask: np.ndarray, side: str, span: int, world: int, problems: _Problems
) -> tuple[np.ndarray, np.ndarray]:
    """Distinct keys of one side and the row of each; reports keys that occur twice."""
    values, first, counts = np.unique(key[mask], return_index=True, return_counts=True)
    dup = np.flatnonzero(counts > 1)
    problems.extend(
        dup.size, lambda k: f"{side} {_pair(values[dup[k]], span, world)} appears {counts[dup[k]]} times"
    )
    return values, np.flatnonzero(mask)[first]


def _pair(key: int, span: int, world: int) -> str:
    pair, seq = divmod(int(key), span)
    src, dst = divmod(pair, world)
    return f"rank {src} -> rank {dst} p2p_seq {seq}"
