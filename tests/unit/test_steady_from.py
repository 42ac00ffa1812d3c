"""The first iteration from which a program makes the same calls every iteration."""

from __future__ import annotations

from types import SimpleNamespace

from prism.schemas.iterations import steady_from


def call(at: int, op: str = "all_reduce", nbytes: int = 1024, label: str = "dp.0", peer: int | None = None):
    return SimpleNamespace(enter_ns=at, op=op, bytes=nbytes, label=label, peer=peer)


WINDOWS = [(0, 100), (100, 200), (200, 300), (300, 400)]


def test_set_up_and_a_one_time_call_come_before_the_steady_iterations() -> None:
    calls = [
        call(5, "all_gather", 8), call(10, "broadcast", 4096, peer=0), call(50),  # set-up, then the bucket
        call(120, "broadcast", 64, peer=0), call(150),  # DDP's rebuilt bucket order, once
        call(250), call(350),
    ]  # fmt: skip
    assert steady_from(WINDOWS, calls) == 2


def test_a_program_steady_from_its_first_iteration() -> None:
    assert steady_from(WINDOWS, [call(50), call(150), call(250), call(350)]) == 0
    assert steady_from([], []) == 0


def test_a_change_late_in_the_run_moves_it_there() -> None:
    calls = [call(50), call(150), call(250, nbytes=2048), call(350, nbytes=2048)]
    assert steady_from(WINDOWS, calls) == 2
