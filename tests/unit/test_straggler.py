"""--delay on a real rank: which blocks wait, and for how long."""

from __future__ import annotations

import time

import pytest

from prism.capture import annotate
from prism.graph.sim.whatif import parse_delay
from prism.replay.straggler import install_delays
from prism.schemas.annotations import Mark, Part, Phase


@pytest.fixture(autouse=True)
def no_hook_after():
    yield
    annotate.set_block_hook(None)


def waited_ms(mark: Mark) -> float:
    began = time.perf_counter()
    with annotate.mark(mark):
        pass
    return (time.perf_counter() - began) * 1e3


def test_a_delay_waits_at_each_matching_block_only() -> None:
    install_delays([parse_delay("fwd,layer=3:+30ms"), parse_delay("optim:+20ms")], rank=5)
    assert waited_ms(Mark(phase=Phase.FORWARD, stage=0, mb=0, layer=3)) >= 30
    assert waited_ms(Mark(phase=Phase.OPTIMIZER)) >= 20
    assert waited_ms(Mark(phase=Phase.FORWARD, stage=0, mb=0, layer=2)) < 10
    assert waited_ms(Mark(phase=Phase.BACKWARD, stage=0, mb=0)) < 10


def test_a_delay_without_layer_waits_once_per_instance_at_the_outer_mark() -> None:
    install_delays([parse_delay("fwd:+30ms")], rank=0)
    assert waited_ms(Mark(phase=Phase.FORWARD, stage=0, mb=1)) >= 30
    assert waited_ms(Mark(phase=Phase.FORWARD, stage=0, mb=1, layer=0)) < 10  # inner marks: no
    assert waited_ms(Mark(phase=Phase.FORWARD, stage=0, mb=1, part=Part.EMBED)) < 10


def test_a_delay_for_another_rank_does_nothing_here() -> None:
    install_delays([parse_delay("optim:+30ms@7")], rank=5)
    assert waited_ms(Mark(phase=Phase.OPTIMIZER)) < 10
