"""The cluster spec a fidelity run prices its predictions with: given, the calibrated 'local'
preset, or a calibration made now of the calls the cases make."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prism.graph.comm.calibrate import CalibrationConfig, calibrate
from prism.schemas.cluster import ClusterSpec, ClusterSpecError, local_path, preset

CALIBRATION_OPS = ("all_reduce", "send")
"""The GPT workload's process-group calls: all_reduce (TP, DP, loss) and send/recv (PP)."""
PROGRAM_CALIBRATION_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send")
"""What the example programs call besides: FSDP2's all-gathers and reduce-scatters, DTensor's,
a mixture of experts' all-to-alls."""
KiB, MiB = 2**10, 2**20
CALIBRATION_SIZES = (512, 4 * KiB, 64 * KiB, 128 * KiB, 1 * MiB, 8 * MiB, 16 * MiB, 32 * MiB)
"""Bytes a fresh calibration times: the default cases' own calls (512 B loss and 64/128 KiB
activation all-reduces, 64/128 KiB pipeline sends, 7-21 MB gradient buckets) and points around
them, so that the fit (or, with ``--calibrate-table``, the measured table) covers them."""


@dataclass(frozen=True, kw_only=True)
class SpecChoice:
    """The cluster spec the predictions use, and where it came from."""

    spec: ClusterSpec
    """The spec."""
    source: str
    """A line saying which file it is and how it got there."""


def resolve_spec(
    path: Path | None, calibrate_into: Path, *, recalibrate: bool = False, compute_between_ms: float = 0.0,
    reps: int = CalibrationConfig.reps,
    sizes: tuple[int, ...] = CALIBRATION_SIZES, measured_table: bool = False,
    ops: tuple[str, ...] = CALIBRATION_OPS, busy_rounds: int = 0, wake_gaps_ms: tuple[float, ...] = (),
) -> SpecChoice:  # fmt: skip
    """``path`` if given; else the calibrated 'local' preset; else (or if ``recalibrate``) calibrate now.

    A fresh calibration times gloo ``ops`` (all_reduce and send/recv) of ``sizes`` between 2
    processes (fitted, and written into the spec's measured table too if ``measured_table``; cold
    calls after ``compute_between_ms`` of compute when > 0; a ``busy_call`` table over
    ``busy_rounds`` rounds > 0; a ``wake_compute``
    table for ``wake_gaps_ms``) and is written to
    ``calibrate_into``, never to the shared 'local' path.
    """
    if path is not None:
        return SpecChoice(spec=ClusterSpec.load(path), source=f"{path} (given)")
    if not recalibrate:
        try:
            return SpecChoice(spec=preset("local"), source=f"{local_path()} (the calibrated 'local' preset)")
        except ClusterSpecError:
            pass
    result = calibrate(
        CalibrationConfig(
            max_procs=2,
            ops=ops,
            out=calibrate_into,
            compute_between_ms=compute_between_ms,
            reps=reps,
            sizes=sizes,
            measured_table=measured_table,
            busy_rounds=busy_rounds,
            wake_gaps_ms=wake_gaps_ms,
        )
    )
    why = "--recalibrate" if recalibrate else f"no 'local' spec at {local_path()}"
    return SpecChoice(
        spec=result.spec,
        source=f"{result.path} (calibrated now: {why}; {result.spec.notes}; "
        f"median relative error {result.median_rel_error:.0%})",
    )
