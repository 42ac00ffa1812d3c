"""Rank maths of a (tp, pp, dp) parallel layout: pure Python, no torch.

The default rank order is Megatron's ``tp-dp-pp``: tp varies fastest, then dp, then pp, so
``rank = tp_index + tp * (dp_index + dp * pp_index)``. Any permutation of the three axes may be
given, fastest first.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property

AXES: tuple[str, ...] = ("tp", "dp", "pp")
DEFAULT_ORDER = "tp-dp-pp"


class LayoutError(ValueError):
    """A layout that cannot exist (bad degree, bad order, rank out of range)."""


class Role(enum.StrEnum):
    """Class of ranks that run the same program text: the kind of pipeline stage."""

    SINGLE = "single"  # pp == 1: the one stage is both first and last
    FIRST = "first"
    MIDDLE = "middle"
    LAST = "last"


def parse_rank_list(text: str) -> tuple[int, ...]:
    """'0,7,8191' as ranks (the command lines' --ranks, --trace-peers)."""
    try:
        return tuple(int(r) for r in text.split(",") if r.strip())
    except ValueError:
        raise LayoutError(f"{text!r} is not a comma-separated list of ranks") from None


@dataclass(frozen=True, kw_only=True)
class Coords:
    """Position of one rank on the three axes."""

    tp: int
    """Index inside the tensor-parallel group."""
    dp: int
    """Index inside the data-parallel group."""
    pp: int
    """Pipeline stage."""

    def on(self, axis: str) -> int:
        return getattr(self, axis)


@dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    """Degrees of tensor, pipeline and data parallelism and the order ranks are laid out in."""

    tp: int
    """Tensor-parallel degree."""
    pp: int
    """Pipeline-parallel degree (number of stages)."""
    dp: int
    """Data-parallel degree."""
    order: str = DEFAULT_ORDER
    """Axes from fastest- to slowest-varying, joined by '-'."""
    _axes: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for axis in AXES:
            degree = getattr(self, axis)
            if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
                raise LayoutError(f"{axis} must be a positive integer, got {degree!r}")
        axes = tuple(self.order.split("-"))
        if sorted(axes) != sorted(AXES):
            raise LayoutError(f"order must be a permutation of tp, dp, pp joined by '-', got {self.order!r}")
        object.__setattr__(self, "_axes", axes)

    # -- sizes and strides -------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def degree(self, axis: str) -> int:
        if axis not in AXES:
            raise LayoutError(f"unknown axis {axis!r}; expected one of {', '.join(AXES)}")
        return getattr(self, axis)

    @cached_property
    def _strides(self) -> dict[str, int]:
        strides, stride = {}, 1
        for axis in self._axes:
            strides[axis] = stride
            stride *= getattr(self, axis)
        return strides

    def stride(self, axis: str) -> int:
        """Distance in rank numbers between neighbours along ``axis``."""
        self.degree(axis)
        return self._strides[axis]

    # -- rank <-> coordinates ----------------------------------------------------------------
    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} out of range for world size {self.world_size}")

    def coords(self, rank: int) -> Coords:
        self._check_rank(rank)
        values = {axis: (rank // self._strides[axis]) % getattr(self, axis) for axis in AXES}
        return Coords(**values)

    def rank(self, *, tp: int, dp: int, pp: int) -> int:
        coords = {"tp": tp, "dp": dp, "pp": pp}
        for axis, index in coords.items():
            if not 0 <= index < getattr(self, axis):
                raise LayoutError(f"{axis} index {index} out of range for degree {getattr(self, axis)}")
        return sum(index * self._strides[axis] for axis, index in coords.items())

    # -- groups ------------------------------------------------------------------------------
    def group_index(self, rank: int, axis: str) -> int:
        """Index of ``rank``'s group along ``axis`` among all groups of that axis (0-based, dense)."""
        self.degree(axis)
        c = self.coords(rank)
        others = [a for a in self._axes if a != axis]
        index, scale = 0, 1
        for other in others:
            index += c.on(other) * scale
            scale *= getattr(self, other)
        return index

    def group_count(self, axis: str) -> int:
        return self.world_size // self.degree(axis)

    def group(self, rank: int, axis: str) -> tuple[int, ...]:
        """Global ranks of ``rank``'s group along ``axis``, in group-rank order."""
        self.degree(axis)
        start = rank - self.coords(rank).on(axis) * self.stride(axis)
        stride = self.stride(axis)
        return tuple(start + i * stride for i in range(self.degree(axis)))

    def groups(self, axis: str) -> list[tuple[int, ...]]:
        """All groups of ``axis``, ordered by group index."""
        stride, degree = self.stride(axis), self.degree(axis)
        firsts = [r for r in range(self.world_size) if (r // stride) % degree == 0]
        ordered = sorted(firsts, key=lambda r: self.group_index(r, axis))
        return [tuple(first + i * stride for i in range(degree)) for first in ordered]

    def group_of_ranks(self, ranks: tuple[int, ...] | list[int]) -> tuple[str, int] | None:
        """(axis, group index) if ``ranks`` is exactly one group of some axis, else None;
        ('world', 0) for all ranks when no single axis spans them.

        An axis wins over 'world' (with dp = world size, the DP group is the world and is
        labelled dp). For degenerate axes (degree 1) several axes match a single rank; the first
        of tp, dp, pp wins so that labels are stable.
        """
        ranks = tuple(ranks)
        if not ranks:
            return None
        for axis in AXES:
            if self.degree(axis) == len(ranks) and self.group(ranks[0], axis) == ranks:
                return (axis, self.group_index(ranks[0], axis))
        if len(ranks) == self.world_size and ranks == tuple(range(self.world_size)):
            return ("world", 0)
        return None

    # -- pipeline ----------------------------------------------------------------------------
    def stage(self, rank: int) -> int:
        return self.coords(rank).pp

    def same_pipeline(self, a: int, b: int) -> bool:
        """Whether ranks ``a`` and ``b`` are stages of one pipeline (the same tp and dp index)."""
        ca, cb = self.coords(a), self.coords(b)
        return (ca.tp, ca.dp) == (cb.tp, cb.dp)

    def in_pipeline(self, rank: int, stage: int) -> int:
        """The rank at ``stage`` of ``rank``'s pipeline."""
        c = self.coords(rank)
        return self.rank(tp=c.tp, dp=c.dp, pp=stage)

    def pipeline_next(self, rank: int) -> int | None:
        """Rank of the next stage with the same tp and dp index, None on the last stage."""
        c = self.coords(rank)
        return None if c.pp == self.pp - 1 else self.rank(tp=c.tp, dp=c.dp, pp=c.pp + 1)

    def pipeline_prev(self, rank: int) -> int | None:
        """Rank of the previous stage with the same tp and dp index, None on the first stage."""
        c = self.coords(rank)
        return None if c.pp == 0 else self.rank(tp=c.tp, dp=c.dp, pp=c.pp - 1)

    # -- roles -------------------------------------------------------------------------------
    def role_of_stage(self, stage: int) -> Role:
        if not 0 <= stage < self.pp:
            raise LayoutError(f"stage {stage} out of range for pp={self.pp}")
        if self.pp == 1:
            return Role.SINGLE
        if stage == 0:
            return Role.FIRST
        return Role.LAST if stage == self.pp - 1 else Role.MIDDLE

    def role(self, rank: int) -> Role:
        return self.role_of_stage(self.stage(rank))

    def roles(self) -> dict[Role, int]:
        """One representative rank per distinct role: tp index 0, dp index 0 of its stage.

        The middle role is represented by stage 1 (the middle stage with the longest 1F1B
        warm-up, hence the most activations held at once).
        """
        stages = {self.role_of_stage(s): s for s in (0, min(1, self.pp - 1), self.pp - 1)}
        return {role: self.rank(tp=0, dp=0, pp=stage) for role, stage in stages.items()}

    # -- serialisation -----------------------------------------------------------------------
    def distributed_info(self, rank: int) -> dict:
        """The ``distributedInfo`` a Kineto trace of ``rank`` carries (torch writes it for the
        rank's process groups): HTA and Perfetto place the trace by it. The groups are the rank's
        of the layout, world first, then tp, dp, pp (those with more than one member)."""
        world = list(range(self.world_size))
        groups = [("0", "default_pg", world)] + [
            (f"{axis}.{self.group_index(rank, axis)}", axis, list(self.group(rank, axis)))
            for axis in ("tp", "dp", "pp")
            if self.degree(axis) > 1
        ]
        return {
            "backend": "prism",
            "rank": rank,
            "world_size": self.world_size,
            "pg_count": len(groups),
            "pg_config": [
                {"pg_name": name, "pg_desc": desc, "backend_config": "cpu:prism,cuda:prism", "pg_size": len(ranks),
                 "ranks": ranks}
                for name, desc, ranks in groups
            ],
        }  # fmt: skip

    def to_dict(self) -> dict[str, int | str]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "order": self.order}

    @classmethod
    def from_dict(cls, data: dict) -> ParallelLayout:
        # No coercion: a float or bool degree in a file is an error, as in the constructor.
        return cls(tp=data["tp"], pp=data["pp"], dp=data["dp"], order=data.get("order", DEFAULT_ORDER))

    def __str__(self) -> str:
        return f"tp={self.tp} pp={self.pp} dp={self.dp} ({self.order}, {self.world_size} ranks)"
