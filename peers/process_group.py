"""ProcessGroupPrism: a torch.distributed process group whose peers may be virtual.

One process is one real rank of a world of N. For each group it joins, the group is

- *virtual* when no other member is a real process: every call completes on its own, with
  shape-correct stand-in data, at the time the active clock names;
- *delegated* when every member is real: calls run on a real gloo (CPU) or NCCL (CUDA) backend
  over the same members, so a fully real run goes through prism with real data;
- *mixed* otherwise (virtual members and several real ones, as when prism-replay runs several
  ranks): a collective is served as on a virtual group (shape-correct stand-in data, completed
  at the clock's time); a send or recv between two real members runs on a real gloo backend of
  just those two (made when the group is, as both must make it), so real data flows between
  real ranks, and the clock is told of it.

Every call is logged (``prism.peers.recorder``) and runs inside a ``prism:comm`` mark so that it
shows in Kineto traces: a Python process group bypasses the c10d dispatcher, so no ``c10d::*`` op
would appear otherwise. The entry points are in ``prism.peers.collectives`` and ``.p2p``.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch._C._profiler import _RecordFunctionFast

from prism.peers.clock import CommClock, PendingCall
from prism.peers.collectives import CollectivesMixin
from prism.peers.delegate import CallerReleasesWork, combine, make_backend, track_completion
from prism.peers.host_staged import HostStagedBackend, gpu_shared
from prism.peers.host_work import HostWork
from prism.peers.p2p import PointToPointMixin
from prism.peers.received_values import ReceivedValues
from prism.peers.recorder import CallRecord, CommOp, CommRecorder, describe_payload
from prism.peers.virtual_work import VirtualCompletion, VirtualWork, arm_timeout
from prism.schemas.annotations import comm_mark_name
from prism.schemas.comm_log import CallSite, CommGroup

BACKEND_NAME = "prism"
_CPU = torch.device("cpu")


class GroupMode(enum.StrEnum):
    """How a group serves its calls."""

    VIRTUAL = "virtual"
    DELEGATED = "delegated"
    MIXED = "mixed"


def mode_of(group: CommGroup) -> GroupMode:
    if group.delegated:
        return GroupMode.DELEGATED
    return GroupMode.MIXED if len(group.real_ranks) > 1 else GroupMode.VIRTUAL


class OpaqueBackend:
    """What torch's helpers see through ``_get_backend``: nothing to split, coalesce or connect.

    torch would otherwise split new NCCL groups from the default group's communicator (a
    collective over ranks that prism never runs), or fail to find a backend at all.
    """

    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False


_OPAQUE = OpaqueBackend()


class ProcessGroupPrism(CollectivesMixin, PointToPointMixin, dist.ProcessGroup):
    """A process group over ``group.ranks`` as seen by the real rank of group rank ``rank``."""

    def __init__(
        self,
        *,
        store: dist.Store,
        rank: int,
        group: CommGroup,
        clock: CommClock,
        recorder: CommRecorder,
        timeout: timedelta,
        received: ReceivedValues | None = None,
        host_work: HostWork | None = None,
    ) -> None:
        super().__init__(rank, len(group.ranks))
        self._rank, self._size = rank, len(group.ranks)  # plain attributes: cheaper than the C++ calls
        self._store = store
        self._group = group
        self._name = group.name
        self._desc = "undefined"
        self._clock = clock
        self._recorder = recorder
        self._timeout = timeout
        self._received = received
        self._host_work = host_work
        self._mode = mode_of(group)
        self._all_real = self._mode is GroupMode.DELEGATED
        self._gseq = itertools.count()
        self._delegates: dict[str, dist.Backend] = {}
        self._coalesced: list[dist.Work] | None = None  # Works issued inside _start/_end_coalescing
        self._pairs: dict[int, dist.Backend] = {}  # mixed groups: real peer -> 2-member gloo backend
        if self._mode is GroupMode.DELEGATED:
            self._delegate(_CPU)  # gloo connects now, as new_group with the gloo backend would
        elif self._mode is GroupMode.MIXED:
            self._connect_pairs()

    # -- identity ----------------------------------------------------------------------------
    @property
    def group_name(self) -> str:
        return self._name

    @property
    def group_desc(self) -> str:
        return self._desc

    def _set_group_name(self, name: str) -> None:
        self._name = name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    def getBackendName(self) -> str:  # noqa: N802 (C++ virtual of ProcessGroup)
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    def _get_backend(self, device: torch.device | str) -> OpaqueBackend:
        return _OPAQUE

    @property
    def label(self) -> str:
        """Layout label of the group, e.g. 'tp.3'."""
        return self._group.label

    @property
    def ranks(self) -> tuple[int, ...]:
        """Global ranks of the members in group-rank order."""
        return self._group.ranks

    @property
    def mode(self) -> GroupMode:
        return self._mode

    def __repr__(self) -> str:
        return f"ProcessGroupPrism({self._group.label}, rank {self._rank}/{self._size}, {self._mode})"

    def shutdown(self) -> None:
        for backend in (*self._delegates.values(), *self._pairs.values()):
            backend.shutdown()
        self._delegates.clear()
        self._pairs.clear()

    def abort(self) -> None:
        for backend in (*self._delegates.values(), *self._pairs.values()):
            backend.abort()

    # -- the one path every call takes ---------------------------------------------------------
    def _issue(
        self,
        op: CommOp,
        payload: Sequence[torch.Tensor],
        virtual: Callable[[], object],
        real: Callable[[dist.Backend], dist.Work],
        *,
        async_op: bool,
        peer: int | None = None,
        tag: int | None = None,
        reduce_op: str | None = None,
        device: torch.device | None = None,
        after_real: Callable[[], None] | None = None,
        split_bytes: tuple[int, ...] | None = None,
    ) -> dist.Work:
        """Log the call, mark it, and serve it virtually or on the real backend (then ``after_real``
        runs when it has completed)."""
        pair = self._pairs.get(peer) if op in (CommOp.SEND, CommOp.RECV) and peer is not None else None
        on_real = self._all_real or pair is not None
        nbytes, dtype, shape = describe_payload(payload)
        gseq = next(self._gseq)
        record = self._recorder.begin(
            op=op.value,
            group=self._name,
            label=self._group.label,
            group_size=self._size,
            gseq=gseq,
            bytes=nbytes,
            dtype=dtype,
            shape=shape,
            peer=peer,
            tag=tag,
            reduce_op=reduce_op,
            async_op=async_op,
            delegated=on_real,
            split_bytes=split_bytes,
            buffer=_storage_address(payload) if op in (CommOp.SEND, CommOp.RECV) else 0,
        )
        # Marked in every iteration, profiled or not. Unmarked, a virtual collective returns a few
        # µs sooner (the record_function), and what the process does while the call's host work
        # starts (1.5 ms after a 2.7 MB all-reduce on the 2-vCPU VM) moves out of the call into
        # the program's own time, which the graph keeps: dp simulations came out 12-15 % long.
        # Not torch.profiler.record_function, an op a program's dispatch mode sees: selective
        # activation checkpointing replays it from its cache in the recomputed forward, and the
        # call's mark is lost. The fast record function bypasses the dispatcher (a cpu_op).
        with _RecordFunctionFast(comm_mark_name(op.value, self._group.label, self._name, gseq, nbytes)):
            if not on_real:
                work = self._virtual_work(record, virtual())
            else:
                target = device or (payload[0].device if payload else _CPU)
                if pair is None:
                    issue = partial(real, self._delegate(target))
                else:  # the peer's rank in the pair backend: 0 for the lower global rank
                    issue = partial(real, pair, to=int(self._global(self._rank) < peer))
                finished = self._clock.real_call(_pending(record))
                on_done = record.finish if finished is None else partial(_finish_and_tell, record, finished)
                if after_real is not None:
                    on_done = partial(_both, after_real, on_done)
                if target.type == "cpu":  # gloo: the program's thread makes the last free
                    work = CallerReleasesWork.issue(list(payload), issue, on_done, record.asked)
                else:
                    work = track_completion(issue(), on_done)
        record.exit_ns = time.time_ns()
        self._recorder.commit(record)
        if self._coalesced is not None and work is not None:
            self._coalesced.append(work)
        return work

    def _virtual_work(self, record: CallRecord, result: object) -> dist.Work:
        future = torch.futures.Future()
        pending = _pending(record)
        # A capture's clocks (a replay's runs the co-simulation: it holds) note the program's
        # unseen waits, whose time the build takes out of the program's own.
        completion = VirtualCompletion(
            record, future, result, spin=self._clock.keeps_time, note_unseen_waits=not self._clock.holds
        )
        began = time.time_ns()
        answer = None if self._host_work is None else _AnswerAfterWork(self._host_work, record, completion)
        self._clock.submit(pending, completion.at if answer is None else answer)
        if self._clock.holds:
            record.clock_ns = time.time_ns() - began
        after_work = answer is not None and answer.at_once  # it completes when its host work is done
        if answer is not None and not after_work:  # this rank's share of the call, beside the program
            self._host_work.start(record.op, record.bytes, completion.due_ns)
        if not completion.settled and not after_work:
            arm_timeout(completion, pending, self._timeout)  # no wait may hang: fail it if no time comes
        return VirtualWork(future, completion)

    def _delegate(self, device: torch.device) -> dist.Backend:
        backend = self._delegates.get(device.type)
        if backend is None:
            # NCCL is made on first use: its communicator is lazy anyway, and a CPU-only program
            # never needs one.
            shared = device.type == "cuda" and gpu_shared()  # NCCL takes one member per GPU
            backend = make_backend(
                "cpu" if shared else device.type,
                store=dist.PrefixStore("staged/", self._store) if shared else self._store,
                rank=self._rank,
                size=self._size,
                global_ranks=self._group.ranks,
                group_name=self._name,
                timeout=self._timeout,
            )
            backend = self._delegates[device.type] = HostStagedBackend(backend) if shared else backend
        return backend

    def _connect_pairs(self) -> None:
        """A gloo backend with every other real member, for real transfers between the two."""
        me = self._global(self._rank)
        for peer in sorted(self._group.real_ranks):
            if peer == me:
                continue
            lo, hi = sorted((me, peer))
            self._pairs[peer] = make_backend(
                "cpu",
                store=dist.PrefixStore(f"pair/{lo}-{hi}/", self._store),
                rank=int(me == hi),
                size=2,
                global_ranks=(lo, hi),
                group_name=f"{self._name}:{lo}-{hi}",
                timeout=self._timeout,
            )

    def _global(self, group_rank: int) -> int:
        return self._group.ranks[group_rank]

    # -- coalescing (torch's _coalescing_manager with a device) ---------------------------------
    def _start_coalescing(self, device: torch.device) -> None:
        if self._native_coalescing(device):
            self._delegate(device)._start_coalescing(device)
        else:
            self._coalesced = []

    def _end_coalescing(self, device: torch.device) -> dist.Work:
        if self._native_coalescing(device):
            return self._delegate(device)._end_coalescing(device)
        works, self._coalesced = self._coalesced or [], None
        if works:
            return combine(works)
        done = torch.futures.Future()
        done.set_result([])
        return _create_work_from_future(done)

    def _native_coalescing(self, device: torch.device) -> bool:
        # NCCL groups the calls itself; its Works must not be merged through CPU futures, which
        # complete at enqueue time and would drop the stream ordering.
        return (
            self._mode is GroupMode.DELEGATED
            and torch.device(device).type == "cuda"
            and self._delegate(torch.device(device)).supports_coalescing
        )


def _run_eagerly(cls: type) -> type:
    """DDP's reducer calls the group from inside a torch.compile'd forward: dynamo must not trace
    into the group's entry points (it cannot), and each call runs as it would eagerly."""
    for mixin in (CollectivesMixin, PointToPointMixin):
        for name, method in vars(mixin).items():
            if callable(method) and not name.startswith("_"):
                setattr(cls, name, torch._dynamo.disable(method))
    return cls


ProcessGroupPrism = _run_eagerly(ProcessGroupPrism)


_SITE_FIELDS = tuple(f.name for f in dataclasses.fields(CallSite))


def _storage_address(payload: Sequence[torch.Tensor]) -> int:
    """The address of the first payload tensor's storage; 0 where it has none to read (meta or
    fake tensors, tensor subclasses without storage)."""
    if not payload:
        return 0
    try:
        return int(payload[0].untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return 0


def _pending(record: CallRecord) -> PendingCall:
    return PendingCall(**{name: getattr(record, name) for name in _SITE_FIELDS})


def _both(first: Callable[[], None], then: Callable[[], None]) -> None:
    first()
    then()


class _AnswerAfterWork:
    """The clock's answer for a virtual call whose rank does host work for it
    (``prism.peers.host_work``). An answer of "at once" (a capture, whose peers never hold it
    up) completes the call only when that work is done, as a real call cannot end before its own
    copies and reductions: else the work would run on into what the program does after its wait
    (DDP's last bucket into the optimizer step). A named end is passed on; the program's thread
    then starts the work, bounded by it."""

    __slots__ = ("_work", "_record", "_completion", "at_once")

    def __init__(self, work: HostWork, record: CallRecord, completion: VirtualCompletion) -> None:
        self._work, self._record, self._completion = work, record, completion
        self.at_once = False

    def __call__(self, due_ns: int | None) -> None:
        if due_ns is not None:
            self._completion.at(due_ns)
            return
        self.at_once = True
        done = partial(self._completion.at, None)
        if not self._work.start(self._record.op, self._record.bytes, None, then=done):
            done()  # too little work to do


def _finish_and_tell(record: CallRecord, finished: Callable[[int], None]) -> None:
    record.finish()
    finished(record.done_ns)
