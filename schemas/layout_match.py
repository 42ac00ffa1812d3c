"""Which layout a group of ranks belongs to: what to tell a user whose program builds a group that
is no group of the layout they gave. Pure Python, no torch.

A program's groups are its parallelism: a group the layout does not have means the layout (its
degrees or its rank order) is not the program's, and every graph built on it would be wrong.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from prism.schemas.layout import AXES, ParallelLayout


@dataclass(frozen=True, kw_only=True)
class NearGroup:
    """A group of the layout beside the program's."""

    axis: str
    """Its axis."""
    ranks: tuple[int, ...]
    """Its global ranks."""
    shared: int
    """Ranks it shares with the program's group."""


def nearest_groups(layout: ParallelLayout, ranks: tuple[int, ...], *, limit: int = 2) -> list[NearGroup]:
    """The layout's groups holding ``ranks[0]`` that share the most ranks with ``ranks`` (ties:
    the closer size first)."""
    near = [
        NearGroup(axis=axis, ranks=group, shared=len(set(group) & set(ranks)))
        for axis in AXES
        if layout.degree(axis) > 1
        for group in [layout.group(ranks[0], axis)]
    ]
    near.sort(key=lambda g: (-g.shared, abs(len(g.ranks) - len(ranks))))
    return near[:limit]


def flattened_axes(layout: ParallelLayout, ranks: tuple[int, ...]) -> tuple[str, ...] | None:
    """The axes (two or more, fastest first) whose flattened sub-mesh through ``ranks[0]`` is
    exactly ``ranks`` as a set (torchtitan flattens dp and tp into one group), or None."""
    members = set(ranks)
    first = layout.coords(ranks[0])
    for size in range(2, len(AXES) + 1):
        for axes in itertools.combinations(AXES, size):
            held = [a for a in AXES if a not in axes]
            expected = 1
            for axis in axes:
                expected *= layout.degree(axis)
            if expected != len(members) or expected == 1:
                continue
            if all(layout.coords(r).on(a) == first.on(a) for r in members for a in held):
                return tuple(sorted(axes, key=layout.stride))
    return None


def _orders() -> list[str]:
    return ["-".join(p) for p in itertools.permutations(AXES)]


def _factorizations(world: int) -> list[dict[str, int]]:
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    return [
        {"tp": tp, "pp": pp, "dp": world // (tp * pp)}
        for tp in divisors
        for pp in divisors
        if (world // tp) % pp == 0
    ]


def matching_layouts(
    layout: ParallelLayout, ranks: tuple[int, ...], *, limit: int = 2
) -> list[tuple[ParallelLayout, str]]:
    """Layouts of the same world in which ``ranks`` is one axis's group, with that axis: the
    layout's own degrees in another order first, then other degrees (those changing fewer of the
    given degrees first)."""
    found: list[tuple[int, ParallelLayout, str]] = []
    for degrees in _factorizations(layout.world_size):
        changed = sum(degrees[axis] != layout.degree(axis) for axis in AXES)
        seen = set()
        for order in _orders():
            # Orders that differ only in where axes of degree 1 sit are one layout.
            effective = tuple(axis for axis in order.split("-") if degrees[axis] > 1)
            if effective in seen:
                continue
            seen.add(effective)
            other = ParallelLayout(order=order, **degrees)
            match = other.group_of_ranks(ranks)
            if other != layout and match is not None and match[0] != "world" and other.degree(match[0]) > 1:
                found.append((changed, other, match[0]))
    # Fewest degrees changed, then the pipeline's kept (its stages are the program's roles), then the order.
    found.sort(key=lambda f: (f[0], f[1].pp != layout.pp, f[1].order != layout.order))
    return [(other, axis) for _, other, axis in found[:limit]]


def _shown(ranks: tuple[int, ...]) -> str:
    head = ", ".join(map(str, ranks[:8]))
    return f"[{head}{', ...' if len(ranks) > 8 else ''}] ({len(ranks)} ranks)"


def options_of(layout: ParallelLayout) -> str:
    """The command-line options that give ``layout``."""
    return f"--tp {layout.tp} --pp {layout.pp} --dp {layout.dp} --order {layout.order}"


def outside_layout(layout: ParallelLayout, ranks: tuple[int, ...]) -> str:
    """Why ``ranks`` is no group of ``layout``, what is nearest, and what would match (one line)."""
    near = "; ".join(f"its {g.axis} group is {_shown(g.ranks)}" for g in nearest_groups(layout, ranks))
    matches = matching_layouts(layout, ranks)
    fix = (
        " or ".join(f"{options_of(other)} (its {axis} group)" for other, axis in matches)
        if matches
        else "no layout of tp, pp and dp of this world has it"
    )
    return f"a group of ranks {_shown(ranks)}, which is no group of {layout}{'; ' + near if near else ''}; would match: {fix}"
