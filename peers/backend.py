"""The ``prism`` torch.distributed backend: registration, this process's virtual world, the comm log.

Usage, in the process that plays global rank ``r`` of a world of ``N``::

    activate(VirtualWorld(real_ranks=frozenset({r}), labeler=...))
    dist.init_process_group(BACKEND_NAME, rank=r, world_size=N, store=dist.HashStore())
    ...                                  # any torch.distributed calls, any new_group
    log = current_comm_log()

When several ranks are real processes, pass ``store=rendezvous_store(r, N, world)`` (``env://``
would wait for all N ranks to connect, virtual ones included).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist
from torch._C._distributed_c10d import _DistributedBackendOptions

from prism.peers.clock import CommClock, FreeRunningClock
from prism.peers.host_work import HostWork
from prism.peers.process_group import BACKEND_NAME, ProcessGroupPrism
from prism.peers.received_values import ReceivedValues
from prism.peers.recorder import CommRecorder
from prism.schemas.annotations import Mark, Phase, format_mark
from prism.schemas.comm_log import CommGroup, CommLog

__all__ = [
    "BACKEND_NAME",
    "Labeler",
    "VirtualWorld",
    "activate",
    "active_world",
    "current_comm_log",
    "rendezvous_store",
]

Labeler = Callable[[tuple[int, ...]], str | None]
"""Layout label ('tp.3', 'world', ...) of a group given its global ranks, or None."""


@dataclass(frozen=True, kw_only=True)
class VirtualWorld:
    """Which ranks of the world run as real processes, and how calls with virtual peers behave."""

    real_ranks: frozenset[int] | None = None
    """Global ranks that are real processes; None means every rank is real."""
    clock: CommClock = field(default_factory=FreeRunningClock)
    """Completion time of calls on groups whose peers are virtual."""
    labeler: Labeler | None = None
    """Label of a group from its global ranks; None (or a None result) labels it 'g<group name>'."""
    received: ReceivedValues | None = None
    """Values to record from real peers' sends, or to give receives from virtual peers."""
    host_work: HostWork | None = None
    """Where the host-side work of virtual collectives is done (``prism.peers.host_work``);
    None: they cost the host nothing."""

    def __post_init__(self) -> None:
        if self.real_ranks is not None:
            object.__setattr__(self, "real_ranks", frozenset(self.real_ranks))
            if not self.real_ranks:
                raise ValueError("real_ranks must name at least one rank (or be None: all ranks real)")

    def real_members(self, ranks: Iterable[int]) -> tuple[int, ...]:
        """The members of ``ranks`` that are real processes, in the given order."""
        if self.real_ranks is None:
            return tuple(ranks)
        return tuple(r for r in ranks if r in self.real_ranks)

    def label(self, name: str, ranks: tuple[int, ...]) -> str:
        found = self.labeler(ranks) if self.labeler is not None else None
        return f"g{name}" if found is None else found


# Per-process state: the world the next groups are made in, and the log of the current run.
_world: VirtualWorld | None = None
_recorder: CommRecorder | None = None


def activate(world: VirtualWorld) -> None:
    """Register the prism backend (once per process) and make ``world`` the one groups are made in.

    Call it before ``init_process_group``; groups made afterwards use ``world``.
    """
    global _world
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create_group, extended_api=True, devices=["cpu", "cuda"])
    _world = world


def active_world() -> VirtualWorld | None:
    return _world


def current_comm_log() -> CommLog:
    """Every group and call of the current (or last) prism ``init_process_group`` of this process."""
    if _recorder is None:
        raise RuntimeError("no prism process group has been initialised in this process")
    return _recorder.comm_log()


def rendezvous_store(
    rank: int, world_size: int, world: VirtualWorld, *, timeout: timedelta = timedelta(minutes=5)
) -> dist.Store:
    """A store for ``init_process_group(store=...)`` that waits for the real processes only.

    One real rank: an in-process HashStore. Several: a TCPStore at MASTER_ADDR:MASTER_PORT hosted
    by the lowest real rank, expecting as many clients as there are real ranks.
    """
    real = sorted(range(world_size) if world.real_ranks is None else world.real_ranks)
    if rank not in real:
        raise ValueError(f"rank {rank} is not one of the real ranks {real[:8]}...")
    if len(real) == 1:
        return dist.HashStore()
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    return dist.TCPStore(
        host, port, world_size=len(real), is_master=rank == real[0], timeout=timeout, multi_tenant=True
    )


def _create_group(opts: _DistributedBackendOptions, pg_options: object) -> ProcessGroupPrism:
    """Factory torch calls for every prism group this rank is a member of."""
    global _recorder
    world = _world
    if world is None:
        raise RuntimeError("call prism.peers.backend.activate(VirtualWorld(...)) before init_process_group")
    is_default = not opts.global_ranks_in_group
    ranks = tuple(range(opts.group_size)) if is_default else tuple(opts.global_ranks_in_group)
    me = ranks[opts.group_rank]
    if world.real_ranks is not None and me not in world.real_ranks:
        raise ValueError(f"rank {me} runs as a real process but is not in real_ranks")
    name = str(opts.group_id)
    group = CommGroup(
        name=name, label=world.label(name, ranks), ranks=ranks, real_ranks=world.real_members(ranks)
    )
    # A label that breaks the mark grammar should fail here, not on the first call.
    format_mark(Mark(phase=Phase.COMM, group=group.label))
    if is_default:
        _recorder = CommRecorder(rank=me, world_size=opts.group_size)
    elif _recorder is None:
        raise RuntimeError("prism subgroup created before the default prism group")
    pg = ProcessGroupPrism(
        store=opts.store,
        rank=opts.group_rank,
        group=group,
        clock=world.clock,
        recorder=_recorder,
        timeout=opts.timeout,
        received=world.received,
        host_work=world.host_work,
    )
    _recorder.add_group(group)
    return pg
