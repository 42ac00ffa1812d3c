"""The in-process comm log: every group and every call the ``prism`` backend saw on this rank."""

from __future__ import annotations

import dataclasses
import enum
import itertools
import threading
import time
from collections.abc import Sequence

import torch

from prism.schemas.comm_log import CommCall, CommGroup, CommLog


class CommOp(enum.StrEnum):
    """Operation names written to the comm log and to ``prism:comm`` marks."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    BROADCAST = "broadcast"
    BARRIER = "barrier"
    ALL_TO_ALL = "all_to_all"
    SEND = "send"
    RECV = "recv"
    # Rooted collectives; rare in training loops but part of torch.distributed.
    REDUCE = "reduce"
    GATHER = "gather"
    SCATTER = "scatter"


class _InFlight:
    """What a call's record notes while the call is in flight (``CallRecord``'s methods)."""

    __slots__ = ()

    def finish(self, due_ns: int | None = None) -> None:
        """Note that the call completed: at ``due_ns``, its clock's time, when that has passed (a
        call completed when the program came to it), else now; later notices change nothing."""
        if not self.done_ns:
            now = time.time_ns()
            self.done_ns = now if due_ns is None else min(due_ns, now)

    def asked(self) -> None:
        """Note that the program called wait() on the call now (first time only)."""
        if not self.first_wait_ns:
            self.first_wait_ns = time.time_ns()

    def waiting(self) -> None:
        """Note that the program began to wait on the call, still in flight, now (first time only)."""
        if not self.wait_ns and not self.done_ns:
            self.wait_ns = time.time_ns()

    def to_call(self) -> CommCall:
        return CommCall(**{name: getattr(self, name) for name in self.__slots__})


# CommCall's fields (and defaults), mutable: a generated __init__ assigns them directly, half the
# cost of setting them one by one from keyword arguments (a record is made at every call).
CallRecord = dataclasses.make_dataclass(
    "CallRecord",
    [(f.name, f.type, dataclasses.field(default=f.default)) for f in dataclasses.fields(CommCall)],
    bases=(_InFlight,),
    namespace={"__doc__": "One call while it is in flight; becomes a CommCall in ``CommRecorder.comm_log``."},
    kw_only=True,
    slots=True,
    eq=False,
)


def describe_payload(tensors: Sequence[torch.Tensor]) -> tuple[int, str, tuple[int, ...]]:
    """(bytes, dtype name, shape) of a call's payload; several tensors of one shape read (n, *shape)."""
    if not tensors:
        return 0, "", ()
    first = tensors[0]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    dtype = str(first.dtype).removeprefix("torch.")
    if len(tensors) == 1:
        return nbytes, dtype, tuple(first.shape)
    if all(t.shape == first.shape for t in tensors):
        return nbytes, dtype, (len(tensors), *first.shape)
    return nbytes, dtype, (sum(t.numel() for t in tensors),)


def split_bytes(tensor: torch.Tensor, splits: Sequence[int], group_size: int) -> tuple[int, ...]:
    """Bytes ``all_to_all_single`` sends each member: ``splits`` rows of ``tensor`` each, or an
    even share of its first dimension when the splits are empty."""
    rows = tensor.shape[0] if tensor.dim() else 1
    row_bytes = tensor.numel() * tensor.element_size() // max(rows, 1)
    counts = list(splits) if len(splits) else [rows // group_size] * group_size
    return tuple(int(c) * row_bytes for c in counts)


class CommRecorder:
    """Collects the groups and calls of one ``init_process_group`` lifetime."""

    def __init__(self, *, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self._groups: list[CommGroup] = []
        self._records: list[CallRecord] = []
        self._seq = itertools.count()  # next() on a count is atomic under the GIL
        self._lock = threading.Lock()

    def add_group(self, group: CommGroup) -> None:
        with self._lock:
            self._groups.append(group)

    def begin(self, **fields: object) -> CallRecord:
        """The record of a call made now; ``fields`` are CommCall's except seq and times."""
        return CallRecord(
            seq=next(self._seq),
            enter_ns=time.time_ns(),
            exit_ns=0,
            done_ns=0,
            wait_ns=0,
            first_wait_ns=0,
            clock_ns=0,
            **fields,
        )

    def commit(self, record: CallRecord) -> None:
        """Log ``record`` once its call has been issued (a call that raised is not logged)."""
        self._records.append(record)

    def comm_log(self) -> CommLog:
        """Everything so far; calls still in flight have done_ns 0."""
        with self._lock:
            groups = tuple(self._groups)
        records = sorted(self._records, key=lambda r: r.seq)  # threads may append out of order
        return CommLog(
            rank=self.rank,
            world_size=self.world_size,
            groups=groups,
            calls=tuple(r.to_call() for r in records),
        )
