"""A program's layer blocks, found and marked without the program's help: in a trace, where a
replay's delay reads them, and nowhere else."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
from torch.profiler import profile
from torch.utils.checkpoint import checkpoint

from prism.capture import annotate
from prism.capture.program_layers import layer_blocks
from prism.capture.program_phases import ProgramPhases
from prism.schemas.annotations import Mark, Part, Phase, try_parse_mark


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> tuple[torch.Tensor, None]:
        return x + self.down(torch.tanh(self.up(x))) * scale, None


class Model(torch.nn.Module):
    """A decoder as programs write one: embedding, ``layers.<i>`` returning tuples, head."""

    def __init__(self, layers: int = 3, recompute: bool = False) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)
        self.layers = torch.nn.ModuleList(Block() for _ in range(layers))
        self.head = torch.nn.Linear(8, 32)
        self.recompute = recompute

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            # Activation checkpointing calls the block again inside the backward pass.
            h, _ = (
                checkpoint(layer, h, use_reentrant=False, scale=0.5)
                if self.recompute
                else layer(h, scale=0.5)
            )
        return self.head(h)


class Wrapper(torch.nn.Module):
    """Stands for DDP: the model is its child."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.module(ids)


def test_layer_blocks_are_the_outermost_integer_named_container():
    class Experts(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(4))

    class Stage(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())  # not a layer stack
            self.trunk = torch.nn.Module()
            self.trunk.layers = torch.nn.ModuleDict(
                {"4": Experts(), "5": Experts()}
            )  # a later pipeline stage
            self.heads = torch.nn.ModuleDict({"lm": torch.nn.Linear(2, 2)})  # names, not indices

    stage = Stage()
    found = list(layer_blocks(Wrapper(stage)))
    assert [i for i, _ in found] == [4, 5]
    assert [b for _, b in found] == [stage.trunk.layers["4"], stage.trunk.layers["5"]]  # not their experts


def test_a_compiled_modules_inside_is_not_searched_but_a_compiled_block_is_marked():
    model = Model(2)
    compiled = torch.compile(model)
    assert list(layer_blocks(compiled)) == []
    model.layers[1] = torch.compile(model.layers[1])  # compiled block by block
    assert [b for _, b in layer_blocks(model)] == [model.layers[0], model.layers[1]]


def _train(
    model: torch.nn.Module, steps: int, *, profiled_from: int | None = None, trace: Path | None = None
):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    phases = ProgramPhases()
    phases.install()
    prof = profile() if profiled_from is not None else None
    try:
        for step in range(steps):
            if prof is not None and step == profiled_from:
                prof.__enter__()
            ids = torch.randint(0, 32, (2, 4))
            model(ids).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        if prof is not None:
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(str(trace))
        phases.remove()


def _marks(trace: Path) -> list[tuple[Mark, float, float]]:
    events = json.loads(trace.read_text())["traceEvents"]
    out = []
    for e in events:
        mark = try_parse_mark(e.get("name", "")) if e.get("ph") == "X" else None
        if mark is not None:
            out.append((mark, float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    return out


@pytest.mark.parametrize("recompute", [False, True])
def test_traced_iterations_mark_each_layers_forward_and_backward(tmp_path: Path, recompute: bool):
    trace = tmp_path / "trace.json"
    model = Model(3, recompute)

    # The block's own hooks (FSDP's unshard before its forward, reshard after) belong to its mark.
    def own_hook(*_: object) -> None:
        torch.cumsum(torch.ones(2), 0)

    model.layers[0].register_forward_pre_hook(own_hook, prepend=True)
    model.layers[0].register_forward_hook(own_hook)
    _train(Wrapper(model), 3, profiled_from=2, trace=trace)
    marks = _marks(trace)
    fwd = [(m.layer, s, e) for m, s, e in marks if m.phase == Phase.FORWARD and m.layer is not None]
    bwd = [(m.layer, s, e) for m, s, e in marks if m.phase == Phase.BACKWARD and m.layer is not None]
    assert [layer for layer, *_ in fwd] == [0, 1, 2]  # once each: recomputation is not marked again
    assert [layer for layer, *_ in sorted(bwd, key=lambda b: b[1])] == [2, 1, 0]
    (root_fwd,) = [(s, e) for m, s, e in marks if m.phase == Phase.FORWARD and m.layer is None]
    (root_bwd,) = [(s, e) for m, s, e in marks if m.phase == Phase.BACKWARD and m.layer is None]
    eps = 1e-3
    assert all(root_fwd[0] - eps <= s and e <= root_fwd[1] + eps for _, s, e in fwd)
    assert all(root_bwd[0] - eps <= s and e <= root_bwd[1] + eps for _, s, e in bwd)
    spans = sorted((s, e) for _, s, e in bwd)
    assert all(a[1] <= b[0] + eps for a, b in zip(spans, spans[1:], strict=False))  # one after another
    # Each backward range holds its own layer's two linear backward ops (and recomputation's forward).
    events = json.loads(trace.read_text())["traceEvents"]
    addmm = [float(e["ts"]) for e in events if e.get("name") == "AddmmBackward0"]
    for _, s, e in bwd:
        assert sum(s - eps <= t <= e + eps for t in addmm) == 2
    hooks = [float(e["ts"]) for e in events if e.get("name") == "aten::cumsum"]
    hooks = [t for t in hooks if root_fwd[0] <= t <= root_fwd[1]]  # not recomputation's
    _, s, e = fwd[0]
    assert len(hooks) == 2 and all(s <= t <= e for t in hooks)


def test_untraced_iterations_open_no_layer_mark(monkeypatch: pytest.MonkeyPatch):
    opened: list[Mark] = []
    real_mark = annotate.mark

    def counting(m: Mark):
        opened.append(m)
        return real_mark(m)

    monkeypatch.setattr(annotate, "mark", counting)
    _train(Wrapper(Model(3)), 3)
    assert opened and all(m.layer is None for m in opened)  # the roots' phases only


def test_a_block_hook_sees_every_layers_forward_and_backward():
    seen: list[Mark] = []
    annotate.set_block_hook(seen.append)
    try:
        _train(Wrapper(Model(2)), 2)
    finally:
        annotate.set_block_hook(None)
    # Roots are found at the first step: the second iteration's layers, forward then backward.
    layers = [(m.phase, m.layer) for m in seen if m.layer is not None]
    fwd, bwd = Phase.FORWARD, Phase.BACKWARD
    assert layers == [(fwd, 0), (fwd, 1), (bwd, 1), (bwd, 0)]


class Stage(torch.nn.Module):
    """A pipeline stage: activations in, its ``layers.<i>``, a head."""

    def __init__(self, layers: int = 3) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Block() for _ in range(layers))
        self.head = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x, _ = layer(x)
        return self.head(x)


def test_a_split_backwards_weight_runs_name_the_layer_of_their_parameters(tmp_path: Path):
    """torch.distributed.pipelining's zero-bubble schedules compute a microbatch's input gradients
    in one run of the engine and its weights' later, a run per group of parameters: each weight
    run is marked with the layer block its parameters are in, or none (the head's)."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    stage, trace = Stage(3), tmp_path / "trace.json"
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.01)
    phases = ProgramPhases()
    phases.install()
    try:
        for step in range(2):  # roots are found at the first step: the second is traced
            with profile() if step else contextlib.nullcontext() as prof:
                x = torch.randn(2, 4, 8, requires_grad=True)
                loss = stage(x).square().mean()
                _, groups = stage_backward_input([loss], None, [x], stage.parameters())
                assert all(p.grad is None for p in stage.parameters())
                stage_backward_weight(stage.parameters(), groups)
                assert all(p.grad is not None for p in stage.parameters())
                optimizer.step()
                optimizer.zero_grad()
        prof.export_chrome_trace(str(trace))
    finally:
        phases.remove()
    marks = _marks(trace)
    weights = sorted((s, m) for m, s, _ in marks if m.part == Part.WEIGHTS)
    # A run per linear (its weight and bias), in the order the stage holds them; the head's in no layer.
    assert [m.layer for _, m in weights] == [0, 0, 1, 1, 2, 2, None]
    assert all(m.phase == Phase.BACKWARD for _, m in weights)
    # The input gradients' run is the stage's own backward, its blocks' ranges inside it.
    runs = [m for m, *_ in marks if m.phase == Phase.BACKWARD and m.layer is None and m.part is None]
    assert len(runs) == 1
    assert sorted(
        m.layer for m, *_ in marks if m.phase == Phase.BACKWARD and m.part is None and m.layer is not None
    ) == [0, 1, 2]
