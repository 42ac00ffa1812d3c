"""A program's forward, backward and optimizer marks, found without the program's help."""

from __future__ import annotations

import threading
import time

import torch
from torch.utils.checkpoint import checkpoint

from prism.capture.phase_timer import PhaseTimer
from prism.capture.program_phases import ProgramPhases, root_modules


class Wrapper(torch.nn.Module):
    """Stands for DDP or FSDP: holds the model as a child."""

    def __init__(self, module: torch.nn.Module, *, recompute: bool = False) -> None:
        super().__init__()
        self.module, self.recompute = module, recompute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute:
            return checkpoint(self.module, x, use_reentrant=False)
        return self.module(x)


def _train(model: torch.nn.Module, steps: int, timer: PhaseTimer) -> list[list[str]]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.MSELoss()  # a root without parameters: glue, not forward
    kinds = []
    phases = ProgramPhases()
    phases.install()
    try:
        for _ in range(steps):
            x = torch.randn(4, 8)
            loss = loss_fn(model(x), torch.zeros(4, 8))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            kinds.append([span.kind for span in timer.take()])
    finally:
        phases.remove()
    return kinds


def test_phases_of_each_iteration(timer):
    model = Wrapper(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)))
    kinds = _train(model, 3, timer)
    # The roots are found at the first step: the first iteration has no forward mark.
    assert kinds[0] == ["bwd", "optim"]
    assert kinds[1] == kinds[2] == ["fwd", "bwd", "optim"]  # one forward: the root's, not its children's


def test_recomputation_belongs_to_backward(timer):
    model = Wrapper(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()), recompute=True)
    kinds = _train(model, 3, timer)
    assert kinds[2] == ["fwd", "bwd", "optim"]


def test_removed_marks_nothing(timer):
    model = Wrapper(torch.nn.Linear(8, 8))
    _train(model, 2, timer)
    x = torch.randn(2, 8)
    model(x).sum().backward()
    assert timer.take() == []
    assert torch.autograd._engine_run_backward is torch.autograd.graph._engine_run_backward


def test_other_threads_are_not_marked(timer):
    model = Wrapper(torch.nn.Linear(8, 8))
    _train(model, 2, timer)  # roots found; hooks removed again
    phases = ProgramPhases()
    phases.install()
    try:
        worker = threading.Thread(target=lambda: model(torch.randn(2, 8)).sum().backward())
        worker.start()
        worker.join()
    finally:
        phases.remove()
    assert timer.take() == []


def test_roots_own_stepped_parameters():
    inner = torch.nn.Linear(3, 3)
    wrapped = Wrapper(inner)
    unstepped = torch.nn.Linear(3, 3)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    roots = root_modules()
    assert any(root is wrapped for root in roots)
    assert not any(root is inner for root in roots)  # a child of the wrapper
    assert not any(root is unstepped for root in roots)  # no optimizer steps it
    del optimizer


def test_a_real_runs_phases_are_timed_without_marks(monkeypatch):
    from prism.capture import annotate
    from prism.fidelity.timed_run import TimedPhases

    def no_mark(*_):  # a mark costs the real run 10-150 µs: its phases must not open one
        raise AssertionError("a real run opened a mark")

    monkeypatch.setattr(annotate, "mark", no_mark)
    model = Wrapper(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)))
    optimizer = torch.optim.Adam(model.parameters())
    phases = TimedPhases()
    phases.install()
    taken = []
    try:
        for _ in range(3):
            began = time.perf_counter_ns()
            model(torch.randn(32, 64)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            taken.append((*phases.take(), time.perf_counter_ns() - began))
    finally:
        phases.remove()
    assert set(taken[0][0]) == {"bwd", "optim"}  # roots are found at the first step
    for wall_ns, spent_ns, iteration_ns in taken[1:]:
        assert set(wall_ns) == {"fwd", "bwd", "optim"}
        assert 0 < sum(wall_ns.values()) <= iteration_ns
        assert 0 < spent_ns < sum(wall_ns.values())


def test_a_rank_with_several_roots_names_which_one_each_forward_runs(monkeypatch):
    # A schedule's two stages on one rank: each forward mark says which root runs, so that a
    # build does not take the two stages' passes for one stage's microbatches.
    import contextlib

    from prism.capture import program_phases

    marks = []
    monkeypatch.setattr(
        program_phases.annotate, "mark", lambda mark: marks.append(mark) or contextlib.nullcontext()
    )
    first, second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD([*first.parameters(), *second.parameters()], lr=0.01)
    phases = ProgramPhases()
    phases.install()
    try:
        for _ in range(3):
            second(first(torch.randn(4, 8))).sum().backward()
            optimizer.step()
    finally:
        phases.remove()
    forwards = [m.stage for m in marks if m.phase == "fwd"]
    assert forwards == [0, 1, 0, 1]  # numbered as the optimizer holds their parameters
    del optimizer


class Stage(torch.nn.Module):
    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_each_of_several_roots_names_its_layers_and_parameters_by_the_optimizers_order(monkeypatch):
    # An interleaved schedule's two stages on one rank, made in one order and stepped in the
    # other: their layer marks and parameters name the stage as the optimizer numbers them, so
    # that a build can walk each stage's layers and copy each stage's parameters.
    import contextlib

    from prism.capture import program_phases

    marks = []
    monkeypatch.setattr(
        program_phases.annotate, "mark", lambda mark: marks.append(mark) or contextlib.nullcontext()
    )
    monkeypatch.setattr(program_phases.annotate, "marks_are_read", lambda: True)
    made_first, made_second = Stage(2), Stage(3)
    optimizer = torch.optim.SGD([*made_second.parameters(), *made_first.parameters()], lr=0.01)
    assert [r for r in root_modules(optimizer) if r in (made_first, made_second)] == [made_second, made_first]
    phases = ProgramPhases()
    phases.install()
    try:
        for _ in range(2):
            made_first(made_second(torch.randn(4, 8))).sum().backward()
            optimizer.step()
    finally:
        phases.remove()
    layer_forwards = [(m.stage, m.layer) for m in marks if m.phase == "fwd" and m.layer is not None]
    assert layer_forwards == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    held = phases.held_parameters()
    assert held is not None and held.stages == (0,) * 6 + (1,) * 4
    assert held.layers == (0, 0, 1, 1, 2, 2, 0, 0, 1, 1)
    del optimizer
