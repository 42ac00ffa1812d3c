"""A program's layers through every stage: marked at capture, named in its graph, delayed by a
what-if and by a replay as the built-in workload's are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from prism.graph.sim.load import graph_column, load_sim_graph
from prism.graph.sim.simulate import simulate
from prism.graph.sim.whatif import BlockDelay, WhatIf, apply_what_if
from prism.schemas import graph_format as gf
from tests.integration.programs import captured_and_built, replayed

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FSDP2 = (str(EXAMPLES / "fsdp2.py"), "--steps", "50", "--hidden", "32", "--layers", "3", "--vocab", "64",
         "--batch", "2", "--seq", "8")  # fmt: skip
DELAY_NS = 300_000_000


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    capture = tmp_path_factory.mktemp("layers") / "fsdp2"
    return captured_and_built(capture, ("--dp", "8"), FSDP2)[1]


def test_each_layers_forward_and_backward_units_carry_its_index(graph: Path) -> None:
    phase, layer, kind = (graph_column(graph, c, np.array([0])) for c in (gf.PHASE, gf.LAYER, gf.KIND))
    for name in ("fwd", "bwd"):
        compute = (phase == name) & (kind == gf.NodeKind.COMPUTE)
        assert set(np.unique(layer[compute])) == {-1, 0, 1, 2}  # the embedding and head: -1
        assert all((layer[compute] == i).sum() >= 2 for i in (0, 1, 2))
    assert (layer[phase == "optim"] == -1).all()


def test_a_layers_delay_moves_the_simulation_and_the_replay(graph: Path, tmp_path: Path) -> None:
    sim = load_sim_graph(graph)
    delay = BlockDelay(phase="bwd", layer=1, delay_ns=DELAY_NS, rank=0)
    moved = simulate(apply_what_if(sim, graph, WhatIf(delays=(delay,))), iterations=2).iteration_ns
    moved -= simulate(sim, iterations=2).iteration_ns
    # One backward of layer 1 an iteration; every rank waits for rank 0 at its sharded collectives.
    assert (np.abs(moved - DELAY_NS) < 0.02 * DELAY_NS).all()
    report = replayed(graph, 0, out=tmp_path / "replay", extra=("--delay", "bwd,layer=1:+300ms@0"))
    phases = {p.phase: p for p in report.phases}
    grown_ms = phases["bwd"].measured_ms - phases["bwd"].predicted_ms
    assert DELAY_NS / 1e6 * 0.9 < grown_ms < DELAY_NS / 1e6 * 1.3, report.phases
    assert phases["fwd"].measured_ms < phases["fwd"].predicted_ms + 50
