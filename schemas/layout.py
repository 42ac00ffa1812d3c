"""Rank maths of an N-dimensional parallel layout (a device mesh): pure Python, no torch.

A layout's dense axes are tp, cp, dp and pp, dp being dp_replicate x dp_shard (HSDP's two levels;
dp_shard alone by default); its expert axes split one replica's dp_shard x cp x tp into
edp x ep x etp (``prism.schemas.group_kinds``). The default rank order is Megatron's and
torchtitan's, tp fastest, then cp, then dp (dp_shard inside dp_replicate), then pp:
``rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i))``, ``dp_i = dp_shard_i + dp_shard * dp_replicate_i``.
Any permutation of tp, cp, dp and pp may be given, fastest first; an order without cp puts it just
faster than dp, so with cp = 1 the orders of tp, dp and pp name the layouts they always did. The
expert split flattens its region in the rank order (torchtitan's and Megatron's both).
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass, field
from functools import cached_property

from prism.schemas.group_kinds import (
    DENSE_AXES,
    DP,
    DP_PARTS,
    EXPERT_AXES,
    REGION_AXES,
    SPLIT_AXES,
    WORLD,
    KindError,
    axes_of,
    name_of,
    system_of,
)

AXES: tuple[str, ...] = ("tp", "dp", "pp")
"""The three axes every layout has (the others, cp, dp_replicate, ep and etp, default to 1)."""
EXTRA_AXES: tuple[str, ...] = ("cp", "dp_replicate", "ep", "etp")
"""The degrees a layout has beside tp, pp and dp (1 unless given)."""
ORDER_AXES: tuple[str, ...] = ("tp", "cp", "dp", "pp")
"""What a rank order permutes."""
DEFAULT_ORDER = "tp-dp-pp"
BASIC_KINDS: tuple[str, ...] = ("tp", "dp", "pp", WORLD, "cp", "dp_shard", "dp_replicate", "ep", "etp", "edp")
"""Kinds a group is labelled by before any flattening, in this order of preference (the three
axes first and the world before the others, so that labels stay what they were: with
dp_replicate = 1 the dp_shard group is the dp group)."""


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


def normal_order(order: str, cp: int) -> str:
    """``order`` as a layout keeps it: cp named only where cp > 1 (just faster than dp if the order
    does not place it)."""
    if not isinstance(order, str):
        raise LayoutError(f"order must be a string such as 'tp-dp-pp', got {order!r}")
    axes = order.split("-")
    if "cp" not in axes and "dp" in axes:
        axes.insert(axes.index("dp"), "cp")
    if sorted(axes) != sorted(ORDER_AXES):
        raise LayoutError(f"order must be a permutation of tp, dp, pp (and cp) joined by '-', got {order!r}")
    return "-".join(a for a in axes if a != "cp" or cp > 1)


@dataclass(frozen=True, kw_only=True)
class Coords:
    """Position of one rank on the dense axes."""

    tp: int
    """Index inside the tensor-parallel group."""
    dp: int
    """Index inside the data-parallel group (dp_shard_i + dp_shard * dp_replicate_i)."""
    pp: int
    """Pipeline stage."""
    cp: int = 0
    """Index inside the context-parallel group."""

    def on(self, axis: str) -> int:
        return getattr(self, axis)


@dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    """Degrees of each parallelism and the order ranks are laid out in."""

    tp: int
    """Tensor-parallel degree."""
    pp: int
    """Pipeline-parallel degree (number of stages)."""
    dp: int
    """Data-parallel degree: dp_replicate x dp_shard."""
    cp: int = 1
    """Context-parallel degree."""
    dp_replicate: int = 1
    """Replicas of HSDP (data parallel across which parameters are whole); dp / dp_replicate shard them."""
    ep: int = 1
    """Expert-parallel degree: a factor of dp_shard x cp x tp."""
    etp: int = 1
    """Expert tensor-parallel degree: a factor of dp_shard x cp x tp / ep."""
    order: str = DEFAULT_ORDER
    """Axes from fastest- to slowest-varying, joined by '-'."""
    _axes: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for axis in ("tp", "pp", "dp", "cp", "dp_replicate", "ep", "etp"):
            degree = getattr(self, axis)
            if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
                raise LayoutError(f"{axis} must be a positive integer, got {degree!r}")
        if self.dp % self.dp_replicate:
            raise LayoutError(f"dp_replicate={self.dp_replicate} does not divide dp={self.dp}")
        region = self.dp_shard * self.cp * self.tp
        if region % (self.ep * self.etp):
            raise LayoutError(
                f"ep x etp = {self.ep * self.etp} does not divide dp_shard x cp x tp = {region}, the ranks it splits"
            )
        object.__setattr__(self, "order", normal_order(self.order, self.cp))
        object.__setattr__(self, "_axes", tuple(self.order.split("-")))

    @property
    def dp_shard(self) -> int:
        """Data-parallel ranks that shard parameters (FSDP's), inside each replica."""
        return self.dp // self.dp_replicate

    @property
    def replicas_whole(self) -> bool:
        """Whether every group across data-parallel replicas spans all of them (no HSDP levels,
        no expert split of dp_shard): then replicas alike can be simulated once."""
        return self.dp_replicate == 1 and self.ep * self.etp == 1

    @property
    def fold_axis(self) -> str | None:
        """The axis along which a simulation may read alike replicas once: dp where every group
        across dp replicas spans all of them; dp_replicate under HSDP (a shard or expert group
        inside one replica, a replica group across all); edp for expert parallel without HSDP,
        where each expert-data-parallel index is one block of consecutive ranks that every group
        lies inside or spans evenly (``_edp_stride``); else None."""
        if self.replicas_whole:
            return "dp"
        if self.dp_replicate > 1:
            return "dp_replicate"
        return "edp" if self._edp_stride is not None and self.edp > 1 else None

    def spans_replicas(self, kind: str) -> bool:
        """Whether groups of ``kind`` hold ranks of several replicas along the fold axis (dp where
        there is none): then each holds as many of every replica (``fold_axis``)."""
        axis = self.fold_axis or "dp"
        stride, count = self.stride(axis), self.degree(axis)
        return len({rank // stride % count for rank in self.group(0, kind)}) > 1

    @cached_property
    def _edp_stride(self) -> int | None:
        """The stride of the expert-data-parallel index where it is one: the region's axes (of
        more than one rank) next to each other in the rank order, and each (ep, etp) block of
        region ranks holding whole groups of every region axis but the slowest, so that a group
        of any kind lies inside one block or spans every block alike."""
        axes = [a for a in self._region_axes if self._sizes[a] > 1]
        if not axes:
            return None
        for fast, slow in zip(axes, axes[1:], strict=False):
            if self._strides[slow] != self._strides[fast] * self._sizes[fast]:
                return None  # another axis between them in the rank order
        faster = math.prod(self._sizes[a] for a in axes[:-1])
        block = self.ep * self.etp
        return self._strides[axes[0]] * block if block % faster == 0 else None

    @property
    def edp(self) -> int:
        """Expert data-parallel degree: the region's ranks per (ep, etp) group."""
        return self.dp_shard * self.cp * self.tp // (self.ep * self.etp)

    # -- sizes and strides -------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    def kind_axes(self, kind: str) -> tuple[str, ...]:
        """The axes a group kind spans (``LayoutError`` for a name of no kind)."""
        if kind == WORLD:
            return ("pp", "dp_replicate", "dp_shard", "cp", "tp")
        try:
            return axes_of(kind)
        except KindError as e:
            raise LayoutError(str(e)) from None

    def degree(self, kind: str) -> int:
        """Ranks in one group of ``kind`` (an axis, a flattening, or the world)."""
        size = 1
        for axis in self.kind_axes(kind):
            size *= self._sizes[axis]
        return size

    @cached_property
    def _sizes(self) -> dict[str, int]:
        return {"tp": self.tp, "cp": self.cp, "dp_shard": self.dp_shard, "dp_replicate": self.dp_replicate,
                "pp": self.pp, "edp": self.edp, "ep": self.ep, "etp": self.etp}  # fmt: skip

    @cached_property
    def _strides(self) -> dict[str, int]:
        """Strides of the dense axes, and of dp (whose two parts are adjacent)."""
        strides, stride = {}, 1
        for axis in normal_order(self.order, 2).split("-"):
            for part in DP_PARTS[::-1] if axis == DP else (axis,):
                strides[part] = stride
                stride *= self._sizes[part]
        strides[DP] = strides["dp_shard"]
        return strides

    def stride(self, axis: str) -> int:
        """Distance in rank numbers between neighbours along ``axis`` (a dense axis or dp, or edp
        where it is the fold axis)."""
        self.degree(axis)
        if axis == "edp" and self._edp_stride is not None:
            return self._edp_stride
        if axis not in self._strides:
            raise LayoutError(f"{axis} has no single stride; it is not a dense axis")
        return self._strides[axis]

    @property
    def region_axes(self) -> tuple[str, ...]:
        """The axes the expert axes split (dp_shard, cp, tp), fastest first in the rank order."""
        return self._region_axes

    @cached_property
    def _region_axes(self) -> tuple[str, ...]:
        return tuple(sorted(REGION_AXES, key=self._strides.__getitem__))

    def _rank_key(self, axis: str) -> float:
        """Where ``axis`` sits in the rank order: its stride (the expert axes at their region's)."""
        if axis in SPLIT_AXES:
            return self._strides[self._region_axes[0]] + (2 - SPLIT_AXES.index(axis)) / 4
        return self._strides[axis]

    # -- rank <-> coordinates ----------------------------------------------------------------
    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} out of range for world size {self.world_size}")

    def fine_coords(self, rank: int) -> dict[str, int]:
        """``rank``'s index on every axis of both systems (dense and expert)."""
        self._check_rank(rank)
        out = {a: (rank // self._strides[a]) % self._sizes[a] for a in DENSE_AXES}
        region, scale = 0, 1
        for axis in self._region_axes:
            region += out[axis] * scale
            scale *= self._sizes[axis]
        out["etp"], out["ep"], out["edp"] = (
            region % self.etp,
            region // self.etp % self.ep,
            region // (self.etp * self.ep),
        )
        return out

    def _rank_of(self, fine: dict[str, int], system: tuple[str, ...]) -> int:
        if system is EXPERT_AXES:
            fine = dict(fine)
            region = fine["etp"] + self.etp * (fine["ep"] + self.ep * fine["edp"])
            for axis in self._region_axes:
                region, fine[axis] = divmod(region, self._sizes[axis])
        return sum(fine[a] * self._strides[a] for a in DENSE_AXES)

    def coords(self, rank: int) -> Coords:
        self._check_rank(rank)
        return Coords(
            **{axis: (rank // self._strides[axis]) % self.degree(axis) for axis in ("tp", "dp", "pp", "cp")}
        )

    def rank(self, *, tp: int, dp: int, pp: int, cp: int = 0) -> int:
        coords = {"tp": tp, "dp": dp, "pp": pp, "cp": cp}
        for axis, index in coords.items():
            if not 0 <= index < self.degree(axis):
                raise LayoutError(f"{axis} index {index} out of range for degree {self.degree(axis)}")
        return sum(index * self._strides[axis] for axis, index in coords.items())

    def rank_on_axis(self, stage: int, axis: str, index: int) -> int:
        """The rank of pipeline ``stage`` at ``index`` on ``axis`` (a dense or an expert axis)
        and at 0 on every other axis of that axis's system."""
        system = EXPERT_AXES if axis in SPLIT_AXES else DENSE_AXES
        if axis not in system or axis == "pp":
            raise LayoutError(f"{axis} is not an axis within a pipeline stage")
        if not 0 <= index < self._sizes[axis]:
            raise LayoutError(f"{axis} index {index} out of range for degree {self._sizes[axis]}")
        if not 0 <= stage < self.pp:
            raise LayoutError(f"stage {stage} out of range for pp={self.pp}")
        fine = dict.fromkeys(DENSE_AXES + EXPERT_AXES, 0) | {"pp": stage, axis: index}
        return self._rank_of(fine, system)

    def stage_axes(self) -> tuple[str, ...]:
        """The axes within a pipeline stage: the dense ones, and the expert ones where there is
        expert parallelism (without it they only renumber the dense ones)."""
        expert = SPLIT_AXES if self.ep > 1 or self.etp > 1 else ()
        return tuple(a for a in (*DENSE_AXES, *expert) if a != "pp")

    def axis_ends(self, stage: int) -> dict[str, int]:
        """For each axis of more than one rank within a stage, the rank of ``stage`` at its last
        index (``rank_on_axis``): the ranks where a program that computes differently along an
        axis (the last context-parallel chunk, the last expert group) shows it."""
        axes = [a for a in self.stage_axes() if self._sizes[a] > 1]
        return {a: self.rank_on_axis(stage, a, self._sizes[a] - 1) for a in axes}

    def axis_seconds(self, stage: int) -> dict[str, int]:
        """For each axis of more than two ranks within a stage, the rank of ``stage`` at index 1
        (``rank_on_axis``): with ``axis_ends``, what tells a program that singles out the first
        rank of a group from one that singles out its last."""
        axes = [a for a in self.stage_axes() if self._sizes[a] > 2]
        return {a: self.rank_on_axis(stage, a, 1) for a in axes}

    # -- groups ------------------------------------------------------------------------------
    def others(self, kind: str) -> tuple[str, ...]:
        """The axes of ``kind``'s system outside it, fastest first: a group's index counts them."""
        return self._complement(kind)[1]

    def _complement(self, kind: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(the kind's axes, the other axes of its system, fastest first)."""
        axes = self.kind_axes(kind)
        system = DENSE_AXES if kind == WORLD else system_of(axes)
        return axes, tuple(sorted((a for a in system if a not in axes), key=self._rank_key))

    def group_index(self, rank: int, kind: str) -> int:
        """Index of ``rank``'s group of ``kind`` among all groups of that kind (0-based, dense)."""
        _, others = self._complement(kind)
        fine = self.fine_coords(rank)
        index, scale = 0, 1
        for other in others:
            index += fine[other] * scale
            scale *= self._sizes[other]
        return index

    def group_count(self, kind: str) -> int:
        return self.world_size // self.degree(kind)

    def group(self, rank: int, kind: str) -> tuple[int, ...]:
        """Global ranks of ``rank``'s group of ``kind``, in group-rank order (ascending)."""
        if kind in self._strides:  # one strided axis
            self._check_rank(rank)
            stride, degree = self._strides[kind], self.degree(kind)
            start = rank - (rank // stride) % degree * stride
            return tuple(start + i * stride for i in range(degree))
        axes, _ = self._complement(kind)
        system = DENSE_AXES if kind == WORLD else system_of(axes)
        fine = self.fine_coords(rank)
        if system is DENSE_AXES:
            start = rank - sum(fine[a] * self._strides[a] for a in axes)
            spans = [[i * self._strides[a] for i in range(self._sizes[a])] for a in axes]
            return tuple(sorted(start + sum(offsets) for offsets in itertools.product(*spans)))
        members = [
            self._rank_of({**fine, **dict(zip(axes, values, strict=True))}, system)
            for values in itertools.product(*(range(self._sizes[a]) for a in axes))
        ]
        return tuple(sorted(members))

    def groups(self, kind: str) -> list[tuple[int, ...]]:
        """All groups of ``kind``, ordered by group index."""
        found: dict[int, tuple[int, ...]] = {}
        for rank in range(self.world_size):
            index = self.group_index(rank, kind)
            if index not in found:
                found[index] = self.group(rank, kind)
                if len(found) == self.group_count(kind):
                    break
        return [found[i] for i in range(len(found))]

    def kinds(self) -> list[str]:
        """Every kind a group of more than one rank has in this layout, once each, in label
        preference: the basic kinds, then flattenings of the axes of size > 1 (fewer axes first)."""
        return list(self._kinds)

    @cached_property
    def _kinds(self) -> tuple[str, ...]:
        expert = self.ep * self.etp > 1  # else the expert kinds are dense ones
        candidates = [k for k in BASIC_KINDS if expert or k not in SPLIT_AXES]
        for system in (DENSE_AXES, EXPERT_AXES):
            live = [a for a in system if self._sizes[a] > 1]
            if system is EXPERT_AXES and not expert:
                continue
            for size in range(2, len(live) + 1):
                for axes in itertools.combinations(live, size):
                    if "dp_shard" in axes and self.dp_replicate == 1:
                        axes += ("dp_replicate",)  # named dp, as it is the whole of it
                    candidates.append(name_of(axes))
        kinds, seen = [], set()
        for kind in candidates:
            if self.degree(kind) > 1:
                # Two kinds whose groups through rank 0 are one set are taken as one kind: true of
                # dense kinds and of expert splits aligned with the region's axes. Where a split is
                # not, a group of the dropped kind goes unlabelled and the capture stops on it
                # (group_of_ranks checks every label against the group's ranks).
                key = "all" if self.degree(kind) == self.world_size else self._group_key(kind)
                if key not in seen:
                    seen.add(key)
                    kinds.append(kind)
        return tuple(kinds)

    def _group_key(self, kind: str) -> frozenset[str] | tuple[int, ...]:
        """What the group of ``kind`` through rank 0 is, as a set: the dense axes of more than one
        rank it spans where it is every combination of their indices (any dense kind: no need to
        list a group of millions of ranks), else its ranks."""
        axes, _ = self._complement(kind)
        if kind == WORLD or system_of(axes) is DENSE_AXES:
            return frozenset(a for a in axes if self._sizes[a] > 1)
        members = self.group(0, kind)
        spanned = frozenset(
            a for m in members for a, i in self.fine_coords(m).items() if i and a in DENSE_AXES
        )
        return spanned if len(members) == math.prod(self._sizes[a] for a in spanned) else members

    def bound_kinds(self) -> tuple[str, ...]:
        """Every kind a program's collective can be bound to in a graph: tp, dp and pp always, the
        kinds of more than one rank, and the extra axes of degree 1 (one-rank groups)."""
        return tuple(dict.fromkeys(("tp", "dp", "pp", *self.kinds(), *self.single_rank_axes())))

    def single_rank_axes(self) -> tuple[str, ...]:
        """The extra axes of degree 1: a one-rank group is labelled by the first of them where tp,
        dp and pp are all larger (``group_of_ranks``)."""
        return tuple(a for a in EXTRA_AXES if self.degree(a) == 1)

    def group_of_ranks(self, ranks: tuple[int, ...] | list[int]) -> tuple[str, int] | None:
        """(kind, group index) if ``ranks`` is exactly one group of some kind, else None;
        ('world', 0) for all ranks when no single axis spans them.

        An axis wins over 'world' (with dp = world size, the DP group is the world and is
        labelled dp), and the world over flattenings. For degenerate axes (degree 1) several axes
        match a single rank; the first of tp, dp, pp, then cp, dp_replicate, ep, etp wins so that
        labels are stable (a one-rank group is a group of the layout wherever one axis is 1).
        """
        ranks = tuple(ranks)
        if not ranks:
            return None
        for axis in AXES if len(ranks) > 1 else (*AXES, *self.single_rank_axes()):
            if self.degree(axis) == len(ranks) and self.group(ranks[0], axis) == ranks:
                return (axis, self.group_index(ranks[0], axis))
        if len(ranks) == self.world_size and ranks == tuple(range(self.world_size)):
            return (WORLD, 0)
        for kind in self._kinds:
            if kind not in AXES and kind != WORLD and self.degree(kind) == len(ranks):
                if self.group(ranks[0], kind) == ranks:
                    return (kind, self.group_index(ranks[0], kind))
        return None

    # -- pipeline ----------------------------------------------------------------------------
    def stage(self, rank: int) -> int:
        return self.coords(rank).pp

    def same_pipeline(self, a: int, b: int) -> bool:
        """Whether ranks ``a`` and ``b`` are stages of one pipeline (the same tp, cp and dp index)."""
        ca, cb = self.coords(a), self.coords(b)
        return (ca.tp, ca.cp, ca.dp) == (cb.tp, cb.cp, cb.dp)

    def in_pipeline(self, rank: int, stage: int) -> int:
        """The rank at ``stage`` of ``rank``'s pipeline."""
        c = self.coords(rank)
        return self.rank(tp=c.tp, dp=c.dp, pp=stage, cp=c.cp)

    def pipeline_next(self, rank: int) -> int | None:
        """Rank of the next stage of ``rank``'s pipeline, None on the last stage."""
        c = self.coords(rank)
        return None if c.pp == self.pp - 1 else self.in_pipeline(rank, c.pp + 1)

    def pipeline_prev(self, rank: int) -> int | None:
        """Rank of the previous stage of ``rank``'s pipeline, None on the first stage."""
        c = self.coords(rank)
        return None if c.pp == 0 else self.in_pipeline(rank, c.pp - 1)

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
        of the layout, world first, then those of its axes (tp, dp, pp, cp, ...) with more than one
        member."""
        world = list(range(self.world_size))
        groups = [("0", "default_pg", world)] + [
            (f"{kind}.{self.group_index(rank, kind)}", kind, list(self.group(rank, kind)))
            for kind in self._kinds
            if kind in BASIC_KINDS and kind != WORLD
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

    def extra_axes(self) -> dict[str, int]:
        """The degrees beyond tp, pp and dp that are not 1."""
        return {a: getattr(self, a) for a in EXTRA_AXES if getattr(self, a) != 1}

    def to_dict(self) -> dict[str, int | str]:
        """tp, pp, dp and order, and the other degrees where not 1 (a three-axis layout is written as
        it always was)."""
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, **self.extra_axes(), "order": self.order}

    @classmethod
    def from_dict(cls, data: dict) -> ParallelLayout:
        # No coercion: a float or bool degree in a file is an error, as in the constructor.
        if not isinstance(data, dict):
            raise LayoutError(f"a layout is a mapping of axes to degrees, got {data!r}")
        missing = [a for a in ("tp", "pp", "dp") if a not in data]
        if missing:
            raise LayoutError(f"a layout without {', '.join(missing)}")
        unknown = set(data) - {"tp", "pp", "dp", "order", *EXTRA_AXES}
        if unknown:
            raise LayoutError(
                f"a layout with axes {', '.join(sorted(unknown))}, which this prism does not know"
            )
        extra = {a: data[a] for a in EXTRA_AXES if a in data}
        return cls(
            tp=data["tp"], pp=data["pp"], dp=data["dp"], order=data.get("order", DEFAULT_ORDER), **extra
        )

    def __str__(self) -> str:
        extra = self.extra_axes()
        if "dp_replicate" in extra:
            extra = {"dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, **extra}
        more = "".join(f" {a}={d}" for a, d in extra.items())
        return f"tp={self.tp} pp={self.pp} dp={self.dp}{more} ({self.order}, {self.world_size} ranks)"
