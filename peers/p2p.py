"""Point-to-point entry points of the prism group: send, recv (isend / irecv, batch_isend_irecv).

torch's batch_isend_irecv coalesces only on a plain C++ ProcessGroup; on this Python group it
issues each isend / irecv on its own, so every transfer is one logged call with its Work.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.distributed as dist

from prism.peers import virtual_data as vd
from prism.peers.received_values import ReceivedValues
from prism.peers.recorder import CommOp


def _blocking_p2p() -> bool:
    # dist.send / dist.recv are isend / irecv followed by wait(): the group only ever sees the
    # i-variant, so look at the caller of isend / irecv to log async_op as the program meant it.
    c10d = dist.distributed_c10d.__name__
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") != c10d:  # up to torch's isend / irecv
        frame = frame.f_back
    caller = frame.f_back if frame is not None else None
    return (
        caller is not None
        and caller.f_code.co_name in ("send", "recv")
        and caller.f_globals.get("__name__") == c10d
    )


class PointToPointMixin:
    """send / recv / recv_anysource; peers are group ranks here and global ranks in the log."""

    _issue: Callable[..., dist.Work]
    _global: Callable[[int], int]
    _all_real: bool
    _received: ReceivedValues | None

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> dist.Work:
        return self._issue(
            CommOp.SEND,
            tensors,
            lambda: tensors,
            lambda b, to=dst: b.send(tensors, to, tag),
            async_op=not _blocking_p2p(),
            peer=self._global(dst),
            tag=tag,
        )

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> dist.Work:
        peer, received = self._global(src), self._received
        slot = None if received is None else received.next_slot(peer)

        def virtual() -> object:
            if received is None or not received.fill(peer, slot, tensors):
                for t in tensors:
                    vd.fill_standin(t)
            return tensors

        def recorded() -> None:
            received.record(peer, slot, tensors)

        return self._issue(
            CommOp.RECV,
            tensors,
            virtual,
            lambda b, to=src: b.recv(tensors, to, tag),
            async_op=not _blocking_p2p(),
            peer=peer,
            tag=tag,
            after_real=recorded if received is not None and received.recording else None,
        )

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> dist.Work:
        if not self._all_real:
            raise NotImplementedError(
                "prism: a receive from any source has no defined sender among virtual peers"
            )
        return self._issue(
            CommOp.RECV,
            tensors,
            lambda: tensors,
            lambda b: b.recv_anysource(tensors, tag),
            async_op=not _blocking_p2p(),
            tag=tag,
        )
