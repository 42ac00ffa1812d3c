"""Pair the real runs with a prediction rank by rank: the records and breakdown rows of a case."""

from __future__ import annotations

import numpy as np

from prism.capture.workloads.gpt.config import GPTConfig
from prism.fidelity.measure import RankRun


def _err_pct(pred: float, real: float) -> float:
    return (pred - real) / real * 100.0 if real else float("nan")


def _median(values: list[float]) -> float:
    return float(np.median(values))


def _median_se(values: list[float]) -> float | None:
    """Standard error of the median of ``values`` (normal approximation, 1.2533·sd/√n); None from one value."""
    if len(values) < 2:
        return None
    return float(1.2533 * np.std(values, ddof=1) / np.sqrt(len(values)))


def _median_sem_pct(values: list[float]) -> float | None:
    """``_median_se`` as a percentage of the median: how far the real side alone moves between repeats."""
    se = _median_se(values)
    return None if se is None else se / float(np.median(values)) * 100.0


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def paired_records(
    label: str, real: list[dict[int, RankRun]], pred: list[dict[int, RankRun]], source: str = "simulation"
) -> list[dict]:
    records = []
    for rank in sorted(pred[0]) if pred else []:
        real_repeats = [run[rank].iter_ns / 1e6 for run in real]
        pred_repeats = [run[rank].iter_ns / 1e6 for run in pred]
        real_ms, pred_ms = _median(real_repeats), _median(pred_repeats)
        sem = _median_sem_pct(real_repeats)
        real_peak = int(_median([run[rank].peak_bytes for run in real]))
        pred_peak = int(_median([run[rank].peak_bytes for run in pred]))
        # The same errors repeat by repeat: each prediction against the real run(s) beside it in time.
        brackets = [run[rank].bracket_ns for run in real if run[rank].bracket_ns is not None]
        drifts = [abs(_err_pct(after, before)) for before, after in brackets]
        paired = [_err_pct(p, r) for p, r in zip(pred_repeats, real_repeats, strict=True)]
        paired_err, paired_se = _median(paired), _median_se(paired)
        # How far the real side alone moved: between its repeats, and across each replay.
        spread = (max(real_repeats) - min(real_repeats)) / real_ms * 100.0
        moved = max([spread, *drifts])
        records.append(
            {
                "case": label, "rank": rank, "source": source,
                "real_iter_ms": round(real_ms, 3), "pred_iter_ms": round(pred_ms, 3),
                "iter_err_pct": round(_err_pct(pred_ms, real_ms), 2),
                "real_peak_bytes": real_peak, "pred_peak_bytes": pred_peak,
                "mem_err_pct": round(_err_pct(pred_peak, real_peak), 3),
                "real_repeats_ms": [round(v, 3) for v in real_repeats],
                "pred_repeats_ms": [round(v, 3) for v in pred_repeats],
                "real_sem_pct": _round(sem),
                "paired_err_pct": round(paired_err, 2),
                "paired_se_pct": _round(paired_se),
                "err_ci95_pct": None if paired_se is None else [
                    round(paired_err - 1.96 * paired_se, 2), round(paired_err + 1.96 * paired_se, 2)
                ],
                "real_bracket_drift_pct": _round(_median(drifts)) if drifts else None,
                # The real runs after the replay against those before it, median against median:
                # an A/A error made beside the prediction, what noise alone scores at these repeats.
                "real_after_vs_before_pct": (
                    round(_err_pct(_median([a for _, a in brackets]), _median([b for b, _ in brackets])), 2)
                    if brackets
                    else None
                ),
                "real_spread_pct": round(spread, 2),
                "within_noise": bool(abs(_err_pct(pred_ms, real_ms)) <= moved),
            }
        )  # fmt: skip
        records[-1].update(_machine_fields([run[rank] for run in real], [run[rank] for run in pred]))
        real_own = [run[rank].own_ms for run in real if run[rank].own_ms is not None]
        pred_own = [run[rank].own_ms for run in pred if run[rank].own_ms is not None]
        if real_own and pred_own:  # the iteration by phase against the real run's
            records[-1]["phase_err"] = _own_phase_errors(real_own, pred_own)
        real_blocks = [run[rank].blocks_ms for run in real if run[rank].blocks_ms is not None]
        pred_blocks = [run[rank].blocks_ms for run in pred if run[rank].blocks_ms is not None]
        if real_blocks and pred_blocks:  # a program's iteration by block, calls inside each
            records[-1]["block_err"] = _own_phase_errors(real_blocks, pred_blocks)
        corrected = [run[rank].corrected_ns / 1e6 for run in pred if run[rank].corrected_ns is not None]
        # A replay: the stall-corrected time beside the wall time, its phases against the graph's.
        if corrected:
            records[-1]["pred_corrected_ms"] = round(_median(corrected), 3)
            records[-1]["corrected_err_pct"] = round(_err_pct(_median(corrected), real_ms), 2)
            records[-1]["graph_phase_err"] = _phase_errors([run[rank].phases_ms or {} for run in pred])
    return records


def _machine_fields(real: list[RankRun], pred: list[RankRun]) -> dict:
    """How clean the runs behind a record were: the most CPU time stolen during a kept real run
    and a kept twin or replayed one (``prism.fidelity.steal``), the runs made again for it, and
    the seconds of iterations a real run's median is taken over."""

    def most(runs: list[RankRun]) -> float | None:
        stolen = [r.steal_pct for r in runs if r.steal_pct is not None]
        return round(max(stolen), 2) if stolen else None

    windows = [r.window_ns for r in real if r.window_ns]
    return {
        "real_steal_pct": most(real),
        "pred_steal_pct": most(pred),
        "real_reruns": sum(r.tries - 1 for r in real),
        "pred_reruns": sum(r.tries - 1 for r in pred),
        "real_window_s": round(_median(windows) / 1e9, 3) if windows else None,
    }


def steal_line(records: list[dict]) -> str:
    """One line on how clean the records' runs were (``_machine_fields``)."""
    stolen = [r[k] for r in records for k in ("real_steal_pct", "pred_steal_pct") if r.get(k) is not None]
    windows = [r["real_window_s"] for r in records if r.get("real_window_s") is not None]
    if not stolen:
        return "CPU time stolen from the machine: not measured"
    # Every rank of a case shares its real runs, and every rank of a source its replayed or twin runs.
    real = {r["case"]: r.get("real_reruns", 0) for r in records}
    pred = {(r["case"], r["source"]): r.get("pred_reruns", 0) for r in records}
    reruns = sum(real.values()) + sum(pred.values())
    window = (
        f"; a real run's median over {min(windows):.2f}-{max(windows):.2f} s of iterations" if windows else ""
    )
    return (
        f"CPU time stolen from the machine during a kept run: at most {max(stolen):.2f} % "
        f"(median {float(np.median(stolen)):.2f} %); runs made again for it: {reruns}{window}"
    )


def _own_phase_errors(real: list[dict[str, float]], pred: list[dict[str, float]]) -> dict[str, dict]:
    """Per phase (``explain.PHASES``), the real runs' median ms against the prediction's (a
    simulation's, or a replayed rank's as measured)."""
    return _phase_errors(
        [{phase: (r[phase], p.get(phase, 0.0)) for phase in r} for r, p in zip(real, pred, strict=False)]
    )


def _phase_errors(repeats: list[dict[str, tuple[float, float]]]) -> dict[str, dict]:
    """Per phase, over repeats: the measured ms against the predicted, and the error, so that a
    total right by cancellation shows as such."""
    out = {}
    for phase in sorted({p for r in repeats for p in r}):
        measured = _median([r[phase][0] for r in repeats if phase in r])
        predicted = _median([r[phase][1] for r in repeats if phase in r])
        out[phase] = {
            "measured_ms": round(measured, 3), "predicted_ms": round(predicted, 3),
            "err_pct": round(_err_pct(predicted, measured), 2) if measured else None,
        }  # fmt: skip
    return out


def breakdown_rows(
    label: str,
    config: GPTConfig,
    real: list[dict[int, RankRun]],
    pred: list[dict[int, RankRun]],
    slices: list[dict],
    captured: GPTConfig | None = None,
) -> list[dict]:
    layout = config.layout
    roles = (captured or config).layout.roles()  # the slice's rank of each role
    rows = []
    for rank in sorted(real[0]):
        role_rank = roles[layout.role(rank)]
        row: dict = {"case": label, "rank": rank}
        for part in ("compute", "comm_wait", "glue"):
            row[f"real_{part}_ms"] = round(_median([run[rank].parts_ms[part] for run in real]), 3)
            row[f"slice_{part}_ms"] = round(_median([s[role_rank][part] for s in slices]), 3)
            row[f"pred_{part}_ms"] = round(_median([run[rank].parts_ms[part] for run in pred]), 3)
        # Memory allocated by the iteration itself at its peak (static bytes left out), and how
        # much the real run's allocator total grows per iteration (it should not).
        row["real_dynamic_bytes"] = int(_median([run[rank].dynamic_bytes for run in real]))
        row["slice_dynamic_bytes"] = int(_median([s[role_rank]["dynamic_bytes"] for s in slices]))
        row["pred_dynamic_bytes"] = int(_median([run[rank].dynamic_bytes for run in pred]))
        row["real_drift_bytes_per_iter"] = int(_median([run[rank].drift_bytes for run in real]))
        # Whole iterations with and without the profiler: the slice's ratio is the build's correction.
        row["real_unprofiled_ms"] = round(_median([run[rank].iter_ns / 1e6 for run in real]), 3)
        row["real_profiled_ms"] = round(_median([run[rank].profiled_ns / 1e6 for run in real]), 3)
        row["slice_unprofiled_ms"] = round(_median([s[role_rank]["unprofiled_ms"] for s in slices]), 3)
        row["slice_profiled_ms"] = round(_median([s[role_rank]["profiled_ms"] for s in slices]), 3)
        rows.append(row)
    return rows


def mean_abs(records: list[dict], key: str) -> float:
    """Mean of |record[key]| over ``records``."""
    return float(np.mean([abs(r[key]) for r in records])) if records else float("nan")


SOURCE_PREFIX = {
    "simulation": "",
    "paced": "paced_",
    "replay": "replay_",
    "final": "final_",
    "floor": "floor_",
}


def final_records(records: list[dict]) -> list[dict]:
    """The simulation of the graph each case ends with: its paced record where the case was
    captured paced, else its slice's ('simulation'); empty where no case was paced (then it is
    the 'simulation' records)."""
    paced = {(r["case"], r["rank"]): r for r in records if r["source"] == "paced"}
    if not paced:
        return []
    return [
        {**paced.get((r["case"], r["rank"]), r), "source": "final"}
        for r in records
        if r["source"] == "simulation"
    ]


def mean_errors(records: list[dict]) -> dict[str, float]:
    """The mean |errors| of each source present in ``records``, as a fidelity JSON's keys:
    ``mean_abs_iter_err_pct`` (simulation), ``paced_...``, ``replay_...``, and ``final_...``
    (``final_records``); the same for the paired iteration error and the memory error."""
    out = {}
    records = records + final_records(records)
    for source, prefix in SOURCE_PREFIX.items():
        chosen = [r for r in records if r["source"] == source]
        if chosen:
            out[f"{prefix}mean_abs_iter_err_pct"] = round(mean_abs(chosen, "iter_err_pct"), 2)
            out[f"{prefix}mean_abs_paired_err_pct"] = round(mean_abs(chosen, "paired_err_pct"), 2)
            out[f"{prefix}mean_abs_mem_err_pct"] = round(mean_abs(chosen, "mem_err_pct"), 3)
    return out
