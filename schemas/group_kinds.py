"""Names of a layout's group kinds: which axes of the mesh a group spans. Pure Python, no torch.

A group kind is one axis of the mesh or several flattened into one group, in one of the mesh's
two systems of coordinates:

- the dense one, ``pp``, ``dp_replicate``, ``dp_shard``, ``cp``, ``tp`` (torchtitan's mesh);
- the expert one, ``pp``, ``dp_replicate``, ``edp``, ``ep``, ``etp``: the ranks of one replica's
  ``dp_shard`` x ``cp`` x ``tp`` flattened and split into expert data parallel (torchtitan's
  ``efsdp``), expert parallel and expert tensor parallel (Megatron's ``expert_tensor_parallel``).

A flattening is named by its axes, slowest first as above, joined by ``_``, with ``dp_replicate``
and ``dp_shard`` together written ``dp`` (HSDP's whole data-parallel group): ``dp_shard_cp``
(torchtitan's FSDP group with context parallel), ``dp_cp`` (Megatron's), ``dp_tp``. The whole
world is ``world``.
"""

from __future__ import annotations

from functools import cache

WORLD = "world"
DENSE_AXES: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""The dense mesh's axes, slowest first (torchtitan's order, and the order names are written in)."""
EXPERT_AXES: tuple[str, ...] = ("pp", "dp_replicate", "edp", "ep", "etp")
"""The expert mesh's axes, slowest first."""
REGION_AXES: tuple[str, ...] = ("dp_shard", "cp", "tp")
"""The dense axes the expert axes split (torchtitan's ep borrows them; Megatron's dp, cp and tp)."""
SPLIT_AXES: tuple[str, ...] = ("edp", "ep", "etp")
"""The expert axes that split the region, slowest first."""
DP = "dp"
DP_PARTS: tuple[str, ...] = ("dp_replicate", "dp_shard")


class KindError(ValueError):
    """A group kind's name that names no sub-mesh."""


def name_of(axes: tuple[str, ...] | list[str]) -> str:
    """The kind's name for a set of axes of one system (``("cp", "dp_shard")`` -> ``dp_shard_cp``)."""
    system = system_of(tuple(axes))
    ordered = [a for a in system if a in axes]
    if all(part in ordered for part in DP_PARTS):
        at = ordered.index(DP_PARTS[0])
        ordered[at : at + 2] = [DP]
    return "_".join(ordered)


@cache
def axes_of(name: str) -> tuple[str, ...]:
    """The axes a kind's name spans, slowest first; ``KindError`` for a name of no kind."""
    words, axes = name.split("_"), []
    known = set(DENSE_AXES) | set(EXPERT_AXES) | {DP}
    while words:
        pair = "_".join(words[:2])
        if len(words) > 1 and pair in known:
            axes.append(pair)
            del words[:2]
        elif words[0] in known:
            axes.append(words.pop(0))
        else:
            raise KindError(f"{name!r} names no group kind: its axes are among {', '.join(sorted(known))}")
    expanded = tuple(a for axis in axes for a in (DP_PARTS if axis == DP else (axis,)))
    if len(set(expanded)) != len(expanded):
        raise KindError(f"{name!r} names an axis twice")
    system = system_of(expanded)
    ordered = tuple(a for a in system if a in expanded)
    if name_of(ordered) != name:
        raise KindError(f"{name!r} is written {name_of(ordered)!r}")
    return ordered


def system_of(axes: tuple[str, ...]) -> tuple[str, ...]:
    """The system of coordinates (DENSE_AXES or EXPERT_AXES) that holds every axis of ``axes``."""
    for system in (DENSE_AXES, EXPERT_AXES):
        if all(a in system for a in axes):
            return system
    raise KindError(f"{', '.join(axes)} mix dense and expert axes other than pp and dp_replicate")
