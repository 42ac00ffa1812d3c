"""A built-in GPT graph captured on CUDA takes each stage's static bytes from what the device held."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from prism.graph.build.builder import _measured_static
from prism.graph.sim.load import static_bytes
from prism.schemas import graph_format as gf
from prism.schemas.layout import Role
from prism.schemas.workload import GPTConfig

WORKSPACES = 2 * 32 * 2**20  # two cuBLAS workspaces, as a Hopper rank keeps them


def manifest(captured: GPTConfig, held: dict[Role, int | None]) -> SimpleNamespace:
    layout = captured.layout
    ranks = {
        layout.role_of_stage(s): SimpleNamespace(stage=s, result=SimpleNamespace(static_bytes=held[layout.role_of_stage(s)]))
        for s in range(captured.pp)
    }  # fmt: skip
    return SimpleNamespace(job=SimpleNamespace(config=captured), rank_of_role=ranks.get)


def test_each_stage_gets_its_model_state_plus_what_its_role_held_beyond_it() -> None:
    captured = GPTConfig(layers=8, hidden=128, heads=4, vocab=512, tp=2, pp=4, dp=2, device="cuda")
    beyond = {Role.FIRST: WORKSPACES + 4096, Role.MIDDLE: WORKSPACES, Role.LAST: WORKSPACES + 512}
    held = {
        role: static_bytes(captured, s) + beyond[role]
        for s, role in [(0, Role.FIRST), (1, Role.MIDDLE), (3, Role.LAST)]
    }
    # Built for more layers and dp ranks than captured: the model part follows the target, the
    # device's own part stays what each role's captured rank held beyond its model.
    target = replace(captured, layers=16, dp=8)
    stages = _measured_static(manifest(captured, held), target)[gf.STATIC_BYTES_KEY]
    roles = [Role.FIRST, Role.MIDDLE, Role.MIDDLE, Role.LAST]
    assert stages == [static_bytes(target, s) + beyond[roles[s]] for s in range(4)]
    assert stages[1] != held[Role.MIDDLE]  # the target's stage holds more layers than the captured one


def test_a_cpu_capture_keeps_the_models_count() -> None:
    captured = GPTConfig(layers=4, hidden=128, heads=4, vocab=512, tp=1, pp=2, dp=2)
    assert _measured_static(manifest(captured, {Role.FIRST: None, Role.LAST: None}), captured) == {}
