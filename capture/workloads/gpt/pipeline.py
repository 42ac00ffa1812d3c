"""Runs a stage's 1F1B schedule: the forward/backward of each microbatch and the p2p transfers.

Activations and their gradients have the fixed shape [micro_batch_size, seq_len, hidden] (no
shape exchange) and go by ``dist.isend`` / ``dist.irecv`` on the default group to the global
ranks of the neighbouring stages. Each transfer is posted unbatched, inside its own mark, in the
order the schedule fixes; every group of posts is then waited for inside a ``p2p_wait`` mark.
Received values are never used for control flow (virtual peers send stand-in data).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from prism.capture import annotate
from prism.schemas.annotations import Direction
from prism.schemas.pipeline_schedule import Action, Step

ForwardStep = Callable[[int, torch.Tensor | None], torch.Tensor]
"""(microbatch, received input activation or None on the first stage) -> output (loss on the last stage)."""


class P2P:
    """Posts transfers to and from the neighbouring stages and waits for them."""

    def __init__(
        self,
        *,
        stage: int,
        prev_rank: int | None,
        next_rank: int | None,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.stage, self.prev, self.next = stage, prev_rank, next_rank
        self.shape, self.dtype, self.device = shape, dtype, device
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []

    def _peer(self, direction: Direction, sending: bool) -> int:
        # Activations go to the next stage and come from the previous; gradients the other way.
        peer = self.next if (direction == Direction.FORWARD) == sending else self.prev
        if peer is None:
            raise RuntimeError(
                f"stage {self.stage} has no peer for {'send' if sending else 'recv'} {direction}"
            )
        return peer

    def send(self, direction: Direction, mb: int, tensor: torch.Tensor) -> None:
        peer = self._peer(direction, sending=True)
        with annotate.send(direction=direction, stage=self.stage, mb=mb, peer=peer):
            tensor = tensor.detach().contiguous()
            self._pending.append((dist.isend(tensor, dst=peer), tensor))

    def recv(self, direction: Direction, mb: int) -> torch.Tensor:
        peer = self._peer(direction, sending=False)
        with annotate.recv(direction=direction, stage=self.stage, mb=mb, peer=peer):
            buffer = torch.empty(self.shape, dtype=self.dtype, device=self.device)
            self._pending.append((dist.irecv(buffer, src=peer), buffer))
        return buffer

    def wait(self) -> None:
        with annotate.p2p_wait(stage=self.stage):
            for work, _ in self._pending:
                work.wait()
        self._pending.clear()


def run_schedule(steps: Sequence[Step], *, stage: int, p2p: P2P, forward_step: ForwardStep) -> None:
    """Execute ``steps`` (from ``one_f_one_b``): forwards, backwards and transfers of one iteration."""
    inputs: dict[int, torch.Tensor] = {}  # received activations, kept until their gradient is sent
    outputs: dict[int, torch.Tensor] = {}  # stage outputs, kept until their backward
    grads: dict[int, torch.Tensor] = {}  # received output gradients
    for step in steps:
        mb = step.mb
        match step.action:
            case Action.RECV_FORWARD:
                inputs[mb] = p2p.recv(Direction.FORWARD, mb)
            case Action.FORWARD:
                x = inputs[mb].requires_grad_() if mb in inputs else None
                with annotate.forward(stage=stage, mb=mb):
                    outputs[mb] = forward_step(mb, x)
            case Action.SEND_FORWARD:
                p2p.send(Direction.FORWARD, mb, outputs[mb])
            case Action.RECV_BACKWARD:
                grads[mb] = p2p.recv(Direction.BACKWARD, mb)
            case Action.BACKWARD:
                with annotate.backward(stage=stage, mb=mb):
                    torch.autograd.backward(outputs.pop(mb), grads.pop(mb, None))
            case Action.SEND_BACKWARD:
                p2p.send(Direction.BACKWARD, mb, inputs.pop(mb).grad)
            case Action.WAIT:
                p2p.wait()
