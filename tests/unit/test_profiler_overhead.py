"""Profiler correction: clean unprofiled iterations, per-phase ratios and the scaling of a role's templates."""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np
import pandas as pd
import pytest
from test_compose import CAPTURED, op_table

from prism.graph.build import op_table as ot
from prism.graph.build.profiler_overhead import (
    MIN_PHASE_NS,
    Correction,
    TimeScale,
    clean_unprofiled,
    correction_scale,
    host_kept,
    phase_factors,
    scale_template,
    scaled_times,
    time_scale,
)
from prism.graph.build.templates import build_role_template
from prism.schemas.annotations import GLUE
from prism.schemas.manifest import RankResult


def result(iteration_ns, *, held_ns=(), phase_ns=()) -> RankResult:
    n = len(iteration_ns)
    return RankResult(
        rank=3, iteration_ns=tuple(iteration_ns), losses=(None,) * n, parameter_count=1,
        peak_rss_bytes=1, peak_device_bytes=None, wall_s=1.0, held_ns=tuple(held_ns), phase_ns=tuple(phase_ns),
    )  # fmt: skip


def test_clean_iterations_skip_the_cold_one_and_the_profiler_warmup_step() -> None:
    ns = (900, 200, 210, 190, 350, 400, 410, 390)  # warmup 5: cold, 3 clean, profiler warm-up; 3 profiled
    assert clean_unprofiled(ns, warmup=5) == (200, 210, 190)
    scale = time_scale(result(ns), warmup=5)
    assert scale is not None and scale.clean_iterations == 3
    assert scale.factor == pytest.approx(200 / 400)
    assert scale.to_dict()["rank"] == 3


def test_a_paced_captures_correction_is_over_the_programs_own_time() -> None:
    # Held 100 ms in each unprofiled iteration, 10 ms in the profiled ones: the profiled rank is
    # slower, so its virtual peers are ahead and it waits less. Whole iterations would give 0.75.
    paced = result((900, 300, 300, 300, 400), held_ns=(100, 100, 100, 100, 10))
    assert paced.own_iteration_ns == (800, 200, 200, 200, 390)
    scale = time_scale(paced, warmup=4)
    assert scale is not None and scale.factor == pytest.approx(200 / 390)
    assert RankResult.from_dict({**asdict(paced), "held_ns": [100] * 5}).held_ns == (100,) * 5
    old = {k: v for k, v in asdict(paced).items() if k not in ("held_ns", "phase_ns")}  # before either
    assert RankResult.from_dict(old).own_iteration_ns == paced.iteration_ns
    assert RankResult.from_dict(old).phase_ns == ()


@pytest.mark.parametrize("warmup", [0, 1, 2])
def test_no_clean_iteration_means_no_correction(warmup: int) -> None:
    ns = (900, 350, 400, 410, 390)[: warmup + 3]
    assert time_scale(result(ns), warmup=warmup) is None


MS = 1_000_000


def phases(fwd_ms: float, optim_ms: float, glue_ms: float, send_us: float = 10) -> dict[str, int]:
    return {"fwd": round(fwd_ms * MS), "optim": round(optim_ms * MS), GLUE: round(glue_ms * MS),
            "send_fwd": round(send_us * 1000)}  # fmt: skip


def test_each_phase_gets_its_own_unprofiled_to_profiled_ratio() -> None:
    # warmup 4: one cold, two clean, the profiler's warm-up step; then three profiled. The optimizer
    # step (tiny ops) slows down 10x under the profiler, the forward (big ops) 2x.
    per_iteration = [phases(50, 20, 5), phases(30, 5, 2), phases(32, 5, 2), phases(40, 10, 3)]
    per_iteration += [phases(62, 50, 4), phases(62, 50, 4), phases(60, 52, 4)]
    factors = phase_factors(per_iteration, warmup=4)
    # Over the profiled iterations' mean, as the templates are means over them.
    assert factors["fwd"] == pytest.approx(31 / ((62 + 62 + 60) / 3))
    assert factors["optim"] == pytest.approx(5 / ((50 + 50 + 52) / 3))
    assert factors[GLUE] == pytest.approx(2 / 4)
    assert "send_fwd" not in factors  # 10 µs profiled: below MIN_PHASE_NS, keeps the role's factor
    assert 10_000 < MIN_PHASE_NS
    own = [sum(p.values()) for p in per_iteration]
    scale = time_scale(result(own, phase_ns=per_iteration), warmup=4)
    assert scale is not None and dict(scale.phase_factors) == factors
    assert scale.factor_of("optim") == factors["optim"]
    assert scale.factor_of(None) == pytest.approx(0.5)  # glue outside every block
    assert scale.factor_of("send_fwd") == scale.factor  # too short to measure: the role's
    assert scale.to_dict()["phase_factors"]["optim"] == pytest.approx(factors["optim"], abs=1e-6)
    by_role = time_scale(result(own, phase_ns=per_iteration), warmup=4, by_phase=False)
    assert by_role is not None and not by_role.phase_factors and by_role.factor_of("optim") == by_role.factor


def test_a_fitted_scale_takes_each_phase_to_its_unprofiled_time_from_what_the_templates_hold() -> None:
    per_iteration = [phases(50, 20, 5), phases(30, 5, 2), phases(32, 5, 2), phases(40, 10, 3)]
    per_iteration += [phases(62, 50, 4), phases(62, 50, 4), phases(60, 52, 4)]
    scale = time_scale(result([sum(p.values()) for p in per_iteration], phase_ns=per_iteration), warmup=4)
    assert scale is not None
    assert dict(scale.phase_unprofiled_ns) == pytest.approx(
        {"fwd": 31 * MS, "optim": 5 * MS, GLUE: 2 * MS, "send_fwd": 10_000}
    )
    # The trace's iteration mark holds 3 of the timer's 4 profiled ms of glue (the rest ran
    # outside the mark): scaled by the timer's 0.5 the graph would hold 1.5 of the 2 unprofiled ms.
    fitted = scale.fitted({GLUE: 3 * MS, "optim": 51 * MS, "send_fwd": 20_000})
    assert fitted.factor_of(None) * 3 * MS == pytest.approx(2 * MS)
    assert fitted.factor_of("optim") == pytest.approx(5 / 51)
    assert fitted.factor_of("fwd") == scale.factor_of("fwd")  # not given: its own ratio stays
    assert fitted.factor_of("send_fwd") == scale.factor  # too little to measure: the role's, as before
    assert fitted.to_dict()["phase_unprofiled_ms"][GLUE] == pytest.approx(2.0)
    by_role = time_scale(
        result([sum(p.values()) for p in per_iteration], phase_ns=per_iteration), warmup=4, by_phase=False
    )
    assert by_role is not None and by_role.fitted({GLUE: 3 * MS}) == by_role  # one factor: nothing to fit
    # A gradient sync with no op of its own (no data parallelism) is in the gap before the
    # optimizer step's first op: the step's templates hold both.
    synced = replace(scale, phase_unprofiled_ns={**scale.phase_unprofiled_ns, "grad_sync": 1 * MS})
    assert synced.fitted({"optim": 60 * MS}, {"optim": ("grad_sync",)}).factor_of("optim") == pytest.approx(
        6 / 60
    )


def test_a_capture_without_phase_times_keeps_one_factor_per_role() -> None:
    scale = time_scale(result((900, 200, 210, 190, 350, 400, 410, 390)), warmup=5)
    assert scale is not None and not scale.phase_factors
    assert all(scale.factor_of(kind) == scale.factor for kind in ("fwd", "optim", None))


def _posted(units) -> np.ndarray:
    """The template's calls made asynchronously (their call: the post)."""
    is_comm, is_async = (units[c].to_numpy(dtype=bool) for c in (ot.IS_COMM, ot.IS_ASYNC))
    return is_comm & is_async


def test_scaling_multiplies_compute_and_gaps_and_leaves_comm_alone() -> None:
    template = build_role_template(op_table(1), rank=2, stage=1, first_layer=CAPTURED.stage_layers(1).start)
    scale = TimeScale(rank=2, unprofiled_ns=1.0, profiled_ns=2.0, clean_iterations=1)  # 0.5 for all
    scaled = scale_template(template, scale, launches=False)
    posts = 0
    for kind, segment in template.segments.items():
        before, after = segment.units, scaled.segments[kind].units
        comm = before[ot.IS_COMM].to_numpy(dtype=bool)
        posted = _posted(before)
        posts += posted.sum()
        assert (after[ot.DUR_NS][~comm] == (before[ot.DUR_NS][~comm] * 0.5).round()).all()
        assert (after[ot.DUR_NS][comm] == before[ot.DUR_NS][comm]).all()
        assert (after[ot.GAP_NS] - (before[ot.GAP_NS] * 0.5).round()).abs().max() <= 1, kind
        # A posted transfer's call is the post, host time the model does not price: after it.
        expected_post = np.where(posted, before[ot.DUR_NS] * 0.5, 0)
        assert np.abs(after[ot.POST_NS].to_numpy() - expected_post.round()).max() <= 1, kind
        assert (after[ot.ALLOC_BYTES] == before[ot.ALLOC_BYTES]).all()
    assert posts > 0  # the stage's transfers are posted


def test_on_cpu_an_asynchronous_call_keeps_its_post_and_a_blocking_collective_drops_its_call() -> None:
    is_comm = np.array([False, True, True, True, True])
    units = pd.DataFrame(
        {
            ot.IS_COMM: is_comm,
            ot.IS_ASYNC: [False, True, False, True, True],
            ot.COMM_OP: ["", "send", "all_reduce", "recv", "all_reduce"],
        }
    )
    kept = host_kept(units, launches=False)
    # Every call that returned a Work keeps its time as a post; a blocking one is the collective.
    assert kept.tolist() == [False, True, False, True, True]
    assert host_kept(units, launches=True).tolist() == is_comm.tolist()
    dur, gap, post = scaled_times(
        np.array([100, 40, 500, 60, 300]), np.array([10, 10, 10, 10, 10]), is_comm, np.full(5, 0.5), kept=kept,
        launches=False,
    )  # fmt: skip
    assert dur.tolist() == [50, 40, 500, 60, 300]  # calls: the comm model replaces them
    assert gap.tolist() == [5] * 5
    assert post.tolist() == [0, 20, 0, 30, 150]  # the post runs after its call: it begins the call


def test_on_cuda_a_calls_captured_time_is_its_launch_and_stays_before_its_node() -> None:
    # The role's factor is over whole iterations, calls included: dropping the calls' host time
    # (the device runs the collective) would leave the graph short of the unprofiled iteration.
    template = build_role_template(op_table(1), rank=2, stage=1, first_layer=CAPTURED.stage_layers(1).start)
    ns = (900, 200, 210, 190, 350, 400, 410, 390)
    on_cpu = correction_scale(result(ns), 5, Correction.ROLE, "cpu")
    on_cuda = correction_scale(result(ns), 5, Correction.ROLE, "cuda")
    assert on_cpu is not None and on_cuda is not None
    assert not on_cpu.launches and on_cuda.launches and on_cuda.to_dict()["launches"]
    cpu, cuda = (scale_template(template, s, launches=s.launches) for s in (on_cpu, on_cuda))
    launched = 0.0
    for kind, segment in template.segments.items():
        before = segment.units
        comm = before[ot.IS_COMM].to_numpy(dtype=bool)
        posted = _posted(before)
        launch = np.where(comm, (before[ot.DUR_NS] * on_cuda.factor).to_numpy(), 0.0)
        launched += launch.sum()
        assert (cuda.segments[kind].units[ot.DUR_NS] == cpu.segments[kind].units[ot.DUR_NS]).all(), kind
        gap_cpu = cpu.segments[kind].units[ot.GAP_NS].to_numpy()
        assert np.abs(cuda.segments[kind].units[ot.GAP_NS].to_numpy() - (gap_cpu + launch)).max() <= 1, kind
        # A posted transfer's launch too: on CUDA nothing runs after a call.
        assert (cuda.segments[kind].units[ot.POST_NS] == 0).all()
        assert (cpu.segments[kind].units[ot.POST_NS].to_numpy()[~posted] == 0).all()
    assert launched > 0


def test_a_segment_is_scaled_by_its_blocks_factor_and_glue_outside_every_block_by_the_glues() -> None:
    # The phase times count the glue that leads into a block as the block's (own_phase_ns), and
    # the template's segment of a block holds that glue too: one factor for all of the segment.
    template = build_role_template(op_table(1), rank=2, stage=1, first_layer=CAPTURED.stage_layers(1).start)
    factors = {"fwd": 0.5, "bwd": 0.25, "optim": 0.1, "recv_fwd": 0.8, GLUE: 0.9}
    scale = TimeScale(rank=2, unprofiled_ns=1.0, profiled_ns=3.0, clean_iterations=1, phase_factors=factors)
    scaled = scale_template(template, scale, launches=False)
    for kind, segment in template.segments.items():
        before, after = segment.units, scaled.segments[kind].units
        outside = kind in ("pre", "post")
        expected = 0.9 if outside else factors.get(kind, 1 / 3)  # send_* and grad_sync: the role's
        compute = ~before[ot.IS_COMM].to_numpy(dtype=bool)
        post = np.where(_posted(before), before[ot.DUR_NS] * expected, 0)
        assert (after[ot.GAP_NS] - (before[ot.GAP_NS] * expected).round()).abs().max() <= 1, kind
        assert np.abs(after[ot.POST_NS].to_numpy() - post.round()).max() <= 1, kind
        assert (after[ot.DUR_NS][compute] == (before[ot.DUR_NS] * expected).round()[compute]).all(), kind
    assert {"pre", "post", "fwd", "bwd", "optim", "recv_fwd", "send_fwd", "grad_sync"} <= set(
        template.segments
    )
    assert (
        scaled.segments["pre"].units[ot.DUR_NS] == (template.segments["pre"].units[ot.DUR_NS] * 0.9).round()
    ).all()
    led = [
        k
        for k, seg in template.segments.items()
        if k not in ("pre", "post") and (seg.units[ot.PHASE] == "iter").any()
    ]
    assert led, "the synthetic table has glue units inside block segments"
