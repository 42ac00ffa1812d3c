"""The shape a 1F1B pipeline job is cut by: its layout, the microbatches of an iteration and the
layers its stages share, as the workload record names them (``prism.schemas.workload``). The
built-in workload runs it; the graph builder composes a target's schedule from it, which differs
from the captured one where the user asks for another pp, dp, layer count or microbatch count
(tp sets the per-rank shapes and stays).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prism.schemas.layout import ParallelLayout
from prism.schemas.workload import RecordError, record_shape


class ShapeError(ValueError):
    """A shape the 1F1B schedule cannot run; the message is one line."""


@dataclass(frozen=True, kw_only=True)
class PipelineShape:
    """A job's layout, microbatches per iteration and layers, split evenly over its stages."""

    tp: int
    pp: int
    dp: int
    microbatches: int
    layers: int

    def __post_init__(self) -> None:
        if self.layers % self.pp:
            raise ShapeError(f"layers ({self.layers}) must be divisible by pp ({self.pp})")
        if self.microbatches < self.pp:
            raise ShapeError(
                f"microbatches ({self.microbatches}) must be at least pp ({self.pp}) for the 1F1B schedule"
            )

    @classmethod
    def of_record(cls, record: Mapping) -> PipelineShape:
        """The shape a workload record names (``ShapeError`` where it has none)."""
        try:
            return cls(**record_shape(record))
        except RecordError as e:
            raise ShapeError(str(e)) from None

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(tp=self.tp, pp=self.pp, dp=self.dp)

    @property
    def layers_per_stage(self) -> int:
        return self.layers // self.pp

    def stage_layers(self, stage: int) -> range:
        """Global indices of the layers ``stage`` holds."""
        n = self.layers_per_stage
        return range(stage * n, (stage + 1) * n)

    def to_dict(self) -> dict[str, int]:
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "microbatches": self.microbatches,
            "layers": self.layers,
        }
