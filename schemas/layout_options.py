"""A layout from the command line's degrees: one rule for every command that takes a layout.

An axis not given is the one the job already has: for a program's capture 1 (a program has no
parallelism it is not given), for the built-in GPT's its defaults, for a build the capture's.
``--dp D`` is the whole data-parallel degree; ``--dp-replicate R --dp-shard S`` give HSDP's two
levels (``--dp-shard S`` alone is ``--dp S``), and ``--dp`` given beside them must be their product.
"""

from __future__ import annotations

from collections.abc import Mapping

from prism.schemas.layout import LayoutError, ParallelLayout

DEGREES: tuple[str, ...] = ("tp", "pp", "dp", "dp_replicate", "dp_shard", "cp", "ep", "etp")
"""The degree options, as their dataclass field names (``--dp-replicate`` is ``dp_replicate``)."""
ONE = ParallelLayout(tp=1, pp=1, dp=1)
"""A program's base: every axis 1."""


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def layout_of(
    given: Mapping[str, int | None], base: ParallelLayout = ONE, order: str | None = None
) -> ParallelLayout:
    """The layout of ``given`` degrees (None where an option was not given), every other one
    ``base``'s; ``order`` None keeps ``base``'s."""
    unknown = set(given) - set(DEGREES)
    if unknown:
        raise LayoutError(f"unknown degrees {', '.join(sorted(unknown))}")
    for name in DEGREES:
        value = given.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise LayoutError(f"{flag(name)} must be a positive integer, got {value!r}")
    pick = {name: base_value(base, name) if given.get(name) is None else given[name] for name in DEGREES}
    if given.get("dp_shard") is not None:
        product = pick["dp_replicate"] * pick["dp_shard"]
        if given.get("dp") is not None and given["dp"] != product:
            raise LayoutError(
                f"--dp {given['dp']} is not --dp-replicate {pick['dp_replicate']} x --dp-shard {pick['dp_shard']} = "
                f"{product}; give --dp or its two parts"
            )
        pick["dp"] = product
    elif given.get("dp_replicate") is not None and given.get("dp") is None:
        pick["dp"] = pick["dp_replicate"] * base.dp_shard  # a new replica count over the same shards
    return ParallelLayout(
        tp=pick["tp"], pp=pick["pp"], dp=pick["dp"], cp=pick["cp"], dp_replicate=pick["dp_replicate"],
        ep=pick["ep"], etp=pick["etp"], order=base.order if order is None else order,
    )  # fmt: skip


def base_value(base: ParallelLayout, name: str) -> int:
    return base.dp_shard if name == "dp_shard" else getattr(base, name)


def given_differs(given: Mapping[str, int | None], layout: ParallelLayout) -> list[str]:
    """The options of ``given`` whose value is not ``layout``'s (as '--tp 4')."""
    return [f"{flag(n)} {v}" for n, v in given.items() if v is not None and v != base_value(layout, n)]
