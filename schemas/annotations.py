"""Grammar of the ``record_function`` names that mark blocks in a trace.

A mark is ``prism:<phase>`` followed by ``|key=value`` fields in a fixed key order, e.g.::

    prism:iter|iter=3
    prism:fwd|stage=1|mb=4                 forward of microbatch 4 on stage 1
    prism:fwd|stage=1|mb=4|layer=9         forward of (global) layer 9 inside it
    prism:fwd|stage=0|mb=4|part=embed      embedding / head / loss parts of a stage
    prism:bwd|stage=1|mb=4|layer=9
    prism:bwd|layer=9|part=weights         a run of layer 9's parameters' gradients alone
    prism:send|dir=fwd|stage=1|mb=4|peer=17   pipeline transfer posted to rank 17
    prism:recv|dir=bwd|stage=1|mb=4|peer=17
    prism:p2p_wait|stage=1                  waiting for the transfers just posted
    prism:grad_sync|bucket=2               DP gradient sync (bucket field on per-bucket marks)
    prism:optim                            optimizer step
    prism:comm|op=all_reduce|group=tp.3|pg=5|gseq=12|bytes=4096   one process-group call

``format_mark`` writes these names and ``parse_mark`` reads them back; nothing else in prism
builds or splits them by hand.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass, fields

PREFIX = "prism:"


class Phase(enum.StrEnum):
    """What a marked block means."""

    ITERATION = "iter"
    FORWARD = "fwd"
    BACKWARD = "bwd"
    SEND = "send"
    RECV = "recv"
    P2P_WAIT = "p2p_wait"
    GRAD_SYNC = "grad_sync"
    OPTIMIZER = "optim"
    COMM = "comm"


class Direction(enum.StrEnum):
    """Which way a pipeline transfer goes: activations forward or their gradients backward."""

    FORWARD = "fwd"
    BACKWARD = "bwd"


class Part(enum.StrEnum):
    """Pieces of a stage's forward/backward the layer marks do not tell: its non-layer parts, and
    runs of the weights' gradients apart from the rest of a backward pass."""

    EMBED = "embed"
    HEAD = "head"
    LOSS = "loss"
    WEIGHTS = "weights"
    """A backward run that computes parameters' gradients alone, from gradients an earlier run
    left at the nodes between (a split-backward pipeline schedule's weight pass)."""


@dataclass(frozen=True, kw_only=True)
class Mark:
    """One parsed annotation. Fields that do not apply to the phase are None."""

    phase: Phase
    """What the block is."""
    iter: int | None = None
    """Training iteration (ITERATION marks)."""
    dir: Direction | None = None
    """Pipeline transfer direction (SEND / RECV)."""
    stage: int | None = None
    """Pipeline stage the block runs on; a program's forward: which of the rank's root modules
    runs, where it has several (``prism.capture.program_phases``)."""
    mb: int | None = None
    """Microbatch index within the iteration."""
    layer: int | None = None
    """Global transformer-layer index."""
    part: Part | None = None
    """Embedding / head / loss piece of a stage."""
    peer: int | None = None
    """Global rank of the other side of a transfer."""
    bucket: int | None = None
    """Gradient bucket index (GRAD_SYNC)."""
    op: str | None = None
    """Process-group operation (COMM), e.g. all_reduce, send."""
    group: str | None = None
    """Group label (COMM): '<axis>.<index>' such as 'tp.3', or 'world', or 'g<name>'."""
    pg: str | None = None
    """Name of the process group (COMM), unique in the process: several groups may share a label
    (a program may make two groups of the same ranks, one for each backend or purpose)."""
    gseq: int | None = None
    """Per-group sequence number of the call (COMM)."""
    bytes: int | None = None
    """Payload bytes of the call on this rank (COMM)."""


BLOCK_PHASES = frozenset(Phase) - {Phase.ITERATION, Phase.COMM}
"""Phases whose marks open a block (strings compare equal to them: 'fwd' in BLOCK_PHASES)."""
_TRANSFERS = (Phase.SEND, Phase.RECV)

GLUE = "glue"
"""Per-phase timing key of a rank's own time outside every top-level block: zeroing gradients,
Python between the schedule's steps, the loss's read-back."""


def is_block(phase: str) -> bool:
    """Whether marks of ``phase`` open a block (iteration and comm marks do not; nor does glue)."""
    return phase in BLOCK_PHASES


def block_kind(phase: str, direction: str | None = None) -> str | None:
    """What kind of block a mark of ``phase`` opens, as templates and per-phase timings name it:
    the phase ('fwd', 'optim', ...), with the direction for a pipeline transfer ('send_fwd');
    None for iteration and comm marks and for anything that is no phase (glue)."""
    if phase not in BLOCK_PHASES:
        return None
    if phase in _TRANSFERS:
        return f"{Phase(phase).value}_{Direction(direction).value}"
    return Phase(phase).value


# Field order in names, and how to read each value back.
_FIELD_TYPES: dict[str, type] = {
    "iter": int,
    "dir": Direction,
    "stage": int,
    "mb": int,
    "layer": int,
    "part": Part,
    "peer": int,
    "bucket": int,
    "op": str,
    "group": str,
    "pg": str,
    "gseq": int,
    "bytes": int,
}
assert list(_FIELD_TYPES) == [f.name for f in fields(Mark)][1:], "keep _FIELD_TYPES in Mark's field order"


class MarkError(ValueError):
    """A name that starts with the prism prefix but does not follow the grammar."""


def format_mark(mark: Mark) -> str:
    """The record_function name of ``mark``."""
    parts = [PREFIX + mark.phase.value]
    for key in _FIELD_TYPES:
        value = getattr(mark, key)
        if value is None:
            continue
        text = value.value if isinstance(value, enum.Enum) else str(value)
        if "|" in text or "=" in text:
            raise MarkError(f"value {text!r} of {key} may not contain '|' or '='")
        parts.append(f"{key}={text}")
    return "|".join(parts)


def comm_mark_name(op: str, group: str | None, pg: str, gseq: int, nbytes: int) -> str:
    """``format_mark(Mark(phase=Phase.COMM, op=op, group=group, pg=pg, gseq=gseq, bytes=nbytes))``,
    named at every process-group call: the part fixed for an (op, group, pg) is formatted once (the
    whole Mark costs a call 2.8 µs, this 0.3 µs)."""
    return f"{_comm_mark_prefix(op, group, pg)}|gseq={gseq}|bytes={nbytes}"


@functools.cache
def _comm_mark_prefix(op: str, group: str | None, pg: str) -> str:
    # gseq and bytes are a mark's last two fields: appended, they read as format_mark writes them.
    return format_mark(Mark(phase=Phase.COMM, op=op, group=group, pg=pg))


def is_mark(name: str) -> bool:
    return name.startswith(PREFIX)


def parse_mark(name: str) -> Mark:
    """Inverse of ``format_mark``; raises MarkError on a malformed prism name."""
    if not is_mark(name):
        raise MarkError(f"not a prism mark: {name!r}")
    head, *pairs = name[len(PREFIX) :].split("|")
    try:
        phase = Phase(head)
    except ValueError:
        raise MarkError(f"unknown phase {head!r} in {name!r}") from None
    values: dict[str, object] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or key not in _FIELD_TYPES:
            raise MarkError(f"bad field {pair!r} in {name!r}")
        if values and _FIELD_ORDER[key] <= _FIELD_ORDER[next(reversed(values))]:
            raise MarkError(f"field {key} repeated or out of order in {name!r}")
        values[key] = _parse_value(key, text, name)
    return Mark(phase=phase, **values)


_FIELD_ORDER = {key: i for i, key in enumerate(_FIELD_TYPES)}
_INT = re.compile(r"-?[0-9]+")


def _parse_value(key: str, text: str, name: str) -> object:
    kind = _FIELD_TYPES[key]
    if kind is int and not _INT.fullmatch(text):
        raise MarkError(f"bad value for {key} in {name!r}")
    try:
        return kind(text)
    except ValueError:
        raise MarkError(f"bad value for {key} in {name!r}") from None


def try_parse_mark(name: str) -> Mark | None:
    """The mark named ``name``, or None for any name that is not a well-formed prism mark."""
    try:
        return parse_mark(name)
    except MarkError:
        return None


def group_label(axis: str, index: int) -> str:
    """Label of a layout group, e.g. ('tp', 3) -> 'tp.3'; the whole world is 'world'."""
    return "world" if axis == "world" else f"{axis}.{index}"
