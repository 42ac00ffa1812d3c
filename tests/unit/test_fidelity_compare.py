"""How the fidelity benchmark pairs real runs with predictions: medians, standard errors, paired errors."""

from __future__ import annotations

import pytest

from prism.fidelity.cases import parse_case
from prism.fidelity.compare import _median_sem_pct, final_records, mean_errors, paired_records
from prism.fidelity.measure import Pacing, RankRun, RunSettings, bracketed


def test_real_median_standard_error() -> None:
    assert _median_sem_pct([120.0]) is None
    assert _median_sem_pct([100.0, 100.0, 100.0]) == 0.0
    # sd 14.14 of two values around 100: 1.2533 · 14.14 / √2 = 12.5 % of the median.
    assert _median_sem_pct([90.0, 110.0]) == pytest.approx(12.53, abs=0.01)


def test_paired_errors_compare_each_repeat_with_the_real_runs_beside_it() -> None:
    def run(ms: float, bracket: tuple[float, float] | None = None) -> dict[int, RankRun]:
        return {0: RankRun(iter_ns=ms * 1e6, peak_bytes=1, parts_ms={}, dynamic_bytes=0, bracket_ns=bracket)}

    # The machine drifts 100 -> 200 -> 300 ms between repeats; each replay is +10, -10, +10 %
    # of the real runs beside it. The medians' error (180 vs 200) says -10 %, the paired one +10 %.
    real = [
        bracketed(run(90), run(110)),
        bracketed(run(210), run(190)),
        bracketed(run(300), run(300)),
    ]
    assert [r[0].iter_ns / 1e6 for r in real] == [100, 200, 300]
    assert real[0][0].bracket_ns == (90e6, 110e6)
    (record,) = paired_records("c", real, [run(110), run(180), run(330)], "replay")
    assert record["iter_err_pct"] == pytest.approx(-10.0)
    assert record["paired_err_pct"] == pytest.approx(10.0)
    assert record["paired_se_pct"] == pytest.approx(1.2533 * 11.547 / 3**0.5, abs=0.01)
    # How far the real side moved across the replay: |+22.2 %|, |-9.5 %|, 0 -> median 9.52 %.
    assert record["real_bracket_drift_pct"] == pytest.approx(9.52, abs=0.01)
    # The runs after against those before, median against median (190 vs 210): an A/A error.
    assert record["real_after_vs_before_pct"] == pytest.approx(-9.52, abs=0.01)
    # Without brackets there is no drift to report.
    (plain,) = paired_records("c", [run(100)], [run(110)], "replay")
    assert plain["real_bracket_drift_pct"] is None and plain["paired_se_pct"] is None
    assert plain["real_after_vs_before_pct"] is None


def test_mean_errors_are_kept_apart_by_source() -> None:
    def record(source: str, err: float, mem: float) -> dict:
        return {"source": source, "iter_err_pct": err, "paired_err_pct": err / 2, "mem_err_pct": mem}

    records = [record("simulation", -4.0, 0.0), record("simulation", 2.0, 0.5), record("replay", -3.0, 0.1)]
    means = mean_errors(records)
    assert means == {
        "mean_abs_iter_err_pct": 3.0, "mean_abs_paired_err_pct": 1.5, "mean_abs_mem_err_pct": 0.25,
        "replay_mean_abs_iter_err_pct": 3.0, "replay_mean_abs_paired_err_pct": 1.5, "replay_mean_abs_mem_err_pct": 0.1,
    }  # fmt: skip


def test_the_final_graph_is_the_paced_one_where_a_case_was_paced() -> None:
    def record(case: str, rank: int, source: str, err: float) -> dict:
        return {"case": case, "rank": rank, "source": source, "iter_err_pct": err, "paired_err_pct": err, "mem_err_pct": 0.0}  # fmt: skip

    # A tp case from its slice only; a pipeline from its slice (-12 %) and paced (+2 %).
    records = [
        record("tp", 0, "simulation", -4.0),
        record("pp", 0, "simulation", -12.0),
        record("pp", 1, "simulation", -10.0),
        record("pp", 0, "paced", 2.0),
        record("pp", 1, "paced", -4.0),
    ]
    final = {(r["case"], r["rank"]): r["iter_err_pct"] for r in final_records(records)}
    assert final == {("tp", 0): -4.0, ("pp", 0): 2.0, ("pp", 1): -4.0}
    means = mean_errors(records)
    assert means["mean_abs_iter_err_pct"] == pytest.approx(26 / 3, abs=0.01)
    assert means["final_mean_abs_iter_err_pct"] == pytest.approx(10 / 3, abs=0.01)
    # Without paced records the final graph is the slice's: no separate figure.
    assert final_records(records[:3]) == [] and "final_mean_abs_iter_err_pct" not in mean_errors(records[:3])


def test_pacing_picks_the_cases_it_names() -> None:
    pipeline, tensor = parse_case("tp=1 pp=2 dp=1 layers=2"), parse_case("tp=2 pp=1 dp=1 layers=2")
    for pacing, paced in ((Pacing.OFF, (False, False)), (Pacing.PIPELINES, (True, False)), (Pacing.ALL, (True, True))):  # fmt: skip
        settings = RunSettings(paced=pacing)
        assert (settings.paces(pipeline), settings.paces(tensor)) == paced


def test_phases_add_up_to_the_iteration_and_show_a_total_right_by_cancellation() -> None:
    from prism.fidelity.explain import BUBBLE, COMMUNICATION, PHASES, measured_phases_ms, own_phases_ms
    from prism.schemas.manifest import RankResult

    # Warm-up 4: iterations 1 and 2 are the clean unprofiled ones (0 is cold, 3 the profiler's).
    phase_ns = [{"fwd": 9_000_000, "bwd": 9_000_000}] + [
        {"fwd": 30_000_000, "bwd": 50_000_000, "optim": 5_000_000, "glue": 1_000_000}
    ] * 3
    result = RankResult(
        rank=0, iteration_ns=(200e6, 110e6, 110e6, 200e6), losses=(None,) * 4, parameter_count=1, peak_rss_bytes=1,
        peak_device_bytes=None, wall_s=1.0, phase_ns=tuple(phase_ns), collective_ns=(0, 20e6, 20e6, 0),
    )  # fmt: skip
    real = measured_phases_ms(result, warmup=4)
    assert set(real) == set(PHASES)
    assert real == pytest.approx(
        {"forward": 30, "backward": 50, "optimizer": 5, "other": 1, COMMUNICATION: 20, BUBBLE: 4}
    )
    assert measured_phases_ms(RankResult(**{**result.__dict__, "collective_ns": ()}), 4) is None

    # A prediction whose total is right while its compute is short and its communication long.
    pred = own_phases_ms({"fwd": 15e6, "bwd": 25e6, "optim": 5e6, "glue": 1e6}, 110e6, collective_ns=60e6)

    def run(ms: float, own: dict[str, float]) -> dict[int, RankRun]:
        return {0: RankRun(iter_ns=ms * 1e6, peak_bytes=1, parts_ms={}, dynamic_bytes=0, own_ms=own)}

    (record,) = paired_records("c", [run(110, real)], [run(110, pred)])
    assert record["iter_err_pct"] == 0
    errors = {phase: p["err_pct"] for phase, p in record["phase_err"].items()}
    assert errors["forward"] == errors["backward"] == -50 and errors[COMMUNICATION] == 200


def test_a_rank_without_transfers_has_no_bubble_however_its_parts_tails_fall() -> None:
    from prism.fidelity.explain import BUBBLE, COMMUNICATION, measured_phases_ms
    from prism.schemas.manifest import RankResult

    # Warm-up 6: iterations 1-4 are the clean ones. Forward's tail and the collective's fall in
    # different iterations: the median iteration (60 ms) is 10 ms more than the sum of the parts'
    # medians (30 + 20), though every iteration is its parts exactly.
    forward = (0, 30e6, 30e6, 50e6, 30e6, 0)
    collective = (0, 20e6, 20e6, 20e6, 40e6, 0)
    result = RankResult(
        rank=0, iteration_ns=tuple(f + c for f, c in zip(forward, collective, strict=True)), losses=(None,) * 6,
        parameter_count=1, peak_rss_bytes=1, peak_device_bytes=None, wall_s=1.0,
        phase_ns=tuple({"fwd": f} for f in forward), collective_ns=collective,
    )  # fmt: skip
    phases = measured_phases_ms(result, warmup=6)
    assert phases["forward"] == 30 and phases[COMMUNICATION] == 20
    assert phases[BUBBLE] == 0  # no wait for a neighbour, in any iteration


def test_a_programs_blocks_add_up_to_the_iteration_and_show_where_a_total_is_off() -> None:
    from prism.fidelity.explain import BLOCK_PHASES, block_phases_ms, measured_blocks_ms

    # Warm-up 4: iterations 1 and 2 are the clean ones; a transfer block ('send_fwd') is 'other'.
    block_ns = [{"bwd": 1}] + [{"fwd": 20e6, "bwd": 60e6, "optim": 5e6, "send_fwd": 2e6}] * 3
    iteration_ns = [2] + [100e6] * 3
    real = measured_blocks_ms(block_ns, iteration_ns, warmup=4)
    assert set(real) == set(BLOCK_PHASES)
    assert real == pytest.approx({"forward": 20, "backward": 60, "optimizer": 5, "other": 15})
    assert measured_blocks_ms([], iteration_ns, warmup=4) is None
    assert measured_blocks_ms(block_ns, iteration_ns, warmup=4, skip=2) is None

    # Each part is the median of its time in each iteration: 'other' is 10 ms in every clean
    # iteration, not the 20 ms the median iteration (100) less the blocks' medians (20 + 60) makes.
    forward, backward = [20e6, 30e6, 20e6], [60e6, 60e6, 70e6]
    block_ns = [{}] + [{"fwd": f, "bwd": b} for f, b in zip(forward, backward, strict=True)] + [{}]
    iteration_ns = [1] + [f + b + 10e6 for f, b in zip(forward, backward, strict=True)] + [1]
    real = measured_blocks_ms(block_ns, iteration_ns, warmup=5)
    assert real == pytest.approx({"forward": 20, "backward": 60, "optimizer": 0, "other": 10})

    # A replay right in total whose backward (a DDP bucket's all-reduce inside it) is 50 % long.
    pred = block_phases_ms({"fwd": 20e6, "bwd": 90e6, "optim": 5e6}, 100e6)
    assert pred["other"] == pytest.approx(-15)  # a prediction's blocks can overrun its own total

    def run(own: dict[str, float]) -> dict[int, RankRun]:
        return {0: RankRun(iter_ns=100e6, peak_bytes=1, parts_ms={}, dynamic_bytes=0, blocks_ms=own)}

    (record,) = paired_records("c", [run(real)], [run(pred)], "replay")
    assert record["iter_err_pct"] == 0 and record["block_err"]["backward"]["err_pct"] == 50
    (plain,) = paired_records(
        "c", [run(real)], [{0: RankRun(iter_ns=1e8, peak_bytes=1, parts_ms={}, dynamic_bytes=0)}]
    )
    assert "block_err" not in plain
