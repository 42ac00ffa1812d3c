"""prism.replay: the virtual-peer process group, the co-simulation clock, the replay runtime."""

from prism.replay.backend import BACKEND_NAME, VirtualWorld, activate, current_comm_log, rendezvous_store
from prism.replay.clock import CommClock, FreeRunningClock, PendingCall

__all__ = [
    "BACKEND_NAME",
    "CommClock",
    "FreeRunningClock",
    "PendingCall",
    "VirtualWorld",
    "activate",
    "current_comm_log",
    "rendezvous_store",
]
