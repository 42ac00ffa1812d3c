"""Where the captured ranks of one pipeline stage call differently, and which ranks then run
whose calls (``prism.schemas.rank_programs``).

With ``--roles axis-ends`` each stage's first rank is captured with, on every axis of more than
one rank, its rank at the last index and, past two ranks, at index 1 (the other axes at 0).
Each is compared call by call with the first (``prism.graph.build.alike``):

- an axis whose captured ranks call as the first binds nothing;
- where the last differs and index 1 calls as the last (or there is no index 1 but the last),
  every rank past index 0 runs the last's calls: the program singles out the first rank of
  a group;
- where the last differs and index 1 calls as the first, only the last index runs the last's
  calls: the program singles out the last rank (ranks between are taken to call as index 1);
- index 1 differing from both, or alone, is three programs on one axis: the build stops.

Any other captured rank must call as the first, as before.
"""

from __future__ import annotations

from collections.abc import Callable

from prism.graph.build.alike import Call, check_alike
from prism.graph.build.templates import TemplateError
from prism.schemas.layout import ParallelLayout
from prism.schemas.manifest import CapturedRank
from prism.schemas.rank_programs import RankVariant, VariantError, check_variants

Found = tuple[RankVariant, CapturedRank, str]
"""A variant, the captured rank whose calls it runs, and the line saying where they differ."""


def where(layout: ParallelLayout, base: int, other: int) -> str:
    """Where ``other`` stands apart from ``base`` on the mesh: 'at cp 1 of 2, ep 3 of 4'."""
    a, b = layout.fine_coords(base), layout.fine_coords(other)
    apart = [
        f"{axis} {b[axis]} of {layout.degree(axis)}" for axis in layout.stage_axes() if a[axis] != b[axis]
    ]
    return "at " + ", ".join(apart) if apart else "at the same place"


def _differs(calls: Callable[[int], list[Call]], a: int, b: int, why: str) -> str | None:
    """The line naming where ranks ``a`` and ``b`` first call differently; None where they do not."""
    try:
        check_alike({a: calls(a), b: calls(b)}, why)
    except TemplateError as e:
        return str(e)
    return None


def _stage_variants(
    layout: ParallelLayout, stage: int, ranks: list[CapturedRank], calls: Callable[[int], list[Call]]
) -> list[Found]:
    """``find_variants`` of one stage."""
    base, captured = ranks[0].rank, {r.rank: r for r in ranks}

    def against_base(rank: int) -> str | None:
        return _differs(
            calls, base, rank, f"both run pipeline stage {stage} (rank {rank} {where(layout, base, rank)})"
        )

    found: list[Found] = []
    seconds, bound = layout.axis_seconds(stage), set()
    for axis, end in layout.axis_ends(stage).items():
        if end in bound or end not in captured:
            continue
        second = seconds.get(axis, end)
        bound |= {end, second}
        end_differs = against_base(end)
        second_differs = against_base(second) if second != end and second in captured else None
        if end_differs is None:
            if second_differs is not None:
                raise TemplateError(
                    f"{second_differs} (ranks between the ends of {axis} call apart: not bound)"
                )
            continue
        if second != end and second not in captured:
            raise TemplateError(
                f"{end_differs}; capture rank {second} ({axis} 1) too, which tells which ranks call as "
                f"rank {end} (prism-capture --roles axis-ends)"
            )
        if second_differs is not None and _differs(calls, second, end, f"differ from rank {base} on {axis}"):
            raise TemplateError(f"ranks {base}, {second} and {end} of pipeline stage {stage} each call "
                                f"differently along {axis}: three programs on one axis are not bound")  # fmt: skip
        first_index = 1 if second_differs is not None or second == end else layout.degree(axis) - 1
        variant = RankVariant(stage=stage, axis=axis, first_index=first_index, rank=end,
                              static_bytes=int(captured[end].result.static_bytes))  # fmt: skip
        found.append((variant, captured[end], end_differs))
    for rank in sorted(captured.keys() - bound - {base}):
        problem = against_base(rank)
        if problem is not None:
            raise TemplateError(problem)
    return found


def find_variants(
    layout: ParallelLayout, by_stage: dict[int, list[CapturedRank]], calls: Callable[[int], list[Call]]
) -> list[Found]:
    """The variants of every stage whose captured ranks (``by_stage``, each stage's first rank
    first) differ as the module docstring binds; a TemplateError where they differ otherwise.
    ``calls(rank)``: a captured rank's call sequence."""
    found = [
        v for stage, ranks in sorted(by_stage.items()) for v in _stage_variants(layout, stage, ranks, calls)
    ]
    try:
        check_variants(layout, [v for v, _, _ in found])
    except VariantError as e:
        raise TemplateError(f"{e} (capture each such combination as a program of its own)") from None
    return found


def variant_line(variant: RankVariant, layout: ParallelLayout, why: str) -> str:
    """What a user reads of a variant: which ranks run whose calls, and the first difference."""
    last = layout.degree(variant.axis) - 1
    first = variant.first_index
    at = f"{variant.axis} {first}" if first == last else f"{variant.axis} {first}..{last}"
    return (
        f"the ranks of pipeline stage {variant.stage} at {at} run captured rank {variant.rank}'s calls, "
        f"not its first rank's: {why.split(', but ', 1)[-1]}"
    )
