"""The GPT stage in one process: the loss is plain cross-entropy, and a profiled step carries
every mark, properly nested, with each layer's backward inside its microbatch's backward."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import profile

from prism.capture.workloads.gpt.config import GPTConfig
from prism.capture.workloads.gpt.cross_entropy import vocab_parallel_cross_entropy
from prism.capture.workloads.gpt.tensor_parallel import TPGroup
from prism.capture.workloads.gpt.train import GPTWorkload
from prism.schemas.annotations import Mark, Part, Phase, try_parse_mark

CFG = GPTConfig(
    layers=3, hidden=16, heads=2, seq_len=8, vocab=32, micro_batch_size=2, microbatches=3, tp=1, pp=1, dp=1
)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_cross_entropy_matches_torch(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, 11, (2, 5))
    ours = vocab_parallel_cross_entropy(logits, labels, TPGroup(rank=0, size=1, group=None))
    (grad,) = torch.autograd.grad(ours, logits)
    ref_logits = logits.detach().double().requires_grad_()
    ref = F.cross_entropy(ref_logits.view(-1, 11), labels.view(-1))
    (ref_grad,) = torch.autograd.grad(ref, ref_logits)
    tol = 1e-12 if dtype == torch.float64 else 1e-2
    assert ours.item() == pytest.approx(ref.item(), rel=tol)
    assert grad.dtype == dtype
    torch.testing.assert_close(grad.double(), ref_grad, rtol=tol, atol=tol)


@dataclass(frozen=True, kw_only=True)
class Profiled:
    """One profiled training step of a single-process workload."""

    workload: GPTWorkload
    """The workload, after two steps."""
    first_loss: float | None
    """Loss of the unprofiled first step."""
    marks: list[tuple[Mark, float, float]]
    """(mark, start, end) of every prism mark of the profiled step, in start order."""


@pytest.fixture(scope="module")
def profiled() -> Profiled:
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        workload = GPTWorkload(CFG)
        first_loss = workload.train_step(0).loss
        with profile() as prof:
            workload.train_step(1)
    finally:
        dist.destroy_process_group()
    marks = [
        (m, e.time_range.start, e.time_range.end) for e in prof.events() if (m := try_parse_mark(e.name))
    ]
    return Profiled(
        workload=workload, first_loss=first_loss, marks=sorted(marks, key=lambda x: (x[1], -x[2]))
    )


def test_workload_attributes_and_loss(profiled: Profiled) -> None:
    workload = profiled.workload
    assert workload.stage == 0 and workload.rank == 0
    assert workload.parameter_count == sum(p.numel() for p in workload.model.parameters())
    assert profiled.first_loss == pytest.approx(math.log(CFG.vocab), rel=0.2)  # near-uniform predictions


def test_marks_nest_properly(profiled: Profiled) -> None:
    stack: list[tuple[Mark, float, float]] = []
    for mark, start, end in profiled.marks:  # every range lies inside those still open when it starts
        while stack and stack[-1][2] <= start:
            stack.pop()
        assert not stack or end <= stack[-1][2], f"{mark} overlaps {stack[-1][0]}"
        if mark.phase == Phase.BACKWARD and (mark.layer is not None or mark.part is not None):
            assert any(
                m.phase == Phase.BACKWARD and m.mb == mark.mb and m.layer is None and m.part is None
                for m, _, _ in stack
            )
        stack.append((mark, start, end))


def test_every_block_is_marked_once_per_microbatch(profiled: Profiled) -> None:
    marks = [m for m, _, _ in profiled.marks]
    per_mb = Counter((m.phase, m.mb, m.layer, m.part) for m in marks if m.mb is not None)
    for mb in range(CFG.microbatches):
        for phase in (Phase.FORWARD, Phase.BACKWARD):
            keys = [(phase, mb, None, None)] + [(phase, mb, layer, None) for layer in range(CFG.layers)]
            # the GPT's backward is one pass: no weight run of a split backward
            keys += [(phase, mb, None, part) for part in Part if part is not Part.WEIGHTS]
            assert all(per_mb[k] == 1 for k in keys), (phase, mb)
    assert not any(m.part is Part.WEIGHTS for m in marks)
    phases = Counter(m.phase for m in marks)
    assert phases[Phase.ITERATION] == phases[Phase.OPTIMIZER] == 1
    assert phases[Phase.GRAD_SYNC] == 1 + len(profiled.workload.grad_sync.buckets)


def test_backward_of_layers_runs_last_layer_first(profiled: Profiled) -> None:
    bwd = [m for m, _, _ in profiled.marks if m.phase == Phase.BACKWARD and m.mb == 0]
    blocks = [m.part.value if m.part else m.layer for m in bwd if m.layer is not None or m.part is not None]
    assert blocks == ["loss", "head", *reversed(range(CFG.layers)), "embed"]
