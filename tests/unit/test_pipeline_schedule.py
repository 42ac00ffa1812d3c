"""The 1F1B schedule: Megatron's step order per stage, and no deadlock between stages."""

from __future__ import annotations

import pytest

from prism.schemas.pipeline_schedule import TRANSFERS, Action, Step, one_f_one_b, warmup_forwards

PP, M = 4, 8
COMPUTE = (Action.FORWARD, Action.BACKWARD)


def schedule(stage: int, stages: int = PP, microbatches: int = M) -> tuple[Step, ...]:
    return one_f_one_b(stage=stage, stages=stages, microbatches=microbatches)


def compute_steps(stage: int, stages: int = PP, microbatches: int = M) -> list[tuple[str, int]]:
    return [(s.action.value, s.mb) for s in schedule(stage, stages, microbatches) if s.action in COMPUTE]


def test_warmup_counts() -> None:
    assert [warmup_forwards(stage=s, stages=PP, microbatches=M) for s in range(PP)] == [3, 2, 1, 0]
    assert warmup_forwards(stage=0, stages=8, microbatches=4) == 4  # never more than M


@pytest.mark.parametrize("stage", range(PP))
def test_forwards_before_the_first_backward(stage: int) -> None:
    order = [a for a, _ in compute_steps(stage)]
    assert order.index("bwd") == PP - stage  # warm-up forwards plus the first steady forward


@pytest.mark.parametrize("stage", range(PP))
def test_each_microbatch_forward_once_then_backward_once(stage: int) -> None:
    steps = compute_steps(stage)
    assert [mb for a, mb in steps if a == "fwd"] == list(range(M))
    assert [mb for a, mb in steps if a == "bwd"] == list(range(M))
    for mb in range(M):
        assert steps.index(("fwd", mb)) < steps.index(("bwd", mb))


@pytest.mark.parametrize("stage", range(PP))
def test_in_flight_microbatches_bounded_by_pipeline_depth(stage: int) -> None:
    live = peak = 0
    for action, _ in compute_steps(stage):
        live += 1 if action == "fwd" else -1
        peak = max(peak, live)
    assert peak == PP - stage


def test_last_stage_alternates() -> None:
    assert compute_steps(PP - 1) == [(a, mb) for mb in range(M) for a in ("fwd", "bwd")]


def test_exact_order_of_stage_two() -> None:
    got = [(s.action.value, s.mb) for s in schedule(2, stages=4, microbatches=3)]
    wait = ("wait", None)
    assert got == [
        ("recv_fwd", 0), wait, ("fwd", 0), ("send_fwd", 0), wait,  # warm-up
        ("recv_fwd", 1), wait,
        ("fwd", 1), ("send_fwd", 1), ("recv_bwd", 0), wait, ("bwd", 0), ("recv_fwd", 2), ("send_bwd", 0), wait,
        ("fwd", 2), ("send_fwd", 2), ("recv_bwd", 1), wait, ("bwd", 1), ("send_bwd", 1), wait,
        ("recv_bwd", 2), wait, ("bwd", 2), ("send_bwd", 2), wait,  # cool-down
    ]  # fmt: skip


@pytest.mark.parametrize("stage", range(PP))
def test_transfers_per_microbatch_and_their_order(stage: int) -> None:
    steps = list(schedule(stage))
    first, last = stage == 0, stage == PP - 1
    expected = {
        Action.RECV_FORWARD: not first,
        Action.SEND_FORWARD: not last,
        Action.RECV_BACKWARD: not last,
        Action.SEND_BACKWARD: not first,
    }
    for action, present in expected.items():
        assert [s.mb for s in steps if s.action == action] == (list(range(M)) if present else [])

    def at(action: Action, mb: int) -> int:
        return steps.index(Step(action=action, mb=mb))

    for mb in range(M):
        if not first:  # the input arrives (and is waited for) before the forward uses it
            assert (
                at(Action.RECV_FORWARD, mb)
                < _next_wait(steps, at(Action.RECV_FORWARD, mb))
                < at(Action.FORWARD, mb)
            )
            assert at(Action.BACKWARD, mb) < at(Action.SEND_BACKWARD, mb)
        if not last:
            assert at(Action.FORWARD, mb) < at(Action.SEND_FORWARD, mb)
            assert (
                at(Action.RECV_BACKWARD, mb)
                < _next_wait(steps, at(Action.RECV_BACKWARD, mb))
                < at(Action.BACKWARD, mb)
            )


def _next_wait(steps: list[Step], index: int) -> int:
    return next(i for i in range(index, len(steps)) if steps[i].action == Action.WAIT)


def test_every_post_is_waited_for() -> None:
    for stage in range(PP):
        steps = schedule(stage)
        assert steps[-1].action in (Action.WAIT, Action.BACKWARD)
        posted = False
        for s in steps:
            if s.action in TRANSFERS:
                posted = True
            elif s.action == Action.WAIT:
                assert posted, "a WAIT with nothing posted"
                posted = False
            else:
                assert not posted, f"stage {stage} computes with transfers still outstanding"


def test_single_stage_has_no_transfers() -> None:
    steps = schedule(0, stages=1, microbatches=3)
    assert [(s.action.value, s.mb) for s in steps] == [
        ("fwd", 0),
        ("bwd", 0),
        ("fwd", 1),
        ("bwd", 1),
        ("fwd", 2),
        ("bwd", 2),
    ]


_COMPLEMENT = {
    Action.SEND_FORWARD: Action.RECV_FORWARD,
    Action.RECV_BACKWARD: Action.SEND_BACKWARD,
    Action.RECV_FORWARD: Action.SEND_FORWARD,
    Action.SEND_BACKWARD: Action.RECV_BACKWARD,
}


def _peer(stage: int, action: Action) -> int:
    return stage + 1 if action in (Action.SEND_FORWARD, Action.RECV_BACKWARD) else stage - 1


@pytest.mark.parametrize(("stages", "microbatches"), [(4, 8), (4, 4), (2, 5), (6, 6), (3, 16)])
def test_runs_to_completion_with_rendezvous_transfers(stages: int, microbatches: int) -> None:
    """Simulate blocking p2p (a transfer completes only when its peer posted the matching one,
    in the same order on each pair of stages, as on one NCCL stream per pair): every stage finishes."""
    programs = [list(schedule(s, stages, microbatches)) for s in range(stages)]
    pcs = [0] * stages
    channel: dict[tuple[int, int], list[Step]] = {}  # (from, to) -> posts in order
    outstanding: list[list[tuple[int, int]]] = [[] for _ in range(stages)]  # (peer, index in channel)

    def matched(stage: int, peer: int, index: int) -> bool:
        theirs = channel.get((peer, stage), [])
        if len(theirs) <= index:
            return False
        mine = channel[(stage, peer)][index]
        assert theirs[index] == Step(action=_COMPLEMENT[mine.action], mb=mine.mb), "mismatched transfer"
        return True

    progress = True
    while progress:
        progress = False
        for s in range(stages):
            while pcs[s] < len(programs[s]):
                step = programs[s][pcs[s]]
                if step.action in TRANSFERS:
                    posts = channel.setdefault((s, _peer(s, step.action)), [])
                    outstanding[s].append((_peer(s, step.action), len(posts)))
                    posts.append(step)
                elif step.action == Action.WAIT:
                    if not all(matched(s, peer, i) for peer, i in outstanding[s]):
                        break
                    outstanding[s].clear()
                pcs[s] += 1
                progress = True
    assert pcs == [len(p) for p in programs], f"deadlock at {pcs}"


@pytest.mark.parametrize(("stage", "stages", "microbatches"), [(4, 4, 8), (0, 2, 0), (-1, 2, 4)])
def test_rejects_bad_arguments(stage: int, stages: int, microbatches: int) -> None:
    with pytest.raises(ValueError):
        one_f_one_b(stage=stage, stages=stages, microbatches=microbatches)
