"""Profiler correction: clean unprofiled iterations and the scaling of a role's templates."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from test_compose import CAPTURED, op_table

from prism.graph import op_table as ot
from prism.graph.profiler_overhead import clean_unprofiled, scale_template, time_scale
from prism.graph.templates import build_role_template
from prism.schemas.manifest import RankResult


def test_clean_iterations_skip_the_cold_one_and_the_profiler_warmup_step() -> None:
    ns = (900, 200, 210, 190, 350, 400, 410, 390)  # warmup 5: cold, 3 clean, profiler warm-up; 3 profiled
    assert clean_unprofiled(ns, warmup=5) == (200, 210, 190)
    scale = time_scale(3, ns, warmup=5)
    assert scale is not None and scale.clean_iterations == 3
    assert scale.factor == pytest.approx(200 / 400)
    assert scale.to_dict()["rank"] == 3


def test_a_paced_captures_correction_is_over_the_programs_own_time() -> None:
    # Held 100 ms in each unprofiled iteration, 10 ms in the profiled ones: the profiled rank is
    # slower, so its virtual peers are ahead and it waits less. Whole iterations would give 0.75.
    result = RankResult(
        rank=0, iteration_ns=(900, 300, 300, 300, 400), losses=(None,) * 5, parameter_count=1,
        peak_rss_bytes=1, peak_device_bytes=None, wall_s=1.0, held_ns=(100, 100, 100, 100, 10),
    )  # fmt: skip
    assert result.own_iteration_ns == (800, 200, 200, 200, 390)
    scale = time_scale(0, result.own_iteration_ns, warmup=4)
    assert scale is not None and scale.factor == pytest.approx(200 / 390)
    assert RankResult.from_dict({**asdict(result), "held_ns": [100] * 5}).held_ns == (100,) * 5
    old = {k: v for k, v in asdict(result).items() if k != "held_ns"}  # written before held time
    assert RankResult.from_dict(old).own_iteration_ns == result.iteration_ns


@pytest.mark.parametrize("warmup", [0, 1, 2])
def test_no_clean_iteration_means_no_correction(warmup: int) -> None:
    ns = (900, 350, 400, 410, 390)[: warmup + 3]
    assert time_scale(0, ns, warmup=warmup) is None


def test_scaling_multiplies_compute_and_gaps_and_leaves_comm_alone() -> None:
    template = build_role_template(op_table(1), rank=2, stage=1, first_layer=CAPTURED.stage_layers(1).start)
    scaled = scale_template(template, 0.5)
    for kind, segment in template.segments.items():
        before, after = segment.units, scaled.segments[kind].units
        comm = before[ot.IS_COMM].to_numpy(dtype=bool)
        assert (after[ot.DUR_NS][~comm] == (before[ot.DUR_NS][~comm] * 0.5).round()).all()
        assert (after[ot.DUR_NS][comm] == before[ot.DUR_NS][comm]).all()
        assert (after[ot.GAP_NS] == (before[ot.GAP_NS] * 0.5).round()).all()
        assert (after[ot.ALLOC_BYTES] == before[ot.ALLOC_BYTES]).all()
