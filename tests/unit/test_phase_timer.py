"""The phase timer: top-level blocks of an iteration as annotate opens them, and their own time."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import torch
from test_comm_log_schema import _call

from prism.capture import annotate
from prism.capture.phase_timer import BlockSpan, PhaseTimer, block_wall_ns, own_phase_ns
from prism.schemas.annotations import GLUE, Direction, Phase, block_kind, is_block
from prism.schemas.comm_log import CommLog, CommTime


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_only_the_outermost_block_of_each_step_is_timed(timer: PhaseTimer) -> None:
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    with annotate.iteration(0):
        with annotate.forward(stage=0, mb=0):
            y = annotate.block(layer, x, stage=0, mb=0, layer=0)  # nested: inside the forward's span
        with annotate.send(direction=Direction.FORWARD, stage=0, mb=0, peer=1):
            pass
        with annotate.backward(stage=0, mb=0):
            y.sum().backward()
        with annotate.grad_sync():
            with annotate.grad_sync(bucket=0):
                pass
        with annotate.optimizer():
            _busy(0.002)
    spans = timer.take()
    assert [s.kind for s in spans] == ["fwd", "send_fwd", "bwd", "grad_sync", "optim"]
    assert all(a.end_ns <= b.start_ns for a, b in zip(spans, spans[1:], strict=False))
    assert spans[-1].end_ns - spans[-1].start_ns >= 2_000_000
    assert timer.take() == []  # taken: the next iteration starts empty


def test_marks_of_other_threads_and_after_the_timer_is_unset_are_not_timed(timer: PhaseTimer) -> None:
    def elsewhere() -> None:
        with annotate.optimizer():
            pass

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert timer.take() == []
    annotate.set_phase_timer(None)
    with annotate.optimizer():
        pass
    assert timer.take() == []


def test_a_block_that_raises_still_closes(timer: PhaseTimer) -> None:
    with pytest.raises(RuntimeError), annotate.optimizer():
        raise RuntimeError("boom")
    with annotate.forward(stage=0, mb=1):
        pass
    assert [s.kind for s in timer.take()] == ["optim", "fwd"]  # depth back to 0 after the raise


def test_block_kinds_name_transfers_by_direction_and_skip_non_blocks() -> None:
    assert block_kind(Phase.SEND, Direction.FORWARD) == "send_fwd"
    assert block_kind("recv", "bwd") == "recv_bwd"
    assert block_kind(Phase.OPTIMIZER) == "optim"
    assert [block_kind(p) for p in ("iter", "comm", "", "nonsense")] == [None] * 4
    assert is_block("p2p_wait") and not is_block("iter")


def test_own_time_leaves_out_calls_and_held_time_and_glue_is_the_rest() -> None:
    # One iteration of 1000 ns own time: fwd 100-400 with a call 150-170 (held 200-250 waiting
    # on it), optim 500-600 with a call 540-560 inside its clock from 550.
    calls = (
        _call(0, enter=150, exit=170, done=250, wait=200),
        _call(1, enter=540, exit=560, done=560, clock=10),
    )
    log = CommLog(rank=0, world_size=2, calls=calls)
    spans = [BlockSpan("fwd", 100, 400), BlockSpan("optim", 500, 600)]
    (own,) = own_phase_ns([spans], log, [1000])
    assert own["fwd"] == 300 - 20 - 50
    # The glue between the blocks (400-500) leads into the optimizer step: the trace puts it in
    # the gap before the step's first op, in the step's template.
    assert own["optim"] == 200 - 20
    # Glue: the iteration's own time (already without held time) less the blocks' and the glue
    # led into them, with their calls in: 1000 - (300 - 50) - (200 - 10); before the first block
    # and after the last.
    assert own[GLUE] == 1000 - 250 - 190
    assert CommTime(log).within(0, 1000) == 20 + 50 + 20


def test_a_wait_holds_no_op_and_passes_its_own_time_to_the_block_after_it() -> None:
    # recv posted 0-100, waited on 100-300 (held 150-280 for the transfer), backward 350-900:
    # the trace cuts nothing at the wait, so its own 70 ns and the glue after it are backward's.
    log = CommLog(rank=0, world_size=2, calls=(_call(0, enter=20, exit=40, done=280, wait=150),))
    spans = [BlockSpan("recv_bwd", 0, 100), BlockSpan("p2p_wait", 100, 300), BlockSpan("bwd", 350, 900)]
    (own,) = own_phase_ns([spans], log, [1000 - 130])
    assert "p2p_wait" not in own
    assert own["recv_bwd"] == 100 - 20
    assert own["bwd"] == (200 - 130) + 50 + 550
    assert own[GLUE] == (1000 - 130) - 100 - (200 - 130 + 600)
    (trailing,) = own_phase_ns([spans[:2]], log, [1000 - 130])
    assert trailing[GLUE] == (1000 - 130) - 100  # a wait last in the iteration: glue


def test_a_posted_transfers_post_is_own_time_and_its_wait_is_not() -> None:
    # The comm model prices a transfer from the later post on; the post itself (20-40) is host
    # work the graph keeps as a node after the call's, so the block's own time keeps it too.
    posted = dataclasses.replace(
        _call(0, enter=20, exit=40, done=280, wait=150), op="send", peer=1, async_op=True
    )
    log = CommLog(rank=0, world_size=2, calls=(posted,))
    spans = [BlockSpan("send_fwd", 0, 100), BlockSpan("p2p_wait", 100, 300), BlockSpan("fwd", 300, 400)]
    (own,) = own_phase_ns([spans], log, [1000 - 130])
    assert own["send_fwd"] == 100
    assert own["fwd"] == (200 - 130) + 100
    blocking = dataclasses.replace(posted, async_op=False)
    (own,) = own_phase_ns([spans], CommLog(rank=0, world_size=2, calls=(blocking,)), [1000 - 130])
    assert own["send_fwd"] == 100 - 20  # a blocking call is priced whole


def test_own_time_of_an_iteration_without_blocks_is_all_glue() -> None:
    assert own_phase_ns([[]], CommLog(rank=0, world_size=1), [500]) == ({GLUE: 500},)


def test_block_wall_time_keeps_the_calls_and_holds_inside_each_block() -> None:
    spans = [BlockSpan("fwd", 100, 400), BlockSpan("bwd", 400, 900), BlockSpan("fwd", 950, 1000)]
    assert block_wall_ns([spans, []]) == ({"fwd": 350, "bwd": 500}, {})
