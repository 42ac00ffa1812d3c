"""DistributedDataParallel's gradient all-reduces in a program's iteration, re-planned for another
layer count.

DDP's reducer copies each gradient into its bucket from a hook on the parameter's gradient
accumulation (one ``READY`` unit a parameter, last parameter first) and all-reduces a bucket
from the hook of the gradient that fills it, which splits that unit around the call. Its buckets
span layers, so the backward runs of a captured layer stack differ by where a bucket closed: the
calls are taken out, their units joined again, before the layer passes are found
(``strip_bucket_calls``), and the target's buckets, planned by DDP's rule
(``prism.schemas.grad_buckets.plan_buckets`` with the recorded caps), put back after the
gradients that fill them (``insert_bucket_calls``). The rule is checked on the capture first: the planned
buckets of the captured parameters must be the calls the capture made, after the same copies, with
the same payloads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from prism.graph.build import op_table as ot
from prism.graph.build.templates import TemplateError
from prism.schemas.annotations import Phase
from prism.schemas.grad_buckets import Bucket, plan_buckets

READY = "torch::autograd::AccumulateGrad"
"""A parameter's gradient accumulated: its unit's name ends so, whole
(``autograd::engine::evaluate_function: ...``) or as the piece before a bucket call."""
WHOLE = f"autograd::engine::evaluate_function: {READY}"


@dataclass(frozen=True, kw_only=True)
class BucketCaps:
    """How a program's DDP fills its buckets."""

    bucket_bytes: int
    first_bucket_bytes: int
    itemsize: int
    """Bytes per gradient element."""

    def plan(self, numels: tuple[int, ...]) -> list[Bucket]:
        sizes = [n * self.itemsize for n in numels]
        return plan_buckets(sizes, numels, self.bucket_bytes, self.first_bucket_bytes)


@dataclass(frozen=True)
class StrippedCalls:
    """The bucket calls taken out of an iteration."""

    template: pd.Series
    """A captured call's unit, which each target call copies."""
    waited_after: int
    """Position (in the stripped units) of the unit after which the calls were waited for."""


def _filling_gradients(buckets: list[Bucket], parameters: int) -> list[int]:
    """For each bucket, the ordinal of the gradient that fills it (ready last parameter first)."""
    return [parameters - 1 - min(b.params) for b in buckets]


def _ready(units: pd.DataFrame) -> np.ndarray:
    return np.flatnonzero(units[ot.NAME].astype(str).str.endswith(READY).to_numpy())


def _joined(units: pd.DataFrame, calls: np.ndarray) -> tuple[np.ndarray, pd.DataFrame]:
    """``units`` without ``calls``, each call's gradient accumulation joined again: the pieces from
    the one named ``READY`` up to the call make one unit, named as the others, their times and
    memory summed. Returns the kept positions and the units."""
    names = units[ot.NAME].astype(str).to_numpy()
    units = units.copy()
    keep = np.ones(len(units), bool)
    for call in calls:
        piece = int(call) - 1
        while piece >= 0 and names[piece] != READY and not units[ot.IS_COMM].iloc[piece]:
            piece -= 1
        if piece < 0 or names[piece] != READY:
            raise TemplateError(
                "a DistributedDataParallel bucket call is not made from a gradient's accumulation: --layers "
                "cannot re-plan its buckets; capture at the target layer count"
            )
        pieces = slice(piece, int(call))
        at = units.columns.get_loc
        units.iloc[piece, at(ot.DUR_NS)] = int(
            units[ot.DUR_NS].iloc[pieces].sum() + units[ot.GAP_NS].iloc[piece + 1 : int(call)].sum()
        )
        for column in (ot.ALLOC_BYTES, ot.FREE_BYTES):
            units.iloc[piece, at(column)] = int(units[column].iloc[pieces].sum())
        units.iloc[piece, at(ot.NAME)] = WHOLE
        keep[piece + 1 : int(call) + 1] = False
    return keep, units


def strip_bucket_calls(
    units: pd.DataFrame,
    iterations: list[pd.DataFrame],
    waits: dict[int, list[int]],
    caps: BucketCaps,
    numels: tuple[int, ...],
) -> tuple[pd.DataFrame, list[pd.DataFrame], dict[int, list[int]], StrippedCalls]:
    """``units``, ``iterations`` and ``waits`` without DDP's bucket calls, and what putting the
    target's back needs. Raises TemplateError where the capture's calls are not those DDP's rule
    plans for the captured parameters."""
    backward = units[ot.PHASE].astype(str).to_numpy() == str(Phase.BACKWARD)
    is_call = units[ot.IS_COMM].to_numpy(dtype=bool) & units[ot.IS_ASYNC].to_numpy(dtype=bool) & backward
    calls = np.flatnonzero(is_call)
    keep, joined = _joined(units, calls)
    ready = _ready(joined[keep].reset_index(drop=True))
    if len(ready) != len(numels) or not len(calls):
        raise TemplateError(
            f"the program's DistributedDataParallel accumulated {len(ready)} gradients for {len(numels)} parameters "
            f"and made {len(calls)} bucket calls in the profiled iteration: its buckets cannot be re-planned for "
            "--layers (unused parameters, no_sync in every microbatch); capture at the target layer count"
        )
    new = np.cumsum(keep) - 1  # each position's unit, or the kept one before it, in the stripped units
    planned = caps.plan(numels)
    made = [
        (int(np.searchsorted(ready, new[c], side="right") - 1), int(units[ot.BYTES].iloc[c])) for c in calls
    ]
    expected = list(
        zip(_filling_gradients(planned, len(numels)), (b.numel * caps.itemsize for b in planned), strict=True)
    )
    if made != expected:
        raise TemplateError(
            f"the program's DistributedDataParallel all-reduced {[b for _, b in made]} bytes and its caps plan "
            f"{[b for _, b in expected]}: its buckets do not follow the parameters' reverse order, so --layers "
            "cannot re-plan them; capture at the target layer count"
        )
    waited = {call: at for at, called in waits.items() for call in called}
    last_wait = max(waited.get(int(c), int(c)) for c in calls)
    stripped_waits: dict[int, list[int]] = {}
    for at, called in waits.items():
        rest = [int(new[c]) for c in called if keep[c]]
        if rest:
            stripped_waits.setdefault(int(new[at]), []).extend(rest)
    return (
        joined[keep].reset_index(drop=True),
        [it[keep].reset_index(drop=True) for it in iterations],
        stripped_waits,
        StrippedCalls(template=units.iloc[int(calls[0])].copy(), waited_after=int(new[last_wait])),
    )


def insert_bucket_calls(
    units: pd.DataFrame,
    waits: dict[int, list[int]],
    stripped: StrippedCalls,
    waited_after: int,
    caps: BucketCaps,
    numels: tuple[int, ...],
) -> tuple[pd.DataFrame, dict[int, list[int]]]:
    """``units`` (the target's iteration, its waits ``waits``) with the target's bucket calls,
    each after the gradient that fills its bucket, all waited for after unit ``waited_after``
    (where the captured calls were) or the last of them."""
    ready = _ready(units)
    if len(ready) != len(numels):
        raise TemplateError(
            f"the target's iteration accumulates {len(ready)} gradients for {len(numels)} parameters: DDP's buckets "
            "cannot be placed"
        )
    buckets = caps.plan(numels)
    after = [int(ready[k]) for k in _filling_gradients(buckets, len(numels))]
    order, rows, inserted = [], [], []
    previous = 0
    for at, bucket in sorted(zip(after, buckets, strict=True), key=lambda pair: pair[0]):
        order.extend(range(previous, at + 1))
        previous = at + 1
        row = stripped.template.reindex(units.columns, fill_value=-1)  # a column the capture had not: none
        row[ot.BYTES] = bucket.numel * caps.itemsize
        row[ot.LAYER] = units[ot.LAYER].iloc[at]  # made in the layer whose gradient filled it
        inserted.append(len(order))
        order.append(len(units) + len(rows))
        rows.append(row)
    order.extend(range(previous, len(units)))
    order = np.array(order)
    new = np.empty(len(units), np.int64)
    kept_at = np.flatnonzero(order < len(units))
    new[order[kept_at]] = kept_at
    calls = pd.DataFrame(rows)[units.columns].astype(units.dtypes.to_dict())
    out = pd.concat([units, calls], ignore_index=True).iloc[order].reset_index(drop=True)
    shifted = {int(new[at]): [int(new[c]) for c in called] for at, called in waits.items()}
    wait_at = max(int(new[waited_after]), inserted[-1])
    shifted.setdefault(wait_at, []).extend(inserted)
    return out, shifted
