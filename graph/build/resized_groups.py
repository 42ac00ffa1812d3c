"""A program's graph at another data-parallel degree or pipeline depth than the one captured.

Every rank of a data-parallel axis runs the same per-rank program whatever the axis's size
where the program makes no call whose bytes depend on that size: an all-reduce (DDP's
gradient buckets, HSDP's replica all-reduce, a logged loss), a broadcast, a reduce or a barrier
sends the same bytes over a group of 2 as over a group of 2,048. Such a program's graph at
another ``--dp`` (or ``--dp-replicate``, ``--dp-shard``) is its captured stage programs bound to
the target layout: the same nodes, its collectives priced over the target's groups. At another
``--pp`` each stage runs a captured stage's program at its place in the schedule
(``prism.graph.build.pipeline_depth``), under the same rule for the groups that change size.

Refused, in one line naming what stops it:

- a call on a resized group that sends a share of its data (all-gather, reduce-scatter,
  all-to-all, gather, scatter: FSDP's shards are a fraction of each parameter per rank, so its
  compute, memory and bytes change with the size);
- an axis of one rank on one side (a program makes no calls with peers it does not have);
- ranks at an end of a resized axis that call differently (``--roles axis-ends``), whose calls
  may depend on how many ranks are before them;
- any other axis changed (tp, cp, ep, etp change per-rank shapes).

The program's own arguments may name the degree (``--parallelism.data_parallel_replicate_degree``):
a replay of the graph takes the program as the user runs it at the target.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pandas as pd

from prism.graph.build import op_table as ot
from prism.graph.build.templates import TemplateError
from prism.schemas.layout import LayoutError, ParallelLayout
from prism.schemas.layout_options import flag, given_differs, layout_of

RESIZABLE = ("dp", "dp_replicate", "dp_shard", "pp")
"""The degree options a program's graph can change (pp: ``prism.graph.build.pipeline_depth``)."""
SIZE_FREE_CALLS = frozenset({"all_reduce", "broadcast", "reduce", "barrier"})
"""Collectives whose bytes a rank sends do not depend on its group's size."""


def target_layout(given: Mapping[str, int | None], captured: ParallelLayout) -> ParallelLayout:
    """The layout a program's graph is built at: ``captured`` with the data-parallel degrees
    ``given`` (None: the capture's); any other degree that differs is refused."""
    fixed = given_differs({k: v for k, v in given.items() if k not in RESIZABLE}, captured)
    if fixed:
        raise TemplateError(
            f"the capture is of your program at {captured}; a program's graph keeps its captured tp, cp, ep "
            f"and etp (they change its per-rank shapes): build without {' '.join(fixed)} "
            "(or capture at the target layout)"
        )
    try:
        target = layout_of({k: given.get(k) for k in RESIZABLE}, base=captured)
    except LayoutError as e:
        raise TemplateError(str(e)) from e
    for axis in RESIZABLE:
        was, now = getattr(captured, axis), getattr(target, axis)
        if was != now and 1 in (was, now):
            raise TemplateError(
                f"{flag(axis)} {now}: the capture has {axis}={was}, and a program with one rank on an axis makes "
                f"none of the calls it makes with peers there; capture with {flag(axis)} {now}"
            )
    return target


def resized_kinds(captured: ParallelLayout, target: ParallelLayout) -> dict[str, tuple[int, int]]:
    """Each group kind whose size differs between the two layouts: (captured, target) sizes."""
    kinds = dict.fromkeys((*captured.bound_kinds(), "world"))
    return {
        kind: (_size(captured, kind), _size(target, kind))
        for kind in kinds
        if _size(captured, kind) != _size(target, kind)
    }


def _size(layout: ParallelLayout, kind: str) -> int:
    return layout.world_size if kind == "world" else layout.degree(kind)


def check_resizable(
    calls: Iterable[tuple[int, pd.DataFrame]],
    variant_axes: Iterable[str],
    captured: ParallelLayout,
    target: ParallelLayout,
) -> None:
    """Refuse binding the stage programs of the captured ranks' op tables ``calls`` ((rank, ops)
    each) to ``target``'s groups where a call's bytes depend on its group's size, or where a
    rank variant sits on a resized axis (``variant_axes``)."""
    resized = resized_kinds(captured, target)
    if not resized:
        return
    for axis in variant_axes:
        if axis in resized:
            raise TemplateError(
                f"ranks at an end of {axis} call differently from its others (a program's rank variants): how "
                f"they do may depend on the axis's size, so the graph keeps {axis}={resized[axis][0]}; capture "
                f"at {target}"
            )
    for rank, ops in calls:
        comm = ops[ops[ot.IS_COMM].astype(bool)]
        kinds = comm[ot.GROUP_LABEL].astype(str).str.split(".").str[0]
        ops_made = comm[ot.COMM_OP].astype(str)
        wrong = comm[kinds.isin(list(resized)) & ~ops_made.isin(SIZE_FREE_CALLS | {"send", "recv"})]
        if len(wrong):
            op, label = wrong[ot.COMM_OP].iloc[0], wrong[ot.GROUP_LABEL].iloc[0]
            kind = label.split(".")[0]
            was, now = resized[kind]
            raise TemplateError(
                f"rank {rank} calls {op} on group {label!r}, whose bytes a rank sends depend on the group's size "
                f"({was} ranks captured, {now} at {target}): its shapes change with the size (a sharded "
                f"data-parallel axis, FSDP's); capture at the target layout"
            )
