"""What a stage holds across iterations, from the parameters a capture read off the model: the
same as the GPT's own count for the stage captured and for stages of other layer counts, and a
CUDA capture's device bytes beyond the model kept per role."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from prism.capture.held_parameters import held_parameters, program_parameters
from prism.capture.workloads.gpt.config import GPTConfig
from prism.capture.workloads.gpt.params import stage_buckets, static_bytes
from prism.capture.workloads.gpt.train import GPTWorkload
from prism.graph.build.builder import BuildError, stage_holdings
from prism.graph.build.retarget import first_layer, holding, stage_parameters
from prism.graph.build.templates import TemplateError
from prism.peers import BACKEND_NAME, FreeRunningClock, VirtualWorld, activate
from prism.schemas.held_parameters import HeldParameters, HeldParametersError
from prism.schemas.layout import Role
from prism.schemas.pipeline_shape import PipelineShape

CONFIG = GPTConfig(
    layers=8, hidden=64, heads=4, seq_len=16, vocab=256, microbatches=4, tp=2, pp=4, dp=2, grad_bucket_mb=0.02
)
WORKSPACES = 2 * 32 * 2**20  # two cuBLAS workspaces, as a Hopper rank keeps them


def captured_parameters(cfg: GPTConfig, stage: int) -> HeldParameters:
    """What a capture of ``cfg`` reads off a rank of ``stage`` once its optimizer stepped."""
    rank = cfg.layout.rank(tp=1, dp=1, pp=stage)
    activate(VirtualWorld(real_ranks=frozenset({rank}), clock=FreeRunningClock()))
    dist.init_process_group(BACKEND_NAME, rank=rank, world_size=cfg.layout.world_size, store=dist.HashStore())
    try:
        workload = GPTWorkload(cfg)
        workload.optimizer.step()  # Adam's state exists from its first step on
        return held_parameters(workload.model, workload.optimizer, workload.grad_sync.bucket_bytes)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_what_the_capture_reads_is_the_gpts_own_count_here_and_at_other_layer_counts(stage: int) -> None:
    held = captured_parameters(CONFIG, stage)
    assert holding(held, data_parallel=True).static_bytes == static_bytes(CONFIG, stage)
    assert holding(held, data_parallel=False).static_bytes == static_bytes(replace(CONFIG, dp=1), stage)
    # The same role's stage of a model with three times the layers: its blocks copied, the
    # embeddings (first stage) and head (last stage) kept, its buckets planned again.
    target = replace(CONFIG, layers=24, dp=8)
    moved = holding(stage_parameters(held, target.stage_layers(stage)), data_parallel=True)
    assert moved.static_bytes == static_bytes(target, stage)
    assert [b.numel for b in moved.buckets] == [b.numel for b in stage_buckets(target, stage, 4)]
    assert moved.parameters.layers.count(target.stage_layers(stage).start) == held.layers.count(
        held.layers[2]
    )


def record(layers: list[int], numels: list[int]) -> HeldParameters:
    return HeldParameters(
        numels=tuple(numels), layers=tuple(layers), held_bytes=tuple(16 * n for n in numels), itemsize=4,
        bucket_bytes=1 << 20,
    )  # fmt: skip


def test_blocks_that_differ_or_parameters_between_blocks_keep_the_captured_layers() -> None:
    unlike = record([-1, 0, 0, 1, -1], [10, 4, 4, 5, 3])
    assert stage_parameters(unlike, range(2)) == unlike  # its own layers: as captured
    with pytest.raises(TemplateError, match="different parameters"):
        stage_parameters(unlike, range(4))
    with pytest.raises(TemplateError, match="between its layer blocks"):
        stage_parameters(record([0, -1, 1], [4, 1, 4]), range(3))
    with pytest.raises(TemplateError, match="no parameters in layer blocks"):
        stage_parameters(record([-1], [4]), range(3))
    # Two pipeline stages on one rank (interleaved schedules), each numbering its blocks from 0.
    with pytest.raises(TemplateError, match="more than one run"):
        stage_parameters(record([-1, 0, 1, 0, 1, -1], [10, 4, 4, 4, 4, 3]), range(4))
    with pytest.raises(HeldParametersError, match="one entry a parameter"):
        HeldParameters(numels=(1, 2), layers=(0,), held_bytes=(4, 8), itemsize=4, bucket_bytes=1)


def test_each_stage_of_a_rank_that_holds_several_copies_its_own_blocks() -> None:
    # An interleaved schedule's rank: stage 0 holds the embedding and two blocks, stage 1 two
    # blocks of another size and the head, each numbering its blocks from 0.
    held = replace(
        record([-1, 0, 0, 1, 1, 0, 1, -1], [10, 4, 2, 4, 2, 6, 6, 3]), stages=(0, 0, 0, 0, 0, 1, 1, 1)
    )
    assert held.chunks() == [[0, 1, 2, 3, 4], [5, 6, 7]]
    assert stage_parameters(held, [range(2), range(2)]) == held
    at_three = stage_parameters(held, [range(3), range(3)])
    assert at_three.numels == (10, 4, 2, 4, 2, 4, 2, 6, 6, 6, 3)
    assert at_three.layers == (-1, 0, 0, 1, 1, 2, 2, 0, 1, 2, -1)
    assert at_three.stages == (0,) * 7 + (1,) * 4
    # Numbered across the model (stages 0 and 2 of 4, two layers each): each keeps its own numbers.
    across = replace(held, layers=(-1, 0, 0, 1, 1, 4, 5, -1))
    assert stage_parameters(across, [range(0, 3), range(6, 9)]).layers == (-1, 0, 0, 1, 1, 2, 2, 6, 7, 8, -1)
    with pytest.raises(TemplateError, match="holds 2 pipeline stages and the target 1"):
        stage_parameters(held, range(3))
    with pytest.raises(HeldParametersError, match="stages"):
        replace(held, stages=(0, 1))


def test_a_stage_numbers_its_layers_as_the_capture_does() -> None:
    # From 0 in each stage: so at every target stage.
    assert first_layer(0, 4, captured_stage=1, stage=3, pp=4, per_stage=6) == 0
    # Across the model, one stage a rank: the target stage's share.
    assert first_layer(8, 4, captured_stage=2, stage=2, pp=4, per_stage=6) == 12
    assert first_layer(4, 4, captured_stage=1, stage=2, pp=4, per_stage=6) == 12
    # A looped schedule's second stage on rank 1 of 4 is the model's stage 5; rank 2 holds 6.
    assert first_layer(20, 4, captured_stage=1, stage=2, pp=4, per_stage=6) == 36
    # A V-shaped schedule's second stage on rank 1 of 4 is the model's stage 6; rank 2 holds 5.
    assert first_layer(24, 4, captured_stage=1, stage=2, pp=4, per_stage=6) == 30
    with pytest.raises(TemplateError, match="capture every pipeline stage"):
        first_layer(8, 4, captured_stage=1, stage=2, pp=4, per_stage=6)


def shape(config: GPTConfig) -> PipelineShape:
    return PipelineShape.of_record(config.to_dict())


def manifest(captured: GPTConfig, static: dict[Role, int | None], held: dict[Role, HeldParameters | None]):
    layout = captured.layout
    ranks = {
        role: SimpleNamespace(rank=s, stage=s, result=SimpleNamespace(static_bytes=static[role], parameters=held[role]))
        for s, role in ((s, layout.role_of_stage(s)) for s in range(captured.pp))
    }  # fmt: skip
    return SimpleNamespace(job=SimpleNamespace(layout=layout), rank_of_role=ranks.get)


def test_each_stage_gets_its_parameters_plus_what_its_roles_device_held_beyond_them() -> None:
    captured = replace(CONFIG, device="cuda")
    stages = {Role.FIRST: 0, Role.MIDDLE: 1, Role.LAST: 3}
    held = {role: captured_parameters(CONFIG, s) for role, s in stages.items()}
    beyond = {Role.FIRST: WORKSPACES + 4096, Role.MIDDLE: WORKSPACES, Role.LAST: WORKSPACES + 512}
    static = {role: static_bytes(captured, s) + beyond[role] for role, s in stages.items()}
    target = replace(captured, layers=16, dp=8)
    built, _ = stage_holdings(manifest(captured, static, held), shape(target))
    roles = [Role.FIRST, Role.MIDDLE, Role.MIDDLE, Role.LAST]
    assert [h.static_bytes for h in built] == [static_bytes(target, s) + beyond[roles[s]] for s in range(4)]
    # On CPU nothing is measured beyond the parameters: they are the whole of it.
    cpu, _ = stage_holdings(manifest(CONFIG, dict.fromkeys(stages), held), shape(target))
    assert [h.static_bytes for h in cpu] == [static_bytes(target, s) for s in range(4)]
    with pytest.raises(BuildError, match="re-capture it"):
        stage_holdings(manifest(CONFIG, dict.fromkeys(stages), {**held, Role.LAST: None}), shape(CONFIG))


class _Program(torch.nn.Module):
    """A program's model as users write it: an embedding, a stack of blocks, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()) for _ in range(3)
        )
        self.head = torch.nn.Linear(8, 16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_a_programs_parameters_are_read_in_its_layer_blocks_with_what_each_holds() -> None:
    model = _Program()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.arange(4)).sum().backward()
    optimizer.step()
    held = program_parameters([model], [optimizer])
    assert held.layers == (-1, 0, 0, 1, 1, 2, 2, -1, -1)  # the container rule of the layer marks
    assert held.numels == tuple(p.numel() for p in model.parameters())
    # Each holds itself, its gradient and AdamW's two moments (4 bytes an element) and its step.
    assert held.held_bytes == tuple(16 * p.numel() + 4 for p in model.parameters())
    assert held.bucket_bytes == 0  # no DistributedDataParallel buckets its gradients
    model.zero_grad(set_to_none=True)  # read when the profiled iterations begin: what is held then
    assert program_parameters([model], [optimizer]).held_bytes == tuple(
        12 * p.numel() + 4 for p in model.parameters()
    )
    # The same stage at 5 layers holds two more blocks' worth.
    at_five = stage_parameters(held, range(5))
    assert sum(at_five.held_bytes) - sum(held.held_bytes) == 2 * sum(held.held_bytes[1:3])


@pytest.mark.parametrize(("cap_mb", "first"), [(None, 1 << 20), (0.5, 1 << 19)])
def test_a_ddp_programs_bucket_caps_are_read_as_ddp_fills_its_buckets(
    cap_mb: float | None, first: int
) -> None:
    """DDP's first bucket is capped at 1 MiB unless the program gives a cap, then at the cap."""
    activate(VirtualWorld(real_ranks=frozenset({0}), clock=FreeRunningClock()))
    dist.init_process_group(BACKEND_NAME, rank=0, world_size=2, store=dist.HashStore())
    try:
        options = {} if cap_mb is None else {"bucket_cap_mb": cap_mb}
        model = DistributedDataParallel(_Program(), **options)
        held = program_parameters([model], [torch.optim.AdamW(model.parameters())])
    finally:
        dist.destroy_process_group()
    assert held.bucket_bytes == (25 << 20 if cap_mb is None else 1 << 19)
    assert held.first_bucket_bytes == first
    assert held.bucket_copies  # DDP's buckets copy the gradients unless they are views into them
    assert HeldParameters.from_dict(held.to_dict()) == held
