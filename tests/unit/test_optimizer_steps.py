"""A program's training step is its outermost optimizer step: a container optimizer that is an
``Optimizer`` and steps inner ones (torchtitan's ``OptimizersContainer``, ZeroRedundancyOptimizer)
must end one iteration, not one per optimizer, and so must its phase marks."""

from __future__ import annotations

import pytest
import torch

from prism.capture import annotate
from prism.capture.optimizer_steps import register_outer_step_hooks
from prism.capture.phase_timer import PhaseTimer
from prism.capture.program_phases import ProgramPhases


class Container(torch.optim.Optimizer):
    """Steps one inner optimizer per model part, as torchtitan's OptimizersContainer does."""

    def __init__(self, parts: list[list[torch.nn.Parameter]]) -> None:
        self.inner = [torch.optim.SGD(params, lr=0.1) for params in parts]
        super().__init__([p for params in parts for p in params], {"lr": 0.1})

    def step(self, closure=None) -> None:  # noqa: ANN001
        for optimizer in self.inner:
            optimizer.step()


def parameters(n: int) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.ones(2)) for _ in range(n)]


@pytest.fixture
def seen():
    events: list[tuple[str, object]] = []
    hooks = register_outer_step_hooks(
        pre=lambda opt, *_: events.append(("pre", opt)), post=lambda opt, *_: events.append(("post", opt))
    )
    yield events
    hooks.remove()


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_a_container_optimizer_is_one_step(seen, parts):
    container = Container([parameters(1) for _ in range(parts)])
    for _ in range(4):
        container.step()
    assert seen == [("pre", container), ("post", container)] * 4


def test_plain_optimizers_stepped_in_turn_are_each_a_step(seen):
    first, second = torch.optim.SGD(parameters(1), lr=0.1), torch.optim.AdamW(parameters(1))
    first.step()
    second.step()
    assert seen == [("pre", first), ("post", first), ("pre", second), ("post", second)]


def test_a_step_that_raised_does_not_swallow_later_steps(seen):
    class Failing(torch.optim.SGD):
        def step(self, closure=None):  # noqa: ANN001
            raise RuntimeError("inf in gradients")

    failing, plain = Failing(parameters(1), lr=0.1), torch.optim.SGD(parameters(1), lr=0.1)
    with pytest.raises(RuntimeError):
        failing.step()
    plain.step()
    plain.step()
    assert seen[1:] == [("pre", plain), ("post", plain)] * 2


def test_removed_hooks_see_nothing(seen):
    calls = []
    hooks = register_outer_step_hooks(post=lambda *_: calls.append(1))
    hooks.remove()
    torch.optim.SGD(parameters(1), lr=0.1).step()
    assert calls == [] and len(seen) == 2


def test_a_container_steps_optimizer_phase_spans_its_inner_steps():
    """The optimizer mark opens at the container's step and closes after its last inner step."""
    timer = PhaseTimer()
    phases = ProgramPhases()
    annotate.set_phase_timer(timer)
    phases.install()
    try:
        container = Container([parameters(50), parameters(50)])
        container.step()
        timer.take()
        container.step()
        spans = timer.take()
    finally:
        phases.remove()
        annotate.set_phase_timer(None)
    assert [span.kind for span in spans] == ["optim"]
