"""Which layout a group of ranks belongs to: what to tell a user whose program builds a group that
is no group of the layout they gave. Pure Python, no torch.

A program's groups are its parallelism: a group the layout does not have means the layout (its
degrees or its rank order) is not the program's, and every graph built on it would be wrong.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from prism.schemas.group_kinds import DENSE_AXES, DP_PARTS, SPLIT_AXES, WORLD
from prism.schemas.layout import AXES, BASIC_KINDS, ORDER_AXES, LayoutError, ParallelLayout


@dataclass(frozen=True, kw_only=True)
class NearGroup:
    """A group of the layout beside the program's."""

    axis: str
    """Its kind (an axis, or several flattened)."""
    ranks: tuple[int, ...]
    """Its global ranks."""
    shared: int
    """Ranks it shares with the program's group."""


def nearest_groups(layout: ParallelLayout, ranks: tuple[int, ...], *, limit: int = 2) -> list[NearGroup]:
    """The layout's groups holding ``ranks[0]`` that share the most ranks with ``ranks`` (ties:
    the closer size, then the simpler kind, first)."""
    near = [
        NearGroup(axis=kind, ranks=group, shared=len(set(group) & set(ranks)))
        for kind in layout.kinds()
        if kind != WORLD
        for group in [layout.group(ranks[0], kind)]
    ]
    near.sort(key=lambda g: (-g.shared, abs(len(g.ranks) - len(ranks))))
    return near[:limit]


def _orders(cp: int) -> list[str]:
    axes = ORDER_AXES if cp > 1 else AXES
    return ["-".join(p) for p in itertools.permutations(axes)]


def _factorizations(layout: ParallelLayout) -> list[dict[str, int]]:
    """tp, pp, dp and dp_replicate that keep the layout's other degrees and world."""
    world = layout.world_size // layout.cp
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    kept = {a: d for a, d in layout.extra_axes().items() if a != "dp_replicate"}
    found = []
    for tp, pp in itertools.product(divisors, divisors):
        if (world // tp) % pp:
            continue
        dp = world // (tp * pp)
        for replicate in (r for r in divisors if dp % r == 0):
            degrees = {"tp": tp, "pp": pp, "dp": dp, "dp_replicate": replicate, **kept}
            try:
                ParallelLayout(**degrees)
            except LayoutError:
                continue
            found.append(degrees)
    return found


def _axis_group(layout: ParallelLayout, ranks: tuple[int, ...]) -> str | None:
    """The basic kind (one axis, not a flattening) whose group ``ranks`` is, if any."""
    expert = layout.ep * layout.etp > 1  # else the expert kinds are dense ones
    for kind in BASIC_KINDS:
        if kind == WORLD or (kind in SPLIT_AXES and not expert):
            continue
        if layout.degree(kind) == len(ranks) > 1 and layout.group(ranks[0], kind) == ranks:
            return kind
    return None


def matching_layouts(
    layout: ParallelLayout, ranks: tuple[int, ...], *, limit: int = 2
) -> list[tuple[ParallelLayout, str]]:
    """Layouts of the same world and the same cp, ep and etp in which ``ranks`` is one axis's
    group, with that axis: the layout's own degrees in another order first, then other tp, pp, dp
    and dp_replicate (those changing fewer of them first)."""
    found: list[tuple[int, ParallelLayout, str]] = []
    for degrees in _factorizations(layout):
        changed = sum(degrees[axis] != getattr(layout, axis) for axis in (*AXES, "dp_replicate"))
        seen = set()
        for order in _orders(layout.cp):
            # Orders that differ only in where axes of degree 1 sit are one layout.
            other = ParallelLayout(order=order, **degrees)
            effective = tuple(axis for axis in other.order.split("-") if other.degree(axis) > 1)
            if effective in seen:
                continue
            seen.add(effective)
            axis = _axis_group(other, ranks)
            if other != layout and axis is not None:
                found.append((changed, other, axis))
    # Fewest degrees changed, then the pipeline's kept (its stages are the program's roles), then the order.
    found.sort(key=lambda f: (f[0], f[1].pp != layout.pp, f[1].order != layout.order))
    return [(other, axis) for _, other, axis in found[:limit]]


def _shown(ranks: tuple[int, ...]) -> str:
    head = ", ".join(map(str, ranks[:8]))
    return f"[{head}{', ...' if len(ranks) > 8 else ''}] ({len(ranks)} ranks)"


def options_of(layout: ParallelLayout) -> str:
    """The command-line options that give ``layout``."""
    more = "".join(f" --{axis.replace('_', '-')} {degree}" for axis, degree in layout.extra_axes().items())
    return f"--tp {layout.tp} --pp {layout.pp} --dp {layout.dp}{more} --order {layout.order}"


def outside_layout(layout: ParallelLayout, ranks: tuple[int, ...]) -> str:
    """Why ``ranks`` is no group of ``layout``, what is nearest, and what would match (one line)."""
    near = "; ".join(f"its {g.axis} group is {_shown(g.ranks)}" for g in nearest_groups(layout, ranks))
    matches = matching_layouts(layout, ranks)
    fix = (
        " or ".join(f"{options_of(other)} (its {axis} group)" for other, axis in matches)
        if matches
        else "no layout of this world and these degrees has it"
    )
    return f"a group of ranks {_shown(ranks)}, which is no group of {layout}{'; ' + near if near else ''}; would match: {fix}"


def axes_called(layout: ParallelLayout, rank: int, calls: list[tuple[str, str, int | None]]) -> set[str]:
    """The axes ``rank``'s calls span, from (op, group label, peer) each: the axes on which a
    collective's group varies (whatever kind labels it: with dp = ep the expert group is labelled
    dp), the world's all but pp (a program that reduces over every rank is data parallel across
    all of them, but a pipeline is its transfers), a transfer's those on which its ends differ."""
    used: set[str] = set()
    here = layout.fine_coords(rank)
    expert = ("edp", "ep", "etp") if layout.ep * layout.etp > 1 else ()
    axes = [a for a in (*DENSE_AXES, *expert) if layout.degree(a) > 1]
    seen: set[str] = set()
    for op, label, peer in calls:
        if op in ("send", "recv") and peer is not None and peer != rank:
            there = layout.fine_coords(peer)
            used |= {axis for axis in axes if here[axis] != there[axis]}
            continue
        kind = label.split(".")[0]
        if kind in seen:
            continue
        seen.add(kind)
        if kind == WORLD:
            used |= {axis for axis in axes if axis != "pp"}
        elif kind in layout.kinds() or kind in BASIC_KINDS:
            for member in layout.group(rank, kind):
                there = layout.fine_coords(member)
                used |= {axis for axis in axes if here[axis] != there[axis]}
    return used


def unused_axis(layout: ParallelLayout, used: set[str]) -> str | None:
    """Why the layout is not the program's if one of its axes of size > 1 is in no call (one
    line), else None. dp counts as used where either of its parts is."""
    if used & set(DP_PARTS):
        used = used | set(DP_PARTS)
    expert = layout.ep * layout.etp > 1
    for axis in ("pp", "tp", "cp", "dp_shard", "dp_replicate", *(("ep", "etp") if expert else ())):
        if layout.degree(axis) > 1 and axis not in used:
            name = "dp" if axis in DP_PARTS and layout.dp_replicate == 1 else axis
            what = "no transfer between pipeline stages and no group across them" if axis == "pp" else (
                f"no call on a group across {name}")  # fmt: skip
            return (
                f"the layout has {name}={layout.degree(name)} but the program made {what}: the layout is not "
                f"the program's; capture with the degrees it builds ({options_of(layout)} was given)"
            )
    return None
