"""Whether a capture's times can give a graph at all: checked before anything is built.

A capture cut at something other than the program's training steps (an inner optimizer's step,
one of several optimizers stepped in turn) gives iterations of near-zero length beside whole
ones, a profiler correction near zero, and a graph wrong by orders of magnitude: refused here
with one line, never built.
"""

from __future__ import annotations

from prism.graph.build.profiler_overhead import Correction, correction_scale
from prism.schemas.iterations import (
    CUT_HINT,
    DEFAULT_WARMUP,
    MIN_WARMUP,
    STEADY_CLEAN,
    implausible_iterations,
)
from prism.schemas.manifest import CaptureManifest

FACTOR_RANGE = (0.02, 2.0)
"""Unprofiled / profiled own time a rank can have: the profiler slows a CPU step 1.5-10 times and
barely a CUDA one; beyond this range the unprofiled and profiled iterations are not the same work."""


class UntrustedTiming(ValueError):
    """The capture's times cannot be the program's (one line: why, and what to do)."""


def check_timing(manifest: CaptureManifest, correction: Correction) -> None:
    """Refuse ``manifest``'s capture when a rank's iterations are not its program's steps, or the
    profiler correction asked for has no clean iteration to stand on or comes out implausible."""
    warmup, device = manifest.job.warmup, manifest.job.device
    for captured in manifest.ranks:
        reason = implausible_iterations(captured.result.iteration_ns, warmup, captured.result.calls)
        if reason is not None:
            raise UntrustedTiming(f"the capture's rank {captured.rank}: {reason}; {CUT_HINT}")
        if correction == Correction.NONE:
            continue
        scale = correction_scale(captured.result, warmup, correction, device)
        if scale is None:
            raise UntrustedTiming(
                f"the capture ran {warmup} warm-up iteration(s), so it has no clean unprofiled one to take "
                f"the profiler's cost out by: capture with --warmup {DEFAULT_WARMUP} (at least {MIN_WARMUP}), "
                "or build with --profiler-correction none to predict profiled iterations"
            )
        low, high = FACTOR_RANGE
        if not low <= scale.factor <= high:
            raise UntrustedTiming(
                f"the capture's rank {captured.rank} ran its unprofiled iterations in {scale.unprofiled_ns / 1e6:.3g} ms "
                f"and its profiled ones in {scale.profiled_ns / 1e6:.3g} ms: a profiler correction of "
                f"×{scale.factor:.3g} (plausible: ×{low}-×{high}) means they are not the same work"
                f"{_few_clean_hint(scale.clean_iterations) if scale.factor > high else ''}; {CUT_HINT}"
            )


def _few_clean_hint(clean: int) -> str:
    """What to say of unprofiled iterations slower than profiled ones: with few clean ones, a
    busy machine during the warm-up is as likely a cause as other work."""
    if clean >= STEADY_CLEAN:
        return ""
    return (
        f", or the machine was busy during the {clean} clean warm-up iteration(s): capture with "
        f"--warmup {DEFAULT_WARMUP} for a median over {STEADY_CLEAN}"
    )
