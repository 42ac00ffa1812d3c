"""A capture whose iterations are not its program's training steps is refused, never built: the
nested optimizer steps that cut torchtitan's steps in two (3857, 0.09, 552, 0.4, 1014 ms) gave a
graph 40 times too fast with exit 0."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from prism.graph.build.profiler_overhead import Correction
from prism.graph.build.timing_checks import UntrustedTiming, check_timing
from prism.schemas.iterations import implausible_iterations
from prism.schemas.manifest import RankResult

MS = 1_000_000


def ms(*values: float) -> tuple[int, ...]:
    return tuple(int(v * MS) for v in values)


def test_iterations_cut_inside_a_step_are_implausible() -> None:
    torchtitan = ms(3857, 0.09, 552, 0.4, 1014, 0.3, 540, 0.2, 1100, 0.5, 2200, 0.1)
    reason = implausible_iterations(torchtitan, warmup=10)
    assert reason is not None and "0.09" in reason and "unprofiled" in reason


def test_two_optimizers_stepped_in_turn_are_implausible_in_the_profiled_iterations() -> None:
    assert implausible_iterations(ms(900, 500, 510, 505, 2000, 1.0), warmup=4) is not None


def test_three_optimizers_stepped_in_turn_are_implausible_though_most_iterations_are_short() -> None:
    # Two of every three iterations a lone optimizer step, in both kinds: no median is whole.
    times = ms(90, 0.02, 0.02, 1.0, 0.02, 0.02, 3.0, 0.02, 0.02)
    assert implausible_iterations(times, warmup=5) is not None


@pytest.mark.parametrize(
    "iterations",
    [
        ms(3857, 500, 520, 2000, 2100),  # a cold first iteration, a profiler several times slower
        ms(40, 10, 21, 9.5, 10.2, 80),  # a loaded host's doubling, a profiled step 8x the clean ones
        ms(1000, 0.5),  # the first is set-up: never compared
        # A stall of 36 ms in one profiled 2 ms step: the clean step says which one is whole.
        ms(40, 1.0, 1.2, 3.0, 38.3, 1.89),
    ],
)
def test_a_programs_own_steps_with_noise_and_a_profiler_are_plausible(iterations) -> None:
    assert implausible_iterations(iterations, warmup=4) is None


def rank(iteration_ns: tuple[int, ...]) -> SimpleNamespace:
    n = len(iteration_ns)
    result = RankResult(
        rank=5, iteration_ns=iteration_ns, losses=(None,) * n, parameter_count=1, peak_rss_bytes=1,
        peak_device_bytes=None, wall_s=1.0,
    )  # fmt: skip
    return SimpleNamespace(rank=5, result=result)


def manifest(iteration_ns: tuple[int, ...], warmup: int) -> SimpleNamespace:
    return SimpleNamespace(job=SimpleNamespace(warmup=warmup, device="cpu"), ranks=(rank(iteration_ns),))


def test_a_steady_capture_passes() -> None:
    check_timing(manifest(ms(90, 10, 11, 10.5, 30, 31), warmup=4), Correction.PHASE)


def test_a_capture_cut_inside_its_steps_is_refused_with_what_to_do() -> None:
    with pytest.raises(UntrustedTiming, match="rank 5.*no training step.*torch.profiler"):
        check_timing(manifest(ms(3857, 0.09, 552, 0.4, 1014, 0.3), warmup=4), Correction.NONE)


def test_a_correction_without_a_clean_iteration_is_refused_unless_none_is_asked() -> None:
    with pytest.raises(UntrustedTiming, match="--warmup 10.*--profiler-correction none"):
        check_timing(manifest(ms(90, 30), warmup=1), Correction.PHASE)
    check_timing(manifest(ms(90, 30), warmup=1), Correction.NONE)


@pytest.mark.parametrize("clean_ms", [0.5, 100.0])
def test_an_implausible_correction_is_refused(clean_ms: float) -> None:
    # Clean iterations alike and profiled ones alike, but not the same work (x0.01 or x3.3).
    times = ms(90, clean_ms, clean_ms, clean_ms, 30, 30)
    with pytest.raises(UntrustedTiming, match="profiler correction of ×") as refused:
        check_timing(manifest(times, warmup=4), Correction.ROLE)
    # Unprofiled iterations slower than profiled ones from few clean iterations: maybe a busy
    # machine, and more warm-up is what to do.
    assert ("--warmup 10 for a median over 8" in str(refused.value)) == (clean_ms > 30)


def test_iterations_without_a_call_beside_ones_with_calls_are_implausible() -> None:
    # Two optimizers stepped in turn: every other iteration is the second one's step alone.
    times = ms(90, 1.0, 0.2, 1.1, 0.25, 3.0, 0.9)
    reason = implausible_iterations(times, warmup=5, calls=(9, 8, 0, 8, 0, 8, 0))
    assert (
        reason is not None and "iterations 2, 4, 6 made no process-group call while 1, 3, 5 made 8" in reason
    )
    assert implausible_iterations(ms(90, 1, 1.1, 1, 1.2, 3, 3), warmup=5, calls=(9, 8, 8, 8, 8, 8, 8)) is None
    # Set-up calls in the first iteration alone, or no calls at all (one rank): nothing to say.
    assert implausible_iterations(ms(90, 1, 1, 1), warmup=3, calls=(5, 0, 0, 0)) is None
