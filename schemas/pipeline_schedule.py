"""The non-interleaved 1F1B pipeline schedule as a pure list of steps, shared by the workload
that runs it and the graph builder that extrapolates it (Megatron's
``forward_backward_pipelining_without_interleaving``).

Stage ``s`` of ``pp`` runs ``W = min(pp - s - 1, M)`` warm-up forwards, then ``M - W`` steady
steps of one forward and one backward, then ``W`` cool-down backwards. Transfers are posted
in groups, each followed by a WAIT for all of them, exactly where Megatron's p2p calls are:
``recv_forward``, ``send_forward``, ``send_forward_recv_backward``,
``send_backward_recv_forward``, ``recv_backward``, ``send_backward``. Inside a group the
order is fixed (RECV_FORWARD, SEND_FORWARD, RECV_BACKWARD, SEND_BACKWARD) so that two
neighbours exchanging in both directions post matching operations in the same order, which
keeps unbatched blocking p2p (NCCL) free of deadlock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Action(enum.StrEnum):
    """One thing the pipeline runtime does."""

    RECV_FORWARD = "recv_fwd"
    """Post the receive of the microbatch's input activation from the previous stage."""
    SEND_FORWARD = "send_fwd"
    """Post the send of the microbatch's output activation to the next stage."""
    RECV_BACKWARD = "recv_bwd"
    """Post the receive of the gradient of the microbatch's output from the next stage."""
    SEND_BACKWARD = "send_bwd"
    """Post the send of the gradient of the microbatch's input to the previous stage."""
    WAIT = "wait"
    """Wait for every transfer posted since the last WAIT."""
    FORWARD = "fwd"
    """Forward of the microbatch on this stage."""
    BACKWARD = "bwd"
    """Backward of the microbatch on this stage."""


TRANSFERS = (Action.RECV_FORWARD, Action.SEND_FORWARD, Action.RECV_BACKWARD, Action.SEND_BACKWARD)


@dataclass(frozen=True, kw_only=True)
class Step:
    """One step of a stage's schedule."""

    action: Action
    """What to do."""
    mb: int | None = None
    """Microbatch (None for WAIT)."""


def warmup_forwards(*, stage: int, stages: int, microbatches: int) -> int:
    """Forwards a stage runs before its first backward."""
    return min(stages - stage - 1, microbatches)


def _transfers(stage: int, stages: int, posts: list[Step]) -> list[Step]:
    """The posts that exist on this stage, in canonical order, followed by a WAIT if any."""
    first, last = stage == 0, stage == stages - 1
    absent = ({Action.RECV_FORWARD, Action.SEND_BACKWARD} if first else set()) | (
        {Action.SEND_FORWARD, Action.RECV_BACKWARD} if last else set()
    )
    kept = sorted((p for p in posts if p.action not in absent), key=lambda p: TRANSFERS.index(p.action))
    return kept + [Step(action=Action.WAIT)] if kept else []


def one_f_one_b(*, stage: int, stages: int, microbatches: int) -> tuple[Step, ...]:
    """Every step stage ``stage`` runs in one iteration, in order."""
    if not 0 <= stage < stages or microbatches < 1:
        raise ValueError(f"bad schedule: stage {stage} of {stages}, {microbatches} microbatches")
    warmup = warmup_forwards(stage=stage, stages=stages, microbatches=microbatches)
    steady = microbatches - warmup

    def comm(*posts: tuple[Action, int]) -> list[Step]:
        return _transfers(stage, stages, [Step(action=a, mb=m) for a, m in posts])

    def compute(action: Action, mb: int) -> list[Step]:
        return [Step(action=action, mb=mb)]

    steps: list[Step] = []
    for mb in range(warmup):
        steps += (
            comm((Action.RECV_FORWARD, mb)) + compute(Action.FORWARD, mb) + comm((Action.SEND_FORWARD, mb))
        )
    if steady:
        steps += comm((Action.RECV_FORWARD, warmup))
    for i in range(steady):
        fwd = warmup + i
        steps += compute(Action.FORWARD, fwd) + comm((Action.SEND_FORWARD, fwd), (Action.RECV_BACKWARD, i))
        steps += compute(Action.BACKWARD, i)
        if i == steady - 1:
            steps += comm((Action.SEND_BACKWARD, i))
        else:
            steps += comm((Action.SEND_BACKWARD, i), (Action.RECV_FORWARD, fwd + 1))
    for mb in range(steady, microbatches):
        steps += (
            comm((Action.RECV_BACKWARD, mb)) + compute(Action.BACKWARD, mb) + comm((Action.SEND_BACKWARD, mb))
        )
    return tuple(steps)
