"""A program's iteration at another layer count than the one captured, from its layer marks.

The units of one iteration carry the layer block each ran in (``prism.capture.program_layers``;
-1 outside every block). A **pass** is one walk over the stage's layer stack: its forward
(each captured layer once, in ascending order) or its backward (descending), one **run** of
units per layer. A run is a layer's own units and the unmarked ones between them and the next
layer's (a collective the program issues between two blocks belongs to the block before). A
program with gradient accumulation makes a forward and a backward pass per microbatch. A rank
that holds several pipeline stages (an interleaved schedule's) has a stack in each, its units
naming the stage (``ot.STAGE``), and each pass walks one stage's. A split backward (a zero-bubble
schedule's) makes two passes a microbatch: its inputs' gradients, descending, then its weights'
runs, each marked with its parameters' layer (``Part.WEIGHTS``), in the order the stage holds them.

Runs near either end of a pass differ from the rest: the first block waits for its own
parameters where later ones find them prefetched, the last prefetches nothing, and memory freed
at a pass's edge falls into its first or last runs. The **steady** runs are the inner ones that
repeat exactly (same units, calls, payloads and memory); a pass for ``layers`` layers keeps the
captured runs before and after them and repeats one steady run for every layer between. A pass
with fewer than two alike inner runs has no steady run to repeat: the capture needs more layers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd

from prism.graph.build import op_table as ot
from prism.graph.build.bucket_calls import BucketCaps, insert_bucket_calls, strip_bucket_calls
from prism.graph.build.parameter_loops import LoopFrees, optimizer_step, per_parameter_glue
from prism.graph.build.templates import TemplateError
from prism.schemas.annotations import Part, Phase

ORIGIN = "origin"
"""Column of an expanded iteration: the position of the captured unit each unit copies."""

RUN_SIGNATURE = (ot.NAME, ot.IS_COMM, ot.COMM_OP, ot.GROUP_LABEL, ot.BYTES, ot.ALLOC_BYTES, ot.FREE_BYTES)
"""What two runs must share, unit by unit, to stand for each other."""

MIN_STEADY = 2
"""Alike inner runs a pass needs: one inner run alone cannot tell a steady layer from an edge."""


class Repeating(Protocol):
    """Runs of units of which a stretch of alike ones repeats: a pass's layers, a schedule's
    microbatch steps."""

    @property
    def runs(self) -> tuple[tuple[int, int], ...]: ...

    @property
    def steady(self) -> tuple[int, int]: ...


@dataclass(frozen=True)
class LayerPass:
    """One walk over the layer stack: its runs, as [start, stop) unit positions, in pass order."""

    runs: tuple[tuple[int, int], ...]
    descending: bool
    """A backward pass: its first run is the last layer's."""
    steady: tuple[int, int]
    """[first, last + 1) of its steady runs, positions in ``runs``."""
    stage: int = -1
    """The stage whose stack it walks, as its units' marks name it (-1 where the rank holds one)."""

    @property
    def start(self) -> int:
        return self.runs[0][0]

    @property
    def stop(self) -> int:
        return self.runs[-1][1]

    @property
    def edge_runs(self) -> int:
        """Runs kept as captured: those before and after the steady ones."""
        first, last = self.steady
        return first + len(self.runs) - last


def unit_signatures(units: pd.DataFrame, columns: Sequence[str] = RUN_SIGNATURE) -> np.ndarray:
    """Each unit's ``columns`` (by default ``RUN_SIGNATURE``), as one string."""
    return units[list(columns)].astype(str).agg("|".join, axis=1).to_numpy()


def _steady(signature: np.ndarray, runs: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The longest stretch of alike inner runs (the earliest of equals), or None if none has
    ``MIN_STEADY`` runs."""
    signatures = [tuple(signature[a:b]) for a, b in runs[1:-1]]
    best, first = None, 0
    for i in range(1, len(signatures) + 1):
        if i == len(signatures) or signatures[i] != signatures[first]:
            if i - first >= MIN_STEADY and (best is None or i - first > best[1] - best[0]):
                best = (first + 1, i + 1)
            first = i
    return best


def pass_runs(units: pd.DataFrame) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The forward and backward passes of one iteration's units, as the capture marked them (a
    forward call of a root module, a run of the autograd engine): each one's phase, and its first
    and one-past-last unit positions. A pass ends where units of another phase, or of none,
    begin, or another mark does (two runs of the engine in a row: a zero-bubble schedule's last
    backward passes)."""
    phase = units[ot.PHASE].astype(str).to_numpy()
    at = np.flatnonzero(np.isin(phase, PASS_PHASES))
    if not len(at):
        return [], np.zeros(0, np.int64), np.zeros(0, np.int64)
    mark = units[ot.OUTER_MARK].to_numpy()[at] if ot.OUTER_MARK in units else np.zeros(len(at), np.int64)
    begins = at[np.r_[True, (np.diff(at) > 1) | (phase[at][1:] != phase[at][:-1]) | (mark[1:] != mark[:-1])]]
    ends = np.r_[at[np.searchsorted(at, begins[1:]) - 1], at[-1]] + 1
    return [str(phase[b]) for b in begins], begins, ends


def through_layers(units: pd.DataFrame, begins: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each pass (``pass_runs``' bounds) runs a unit of a layer block."""
    layer = units[ot.LAYER].to_numpy() if ot.LAYER in units else np.full(len(units), -1)
    marked_before = np.r_[0, np.cumsum(layer >= 0)]
    return marked_before[ends] > marked_before[begins]


def weight_runs(units: pd.DataFrame, begins: np.ndarray) -> np.ndarray:
    """Whether each pass (``pass_runs``' bounds) is a run of parameters' gradients alone (a
    split backward's weight run, ``Part.WEIGHTS``)."""
    if ot.PART not in units or not len(begins):
        return np.zeros(len(begins), dtype=bool)
    return units[ot.PART].astype(str).to_numpy()[begins] == str(Part.WEIGHTS)


def _check_weight_runs(units: pd.DataFrame) -> None:
    """Refuse backward runs through no layer that no backward run through the layers follows and
    that are no marked weight run: a split backward's weight gradients captured without the
    marks that name their layers, whose work grows with the layers but names none. (Runs through
    no layer before the stage's own, a loss backpropagated in chunks, are the loss's; weight runs
    of parameters in no layer block, a head's, stay as captured.)"""
    passes, begins, ends = pass_runs(units)
    if not (units[ot.LAYER].to_numpy() >= 0).any():
        return  # no layer marks: refused as such
    touches, backward = through_layers(units, begins, ends) | weight_runs(units, begins), str(Phase.BACKWARD)
    for i, p in enumerate(passes):
        if p == backward and not touches[i] and (i + 1 == len(passes) or passes[i + 1] != backward):
            raise TemplateError(
                "the backward passes run through no layer after the stage's own (a split backward's weight "
                "gradients, captured without the marks that name their layers): that work grows with the layers "
                "but names none, so --layers cannot repeat it; capture again, or at the target layer count"
            )


def _stage_of(units: pd.DataFrame) -> np.ndarray:
    """Each unit's stage as its marks name it (-1 where the rank holds one stage)."""
    if ot.STAGE not in units:
        return np.full(len(units), -1, dtype=np.int64)
    return units[ot.STAGE].to_numpy(dtype=np.int64)


def stage_stacks(units: pd.DataFrame) -> dict[int, np.ndarray]:
    """The layers each stage's units run (one stage, -1, where the rank holds one), each a
    consecutive stack. Raises TemplateError where one is not."""
    layer, stage = units[ot.LAYER].to_numpy(dtype=np.int64), _stage_of(units)
    marked = layer >= 0
    stacks = {int(s): np.unique(layer[marked & (stage == s)]) for s in np.unique(stage[marked])}
    for s, stack in stacks.items():
        if stack[-1] - stack[0] + 1 != len(stack):
            which = "the stage's" if s < 0 else f"stage {s}'s"
            raise TemplateError(
                f"{which} layers {stack.tolist()} are not consecutive: cannot change their count"
            )
    return stacks


def layer_passes(units: pd.DataFrame) -> list[LayerPass]:
    """The passes of one iteration's units over their layers (none if no unit has a layer); where
    the rank holds several stages (an interleaved schedule's, its marks name each), a pass walks
    one stage's stack.

    Raises TemplateError where the layers do not run as passes: a layer that runs twice in a
    row, out of order, or a pass that leaves one out (layers skipped)."""
    layer = units[ot.LAYER].to_numpy(dtype=np.int64)
    marked = np.flatnonzero(layer >= 0)
    if not len(marked):
        return []
    stacks = stage_stacks(units)
    # A run begins at each marked unit whose stage, layer, phase or part differs from the marked
    # unit before it (a forward pass's last layer is the next backward pass's first).
    phase = units[ot.PHASE].astype(str).to_numpy()[marked]
    part = units[ot.PART].astype(str).to_numpy()[marked] if ot.PART in units else np.full(len(marked), "")
    stage = _stage_of(units)[marked]
    key = layer[marked]
    # A split backward's weight runs follow its input gradients' run: another pass, though both
    # are backward and the one ends on the layer the other begins with.
    changes = (
        (key[1:] != key[:-1])
        | (phase[1:] != phase[:-1])
        | (stage[1:] != stage[:-1])
        | (part[1:] != part[:-1])
    )
    begins = marked[np.r_[True, changes]]
    ends = np.r_[begins[1:], marked[-1] + 1]
    # A run that ends a pass stops at its own last unit; the unmarked units after it are not its.
    last_own = np.array([marked[marked < end][-1] + 1 for end in ends])
    order, of_stage = layer[begins], _stage_of(units)[begins]
    signature = unit_signatures(units)
    passes, at = [], 0
    while at < len(begins):
        s = int(of_stage[at])
        stack = stacks[s]
        ascending, descending = stack.tolist(), stack[::-1].tolist()
        step = order[at : at + len(stack)].tolist()
        if step not in (ascending, descending) or (of_stage[at : at + len(stack)] != s).any():
            raise TemplateError(
                f"the layers run as {order.tolist()}: a pass over layers {stack[0]}-{stack[-1]} in order "
                "(forward ascending, backward descending) is needed to change their count"
            )
        at_end = at + len(stack)
        runs = [(int(begins[i]), int(ends[i])) for i in range(at, at_end - 1)]
        runs.append((int(begins[at_end - 1]), int(last_own[at_end - 1])))
        steady = _steady(signature, runs)
        if steady is None:
            raise TemplateError(
                f"a pass over the captured {len(stack)} layers has no {MIN_STEADY} alike inner layers to repeat"
                + _unlike(units, runs[1:-1])
            )
        passes.append(
            LayerPass(
                runs=tuple(runs), descending=step == descending and len(stack) > 1, steady=steady, stage=s
            )
        )
        at = at_end
    return passes


def _unlike(units: pd.DataFrame, inner: list[tuple[int, int]]) -> str:
    """Why ``inner`` runs are not alike, as the end of a refusal: inner layers that run the same
    units with other payloads or memory (a router's token counts decide each layer's), or too
    few layers to tell the edges from the rest."""
    names = {tuple(units[ot.NAME].iloc[a:b]) for a, b in inner}
    if len(inner) < MIN_STEADY or len(names) > 1:
        return (
            " (the first and last layers of a pass differ from the rest): capture with more layers, 5 or more"
        )
    differ = [
        column
        for column in RUN_SIGNATURE
        if len({tuple(units[column].iloc[a:b].astype(str)) for a, b in inner}) > 1
    ]
    calls = units.iloc[inner[0][0] : inner[0][1]]
    calls = sorted(set(calls.loc[calls[ot.IS_COMM].astype(bool), ot.COMM_OP].astype(str)))
    return (
        f": its inner layers run the same units but differ in {', '.join(differ)}"
        + (f" (calls: {', '.join(calls)})" if calls and ot.BYTES in differ else "")
        + ", so each layer's own data decides them (in a mixture of experts, the tokens routed through it) and none stands for another; "
        "capture at the target layer count"
    )


def expand_layers(units: pd.DataFrame, layers: int, first: Mapping[int, int] | None = None) -> pd.DataFrame:
    """``units`` (one iteration, positions 0..n-1) with every pass walking ``layers`` layers: its
    edge runs as captured, one steady run repeated between them. Each unit's layer is renumbered
    from its stage's ``first`` (keyed as ``stage_stacks``; the stage's first captured layer if
    None); ``ORIGIN`` gives the captured position each unit copies."""
    units = units.reset_index(drop=True)
    return _expanded(units, layer_passes(units), layers, first)


def _expanded(
    units: pd.DataFrame, passes: list[LayerPass], layers: int, first: Mapping[int, int] | None
) -> pd.DataFrame:
    """``expand_layers`` of ``units`` whose passes are ``passes``."""
    if not passes:
        raise TemplateError("the capture marks no layer block in the stage's units: cannot change its layers")
    stacks = stage_stacks(units)
    if first is None:
        first = {s: int(stack[0]) for s, stack in stacks.items()}
    if set(first) != set(stacks):
        raise TemplateError(
            f"the stages the units run ({sorted(stacks)}) are not those the target numbers ({sorted(first)})"
        )
    need = max(p.edge_runs for p in passes) + 1
    if layers < need:
        raise TemplateError(
            f"--layers {layers}: the captured passes keep {need - 1} edge layers as captured and repeat one "
            f"between them, so at least {need}"
        )
    pieces: list[np.ndarray] = []
    layer_of: list[np.ndarray] = []
    at = 0
    for p in passes:
        pieces.append(np.arange(at, p.start))
        layer_of.append(units[ot.LAYER].to_numpy()[at : p.start])
        lo, hi = p.steady
        sources = [*range(lo), *([lo] * (layers - p.edge_runs)), *range(hi, len(p.runs))]
        for position, source in enumerate(sources):
            a, b = p.runs[source]
            pieces.append(np.arange(a, b))
            index = layers - 1 - position if p.descending else position
            own = units[ot.LAYER].to_numpy()[a:b] >= 0
            layer_of.append(np.where(own, first[p.stage] + index, -1))
        at = p.stop
    pieces.append(np.arange(at, len(units)))
    layer_of.append(units[ot.LAYER].to_numpy()[at:])
    origin = np.concatenate(pieces)
    out = units.iloc[origin].reset_index(drop=True)
    out[ot.LAYER] = np.concatenate(layer_of).astype(np.int64)
    out[ORIGIN] = origin
    return out


def kept_per_layer(units: pd.DataFrame, passes: list[LayerPass]) -> int:
    """Bytes one more layer keeps past the iteration's end: what its steady runs allocate and do
    not free (0 where a layer frees what it allocates: its activations; a gradient it leaves for
    the optimizer to free is kept)."""
    net = (units[ot.ALLOC_BYTES] - units[ot.FREE_BYTES]).to_numpy(dtype=np.int64)
    return int(sum(net[slice(*p.runs[p.steady[0]])].sum() for p in passes))


@dataclass(frozen=True)
class LayerTarget:
    """A program's stage at another layer count than the one captured."""

    layers: int
    """Layers the stage holds (in each of its stages, where the rank holds several)."""
    first_layers: Mapping[int, int]
    """The number of the first layer (its units' ``LAYER``) of each of the rank's stages, keyed
    as its marks name them (``stage_stacks``: -1 where it holds one)."""
    parameter_sources: tuple[int, ...]
    """For each parameter of the stage at ``layers``, in order, the captured parameter it copies
    (``prism.graph.build.retarget.parameter_sources``)."""
    parameter_elements: tuple[int, ...]
    """Elements of each captured parameter."""
    freed_of_layer: Callable[[int, int], tuple[np.ndarray, np.ndarray]]
    """Per row of the captured rank's op table (by ``SEQ``), what it frees of the blocks of a
    stage's layer (stage and layer given), in its span and in its gap
    (``prism.graph.build.normalize.freed_of_layer``)."""
    layer_bytes: int
    """Bytes of one layer block's parameters as the rank holds them (its gradients' size)."""
    parameter_stages: tuple[int, ...] = ()
    """The stage of each captured parameter, keyed as ``first_layers`` (empty where the rank
    holds one)."""
    bucket_caps: BucketCaps | None = None
    """How the program's DistributedDataParallel fills its gradient buckets (None: it has none)."""
    freed_of_rows: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None
    """The same of the blocks the rows given as a mask allocated
    (``prism.graph.build.normalize.freed_of_rows``); None: the loops over parameters free what
    the unit each copies freed."""
    rows: int = 0
    """The captured rank's op table's length."""

    @property
    def target_elements(self) -> tuple[int, ...]:
        """Elements of each parameter at the target count."""
        return tuple(self.parameter_elements[i] for i in self.parameter_sources)


PASS_PHASES = (str(Phase.FORWARD), str(Phase.BACKWARD))
"""Phases whose calls are the program's forward and backward work (FSDP's gathers and scatters
of its root module, tensor parallel's all-reduces): their payloads are those of the activations
or of the modules they belong to, not of the whole stack."""


def _check_glue_calls(units: pd.DataFrame, layer_bytes: int) -> None:
    """Refuse a call outside the forward and backward passes (between them, in the optimizer
    step) that carries at least one layer's parameters: a gradient all-reduce made by hand, a
    sharded optimizer's gathers, whose payloads grow with the layers in a way one capture does not
    show. A loss's or a gradient norm's all-reduce is far smaller."""
    outside = ~units[ot.PHASE].astype(str).isin(PASS_PHASES).to_numpy()
    calls = outside & units[ot.IS_COMM].to_numpy(dtype=bool) & (units[ot.BYTES].to_numpy() >= layer_bytes)
    if calls.any():
        at = units[calls].iloc[0]
        raise TemplateError(
            f"the program's {at[ot.COMM_OP]} on {at[ot.GROUP_LABEL]} in its {at[ot.PHASE]} phase carries "
            f"{int(at[ot.BYTES]):,} bytes, at least one layer's parameters ({layer_bytes:,}): its payload grows with "
            "the layers (gradients synchronized by hand, a sharded optimizer), which --layers cannot re-plan; "
            "capture at the target layer count"
        )


def _steady_layers(units: pd.DataFrame, passes: list[LayerPass]) -> dict[int, int]:
    """For each stage, a layer whose runs are steady in every pass over its stack, the
    middlemost: its blocks pass to and from steady neighbours only, so what the units outside
    the layers free of them is what it keeps."""
    layer = units[ot.LAYER].to_numpy()
    common: dict[int, set[int]] = {}
    for p in passes:
        lo, hi = p.steady
        steady = {int(layer[p.runs[r][0]]) for r in range(lo, hi)}
        common[p.stage] = common.get(p.stage, steady) & steady
    if not all(common.values()):
        raise TemplateError(
            "no layer is steady in every pass (forward and backward): capture with more layers to change their count"
        )
    return {s: sorted(c)[len(c) // 2] for s, c in common.items()}


def _kept_frees(
    units: pd.DataFrame,
    passes: list[LayerPass],
    iterations: list[pd.DataFrame],
    target: LayerTarget,
) -> np.ndarray:
    """Per captured position outside every run: what it frees of one steady layer's blocks of
    each stage (what one more layer in every stage keeps). Raises TemplateError where that is not
    what a stage's steady layers keep."""
    outside = _outside_runs(len(units), passes)
    total = np.zeros(len(units), dtype=np.int64)
    for s, layer in _steady_layers(units, passes).items():
        kept_at = outside | _pass_ends(units, [p for p in passes if p.stage == s], layer)
        frees = np.where(kept_at, frees_by_position(iterations, target.freed_of_layer(s, layer)), 0)
        kept = kept_per_layer(units, [p for p in passes if p.stage == s])
        if int(frees.sum()) != kept:
            raise TemplateError(
                f"a layer keeps {kept:,} bytes past its runs and the units outside the layers free {int(frees.sum()):,} "
                "of them: where the rest is freed is not known, so another layer count's memory would be wrong; "
                "capture with more layers (5 or more a stage) or at the target layer count"
            )
        total += frees
    return total


def _carried_per_layer(
    units: pd.DataFrame, passes: list[LayerPass], iterations: list[pd.DataFrame], target: LayerTarget
) -> int:
    """What a steady layer's forward of each stage allocates in one iteration and the next
    iteration frees: activations held across the iteration's end, in the static bytes (a
    pipeline's last stage whose activations the program's losses keep until its next step). The
    forward's alone: gradients and optimizer state are the parameters' (``LayerTarget``'s
    static change). Nothing where one iteration was traced or frees are not traced."""
    if len(iterations) < 2 or target.freed_of_rows is None:
        return 0
    first = iterations[0]
    layer, stage = first[ot.LAYER].to_numpy(), _stage_of(first)
    forward = (first[ot.PHASE].astype(str) == str(Phase.FORWARD)).to_numpy()
    carried = 0
    for s, steady in _steady_layers(units, passes).items():
        rows = np.zeros(target.rows, bool)
        rows[first[ot.SEQ].to_numpy()[(layer == steady) & (stage == s) & forward]] = True
        carried += int(frees_by_position(iterations[1:2], target.freed_of_rows(rows)).sum())
    return carried


def frees_by_position(iterations: list[pd.DataFrame], freed: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per position of an iteration, what the op table's rows free (``freed``: in their span and
    in the gap before them, per row by ``SEQ``): the median over the steady iterations, a gap's
    at the end of the unit before it, as the stage program places a gap's frees."""
    inside, in_gap = freed
    per_iteration = []
    for iteration in iterations[1:] or iterations:
        seq = iteration[ot.SEQ].to_numpy()
        at = inside[seq].astype(np.int64)
        at[:-1] += in_gap[seq][1:]
        at[0] += in_gap[seq][0]
        per_iteration.append(at)
    return np.median(per_iteration, axis=0).astype(np.int64)


def _loop_frees(iterations: list[pd.DataFrame], target: LayerTarget) -> LoopFrees | None:
    """What the units of a loop over parameters (its groups, each unit a copy of a captured one
    outside the passes: its ``ORIGIN``) free of the group before it's blocks, traced by
    address: the blocks of every other group at once, each parity in turn (a group frees
    nothing a later one allocates)."""
    if target.freed_of_rows is None:
        return None
    freed_of_rows = target.freed_of_rows

    def freed(positions: np.ndarray) -> np.ndarray:
        mask = np.zeros(target.rows, bool)
        for iteration in iterations:
            mask[iteration[ot.SEQ].to_numpy()[positions]] = True
        return frees_by_position(iterations, freed_of_rows(mask))

    def traced(units: pd.DataFrame, groups: np.ndarray) -> np.ndarray:
        captured = units[ORIGIN].to_numpy()[groups]
        even, odd = (freed(captured[parity::2].ravel())[captured] for parity in (0, 1))
        return np.where((np.arange(len(groups)) % 2 == 0)[:, None], odd, even)

    return traced


def _pass_ends(units: pd.DataFrame, passes: list[LayerPass], layer: int) -> np.ndarray:
    """The units of each pass's last run, where it is an edge run two or more layers from
    ``layer``: copied once, as the units outside the runs are, and no neighbour handing blocks to
    or from ``layer``. What it frees of ``layer``'s blocks is freed as the pass ends, for every
    layer (a split backward's weight runs, each layer's leftovers freed as the last one ends)."""
    ends = np.zeros(len(units), bool)
    of = units[ot.LAYER].to_numpy()
    for p in passes:
        a, b = p.runs[-1]
        if p.steady[1] < len(p.runs) and abs(int(of[a]) - layer) >= 2:
            ends[a:b] = True
    return ends


def _outside_runs(size: int, passes: list[LayerPass]) -> np.ndarray:
    """Of ``size`` units, those in no run of ``passes``."""
    outside = np.ones(size, bool)
    for p in passes:
        for a, b in p.runs:
            outside[a:b] = False
    return outside


def _alike_calls(passes: Sequence[Repeating]) -> dict[int, list[int]]:
    """For each unit of a repeated steady run, the units at the same place of its other steady
    runs (which its copies stand for)."""
    alike: dict[int, list[int]] = {}
    for p in passes:
        lo, hi = p.steady
        a, b = p.runs[lo]
        for offset in range(b - a):
            alike[a + offset] = [p.runs[r][0] + offset for r in range(lo + 1, hi)]
    return alike


def mapped_waits(
    expanded: pd.DataFrame, waits: dict[int, list[int]], passes: Sequence[Repeating]
) -> dict[int, list[int]]:
    """``waits`` (the unit after which each asynchronous call is waited for) at the expanded
    positions. A copied call is waited for as far on as its captured original, or one its copy
    stands for (the same call of another steady run: the last before the edge runs waits in the
    first of them), where the unit there copies its wait's or one at its place in another
    steady run; else at its captured wait's
    first copy after it; else at the iteration's end."""
    waited_at = {call: at for at, calls in waits.items() for call in calls}
    alike = _alike_calls(passes)
    origin = expanded[ORIGIN].to_numpy()
    out: dict[int, list[int]] = {}
    for i in np.flatnonzero(np.isin(origin, list(waited_at))):
        call = int(origin[i])
        j = None
        for source in [call, *alike.get(call, ())]:
            w = waited_at.get(source)
            at = None if w is None else i + (w - source)
            # The unit there must copy the wait's unit or one at its place in another steady run
            # (a unit alike in name only, a layer earlier, is not it).
            if (
                at is not None
                and 0 <= at < len(origin)
                and (origin[at] == w or w in alike.get(origin[at], ()))
            ):
                j = at
                break
        if j is None:
            later = np.flatnonzero((origin == waited_at[call]) & (np.arange(len(origin)) >= i))
            j = int(later[0]) if len(later) else len(origin) - 1
        out.setdefault(int(j), []).append(int(i))
    return out


def retarget_units(
    units: pd.DataFrame, iterations: list[pd.DataFrame], waits: dict[int, list[int]], target: LayerTarget
) -> tuple[pd.DataFrame, dict[int, list[int]], int]:
    """A stage program's units (one iteration, timed) and their waits at ``target``'s layer count,
    and the bytes it holds across iterations besides the captured ones and its parameters': its
    passes walk the target's layers (``expand_layers``), the units that free what a layer keeps
    (gradients a ``zero_grad`` drops) free it for every layer, and the units that run for each
    parameter and the optimizer step run for the target's parameters
    (``prism.graph.build.parameter_loops``); DDP's bucket all-reduces are those of the target's
    buckets (``prism.graph.build.bucket_calls``); what a layer's blocks hold into the next
    iteration (``_carried_per_layer``) is held for every layer."""
    units = units.reset_index(drop=True)
    caps = target.bucket_caps
    if caps is not None:
        units, iterations, waits, stripped = strip_bucket_calls(
            units, iterations, waits, caps, target.parameter_elements
        )
    _check_weight_runs(units)
    passes = layer_passes(units)
    expanded = _expanded(units, passes, target.layers, target.first_layers)
    captured_layers = len(passes[0].runs)
    if any(len(p.runs) != captured_layers for p in passes):
        raise TemplateError(
            "the rank's stages hold different layer counts: --layers gives each an equal share; "
            "capture at the target layer count"
        )
    in_step = (units[ot.PHASE].astype(str) == str(Phase.OPTIMIZER)).to_numpy()
    _check_glue_calls(units, target.layer_bytes)
    frees = _kept_frees(units, passes, iterations, target)
    origin = expanded[ORIGIN].to_numpy()
    more = target.layers - captured_layers
    held = more * _carried_per_layer(units, passes, iterations, target)
    expanded[ot.FREE_BYTES] = expanded[ot.FREE_BYTES].to_numpy() + more * frees[origin]
    glue = _outside_runs(len(units), passes) & ~in_step
    sources, elements = target.parameter_sources, target.parameter_elements
    traced = _loop_frees(iterations, target)
    expanded = per_parameter_glue(
        expanded, glue[origin], sources, len(elements), traced, target.parameter_stages
    )
    expanded = optimizer_step(expanded, in_step[expanded[ORIGIN].to_numpy()], sources, elements, traced)
    waits = mapped_waits(expanded, waits, passes)
    if caps is None:
        return expanded, waits, held
    # Where the captured calls were waited for: after the copy of that unit, or, where it ran once a
    # parameter and has no copy, after the last unit copied from before it.
    anchor = int(np.flatnonzero(expanded[ORIGIN].to_numpy() <= stripped.waited_after)[-1])
    return (*insert_bucket_calls(expanded, waits, stripped, anchor, caps, target.target_elements), held)
