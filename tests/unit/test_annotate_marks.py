"""annotate.* marks as the real PyTorch profiler records them, including per-block backward ranges."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from prism.capture import annotate
from prism.schemas.annotations import Mark, Part, Phase, format_mark, parse_mark, try_parse_mark

EPS_US = 1e-3  # chrome traces carry microseconds with ns precision
FWD = dict(phase=Phase.FORWARD, stage=0, mb=0)
BWD = dict(phase=Phase.BACKWARD, stage=0, mb=0)
EXPECTED = [
    Mark(phase=Phase.ITERATION, iter=0),
    Mark(**FWD),
    Mark(**FWD, part=Part.EMBED),
    Mark(**FWD, layer=0),
    Mark(**FWD, layer=1),
    Mark(**BWD),
    Mark(**BWD, layer=0),
    Mark(**BWD, layer=1),
    Mark(**BWD, part=Part.EMBED),
]


@dataclass(frozen=True)
class Event:
    name: str
    ts: float
    dur: float

    @property
    def end(self) -> float:
        return self.ts + self.dur

    def contains(self, other: Event) -> bool:
        return self.ts - EPS_US <= other.ts and other.end <= self.end + EPS_US


def layer_fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ w)


def train_step(device: str) -> None:
    torch.manual_seed(0)
    embed = torch.nn.Embedding(16, 8).to(device)
    weights = [torch.randn(8, 8, device=device, requires_grad=True) for _ in range(2)]
    ids = torch.tensor([[1, 2, 3, 4]], device=device)
    with annotate.iteration(0):
        with annotate.forward(stage=0, mb=0):
            h = annotate.block(embed, ids, stage=0, mb=0, part=Part.EMBED)
            for layer, w in enumerate(weights):
                h = annotate.block(partial(layer_fn, w=w), h, stage=0, mb=0, layer=layer)
            loss = h.square().mean()
        with annotate.backward(stage=0, mb=0):
            loss.backward()
    assert embed.weight.grad is not None and all(w.grad is not None for w in weights)


def profiled_events(tmp_path: Path, device: str) -> list[Event]:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        train_step(device)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    raw = json.loads(path.read_text())["traceEvents"]
    return [Event(e["name"], float(e["ts"]), float(e["dur"])) for e in raw if e.get("ph") == "X"]


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> list[Event]:
    return profiled_events(tmp_path_factory.mktemp("trace"), "cpu")


def marks_by_name(events: list[Event]) -> dict[str, Event]:
    prism = [e for e in events if e.name.startswith("prism:")]
    names = [e.name for e in prism]
    for m in EXPECTED:
        assert names.count(format_mark(m)) == 1, (
            f"{format_mark(m)} appears {names.count(format_mark(m))} times"
        )
    assert sorted(names) == sorted(format_mark(m) for m in EXPECTED)
    for e in prism:
        assert parse_mark(e.name) in EXPECTED
    return {e.name: e for e in prism}


def check_marks(events: list[Event]) -> None:
    by_name = marks_by_name(events)

    def ev(**kw: object) -> Event:
        return by_name[format_mark(Mark(**kw))]

    iteration, fwd, bwd = ev(phase=Phase.ITERATION, iter=0), ev(**FWD), ev(**BWD)
    assert iteration.contains(fwd) and iteration.contains(bwd) and fwd.end <= bwd.ts + EPS_US
    fwd_layers = [ev(**FWD, layer=i) for i in (0, 1)]
    bwd_layers = [ev(**BWD, layer=i) for i in (0, 1)]
    fwd_embed, bwd_embed = ev(**FWD, part=Part.EMBED), ev(**BWD, part=Part.EMBED)

    # forward in program order, backward in reverse; block ranges do not overlap
    assert fwd_embed.end <= fwd_layers[0].ts + EPS_US and fwd_layers[0].end <= fwd_layers[1].ts + EPS_US
    assert bwd_layers[1].end <= bwd_layers[0].ts + EPS_US and bwd_layers[0].end <= bwd_embed.ts + EPS_US
    assert all(fwd.contains(e) for e in (fwd_embed, *fwd_layers))
    assert all(bwd.contains(e) for e in (bwd_embed, *bwd_layers))  # the embed range was closed in time
    assert all(e.dur > 0 for e in (bwd_embed, *bwd_layers))

    # each block range holds its own layer's ops and nobody else's
    def inside(span: Event, name: str) -> list[Event]:
        return [e for e in events if e.name == name and span.contains(e)]

    for name in ("MmBackward0", "TanhBackward0"):
        assert [len(inside(r, name)) for r in bwd_layers] == [1, 1], name
        assert len(inside(bwd_embed, name)) == 0
        assert {e for r in bwd_layers for e in inside(r, name)} == {e for e in events if e.name == name}
    assert len(inside(bwd_embed, "EmbeddingBackward0")) == 1
    assert not any(inside(r, "EmbeddingBackward0") for r in bwd_layers)
    mm = [e for e in events if e.name == "aten::mm"]
    for r in bwd_layers:
        assert len([e for e in mm if r.contains(e)]) == 2  # grad of input and of weight
    assert [len([e for e in mm if r.contains(e)]) for r in fwd_layers] == [1, 1]
    assert len(inside(fwd_embed, "aten::embedding")) == 1


def test_marks_in_profiler_trace(events: list[Event]) -> None:
    check_marks(events)
    assert annotate._open_ranges() == []  # nothing left open on this thread


def test_every_prism_event_parses(events: list[Event]) -> None:
    names = {e.name for e in events}
    assert {n for n in names if try_parse_mark(n) is not None} == {n for n in names if n.startswith("prism:")}


def test_block_without_grad_adds_no_autograd_nodes() -> None:
    w = torch.randn(4, 4)
    with torch.no_grad():
        y = annotate.block(lambda x: x @ w, torch.randn(2, 4, requires_grad=True), stage=0, mb=0, layer=0)
    assert y.grad_fn is None
    z = annotate.block(lambda x: x @ w, torch.randn(2, 4), stage=0, mb=0, layer=0)
    assert z.grad_fn is None and not z.requires_grad


def test_block_is_an_identity_for_values_and_gradients() -> None:
    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(3, 4, requires_grad=True)
    ref = layer_fn(x, w)
    (gx_ref, gw_ref) = torch.autograd.grad(ref.sum(), (x, w))
    with annotate.backward(stage=0, mb=0):
        out = annotate.block(partial(layer_fn, w=w), x, stage=0, mb=0, layer=0)
        gx, gw = torch.autograd.grad(out.sum(), (x, w))
    assert torch.equal(out, ref) and torch.equal(gx, gx_ref) and torch.equal(gw, gw_ref)
    assert annotate._open_ranges() == []


@pytest.mark.parametrize("where", ["output", "input"])
def test_block_allows_in_place_ops(where: str) -> None:
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(2, 4, requires_grad=True) * 1.0  # a non-leaf activation, as between layers
    if where == "output":
        y = annotate.block(lambda t: t @ w, x, stage=0, mb=0, layer=0).add_(1)
    else:
        y = annotate.block(lambda t: t.mul_(2) @ w, x, stage=0, mb=0, layer=0)
    y.sum().backward()
    assert w.grad is not None


@pytest.mark.gpu
def test_marks_in_profiler_trace_cuda(tmp_path: Path) -> None:
    """On CUDA, autograd runs backward nodes on a device thread, not the caller's thread."""
    check_marks(profiled_events(tmp_path, "cuda"))
