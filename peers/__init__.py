"""prism.peers: the virtual-peer torch.distributed backend.

One process plays one or a few ranks of a world of thousands; every other rank is a *virtual
peer* that exists only here. The program's calls go through the ``prism`` backend, which makes
them with real data among real ranks (delegating to gloo or NCCL when every member of a group is
real), gives shape- and dtype-correct stand-in data for what virtual peers would send, and asks a
*clock* when each call completes. Every call is logged (``prism.schemas.comm_log``).

Public surface:

- ``activate(VirtualWorld(real_ranks=..., clock=..., labeler=...))`` registers the backend
  (once per process) and says which ranks of the world are real; then
  ``dist.init_process_group(BACKEND_NAME, rank=r, world_size=N, store=...)`` as usual.
- ``rendezvous_store(rank, world_size, world)``: the store for several real ranks (``env://``
  would wait for all N ranks, virtual ones included).
- ``current_comm_log()``: this process's calls and groups so far.
- The clock interface: ``CommClock`` (``submit`` a ``PendingCall`` and complete it at a wall
  time; be told where iterations begin and end). ``FreeRunningClock`` completes every virtual
  call at once; ``HoldingClock`` holds each for its price under a spec of this machine (a CPU
  capture's, ``capture_clock``); the replay's co-simulation clock lives in ``prism.replay``.
- ``prism.peers.comm_model``: the α-β price of every call under a cluster spec, which the
  holding clock, the graph's builder and its simulation all use.

It imports only ``torch``, ``numpy`` and ``prism.schemas``; capture, graph and replay build on it.
"""

from prism.peers.backend import (
    BACKEND_NAME,
    Labeler,
    VirtualWorld,
    activate,
    active_world,
    current_comm_log,
    rendezvous_store,
)
from prism.peers.clock import (
    CommClock,
    Completion,
    FreeRunningClock,
    HoldingClock,
    ImmediateClock,
    PendingCall,
    capture_clock,
)

__all__ = [
    "BACKEND_NAME",
    "CommClock",
    "Completion",
    "FreeRunningClock",
    "HoldingClock",
    "ImmediateClock",
    "Labeler",
    "PendingCall",
    "VirtualWorld",
    "activate",
    "capture_clock",
    "active_world",
    "current_comm_log",
    "rendezvous_store",
]
