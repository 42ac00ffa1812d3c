"""Join PyTorch Execution Trace nodes to Kineto ops: input shapes and types per op.

The key is the ET node attribute ``rf_id``, equal to Kineto's ``args["Record function id"]``
of the same op (``External id`` is a different counter). ET nodes carry no timestamps, so this
is the only join there is.

Speed: an ET of the default capture is tens of MiB of JSON, and ``json.loads`` of it, then
freeing the millions of objects, costs seconds. torch's writer puts each node's ``inputs`` on
one line and its ``attrs`` (rf_id first) two lines below, so one regular expression finds
(inputs, rf_id) of every node an order of magnitude faster and only the wanted nodes' inputs
are parsed. The fast path is taken only when it matched every node
(one per ``"attrs":`` key) of a file that ends like a complete ET; anything else falls back
to a full ``json`` parse, which also reports corrupt files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from prism.graph.traces.kineto import NormalizeError, read_json_file

RF_ID_ATTR = "rf_id"

_NODE = re.compile(
    r'\n *"inputs": (.*),\n.*\n *"attrs": \[\{"name": "rf_id", "type": "uint64", "value": (\d+)'
)
_ENCODER = json.JSONEncoder(separators=(",", ":"))  # one instance: json.dumps builds one per call


@dataclass(frozen=True)
class EtInputs:
    """What the op table keeps of one ET node."""

    shapes: str
    """Compact JSON of ``inputs.shapes``."""
    types: str
    """Compact JSON of ``inputs.types``."""


def read_et_inputs(path: Path, rf_ids: Iterable[int]) -> dict[int, EtInputs]:
    """Inputs of the ET nodes whose rf_id is one of ``rf_ids``."""
    wanted = set(rf_ids)
    fast = _read_fast(path, wanted)
    return fast if fast is not None else _read_full(path, wanted)


def _read_fast(path: Path, wanted: set[int]) -> dict[int, EtInputs] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # the full parse says what is wrong
    tail = text[-200:]
    if not text.lstrip().startswith("{") or not tail.rstrip().endswith("}") or '"finish_ts"' not in tail:
        return None
    matches = _NODE.findall(text)
    if len(matches) != text.count('"attrs": '):
        return None
    found: dict[int, EtInputs] = {}
    try:
        for inputs, rf in matches:
            if int(rf) in wanted:
                found[int(rf)] = _inputs(json.loads(inputs))
    except (json.JSONDecodeError, KeyError, TypeError):
        return None
    return found


def _read_full(path: Path, wanted: set[int]) -> dict[int, EtInputs]:
    data = read_json_file(path)
    nodes = data.get("nodes")
    if not isinstance(nodes, list):
        raise NormalizeError(f"{path}: no nodes list: not an Execution Trace")
    found: dict[int, EtInputs] = {}
    try:
        for node in nodes:
            rf = _rf_id(node["attrs"])
            if rf in wanted:
                found[rf] = _inputs(node["inputs"])
    except (KeyError, TypeError, ValueError) as e:
        raise NormalizeError(f"{path}: malformed ET node ({type(e).__name__}: {e})") from e
    return found


def _inputs(inputs: dict) -> EtInputs:
    return EtInputs(shapes=_ENCODER.encode(inputs["shapes"]), types=_ENCODER.encode(inputs["types"]))


def _rf_id(attrs: list[dict]) -> int | None:
    for a in attrs:  # rf_id is the first attribute in torch 2.13; scan in case that moves
        if a["name"] == RF_ID_ATTR:
            return int(a["value"])
    return None
