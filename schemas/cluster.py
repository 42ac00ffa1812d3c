"""The cluster spec: links, latencies and efficiencies the comm cost model prices collectives with.

Declared once here; written as TOML (``prism-calibrate`` writes the ``local`` one, presets ship in
``schemas/clusters/*.toml``) and embedded as a dict in graph.parquet metadata. Units are in the
names: bytes per second, seconds. Bandwidths are *per GPU, one direction*.

    name = "h100-ib"
    gpus_per_node = 8
    intra_bandwidth_bytes_per_s = 4.5e+11
    ...
    [bandwidth_efficiency]
    all_reduce = 0.8
    [latency_factor]
    barrier = 1.0
    [busy_call]          # optional: a collective's time with its members computing, over idle,
    65536 = 3.8          # by call size (bytes)
    [wake_compute]       # optional: extra time of a rank's compute after it waited this many µs
    1200 = 0.00008       # for a peer, over the same compute back to back
    [measured.all_reduce]  # optional: measured one-node times, group size -> [bytes, seconds]
    2 = [[512, 0.0017], [65536, 0.0012], [1048576, 0.0031]]

Specs that earlier versions wrote may hold ``cold_call`` and ``cold_call_by_size`` tables (a
collective's extra latency by the compute before it): they are read and ignored, as that price
did not pay on the fidelity runs (docs/fidelity.md, "Mechanisms").
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

LOCAL_ENV = "PRISM_LOCAL_CLUSTER"
"""Environment variable naming the calibrated ``local`` spec file."""
DEFAULT_LOCAL_PATH = Path("~/.cache/prism/local.toml")
"""Where ``prism-calibrate`` writes the ``local`` spec unless told otherwise."""

OP_CLASSES: tuple[str, ...] = (
    "all_reduce",  # ring algorithm
    "all_reduce_tree",  # NCCL double binary tree, chosen when cheaper than the ring
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "gather",
    "scatter",
    "barrier",
    "p2p",  # send / recv
)
"""Keys of the per-class tables; a class not listed has factor 1.0 (no host work)."""

_FLOAT_FIELDS = (
    "intra_bandwidth_bytes_per_s",
    "intra_latency_s",
    "inter_bandwidth_bytes_per_s",
    "inter_latency_s",
    "base_latency_s",
)
_FACTOR_TABLES = ("bandwidth_efficiency", "latency_factor", "host_ns_per_byte")
_TABLES = (*_FACTOR_TABLES, "busy_call", "wake_compute")
RETIRED_KEYS = ("cold_call", "cold_call_by_size")
"""Keys of specs that earlier versions wrote, read and ignored (the module docstring)."""
Points = tuple[tuple[int, float], ...]
"""(bytes, seconds) pairs of one op class and group size, by increasing bytes."""


class ClusterSpecError(ValueError):
    """A cluster spec that cannot be used (bad value, unknown key, missing file)."""


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """Interconnect of a homogeneous GPU cluster, as the α-β comm model sees it."""

    name: str
    """Short name, e.g. 'h100-ib' or 'local'."""
    gpus_per_node: int
    """GPUs (ranks) per node; global rank r sits on node r // gpus_per_node."""
    intra_bandwidth_bytes_per_s: float
    """Intra-node bandwidth per GPU, one direction (NVLink/NVSwitch; loopback for 'local')."""
    intra_latency_s: float
    """Latency of one intra-node hop (α of one ring step)."""
    inter_bandwidth_bytes_per_s: float
    """Network bandwidth per GPU, one direction (one NIC per GPU)."""
    inter_latency_s: float
    """Latency of one inter-node hop."""
    base_latency_s: float = 0.0
    """Fixed cost of every call with two or more members (launch and set-up), added once."""
    bandwidth_efficiency: Mapping[str, float] = field(default_factory=dict, hash=False)
    """Achieved fraction of the link bandwidth per op class (see OP_CLASSES); default 1.0.
    Usually at most 1; a calibrated spec may exceed 1 where an op beats the p2p reference."""
    latency_factor: Mapping[str, float] = field(default_factory=dict, hash=False)
    """Multiplier of the per-hop latency per op class; default 1.0."""
    host_ns_per_byte: Mapping[str, float] = field(default_factory=dict, hash=False)
    """CPU time (ns) a member's process spends per byte it contributes to a collective of the
    class, on its own threads, while the call runs: gloo on CPU copies and reduces the payload
    there, beside the program's compute (NCCL's work is on the device). ``prism-calibrate``
    measures it; CPU captures given the spec and CPU replays make each rank do that much work for
    each virtual collective (``prism.peers.host_work``). Empty: calls cost the host nothing."""
    busy_call: Mapping[str, float] = field(default_factory=dict, hash=False)
    """How many times its price a collective takes when every member computes all through it,
    by call size (bytes, integer keys); interpolated linearly in log(bytes), flat outside the
    sizes, never below 1. A call its rank computes beside for part of its flight is priced in
    between (``prism.peers.comm_model``). Empty: calls cost the same whatever their members do
    while they run. On a CPU test bed a gloo call's exchanges run on threads that must take a
    core from the members' compute (``prism-calibrate --busy-rounds`` measures it: 2-7x on a
    2-vCPU VM); NCCL's run on the device."""
    wake_compute: Mapping[str, float] = field(default_factory=dict, hash=False)
    """Extra time (s) of the compute a rank does right after it waited (µs, integer keys) for a
    peer, over the same compute back to back; interpolated linearly, 0 at 0 µs, flat past the
    last point. The simulation adds it after every wait for a late peer, the wait a capture's
    virtual peers, never late, did not make (``prism.graph.sim.engine``). Empty: compute costs
    the same after a wait. On a shared CPU host a rank blocked for a few ms loses its core and
    its caches (``prism-calibrate --wake-gaps-ms`` measures it: 0.1 ms after a 2 ms wait, 0.65 ms
    after 16 ms on a 2-vCPU VM); a GPU's kernels do not pay it."""
    measured: Mapping[str, Mapping[int, Points]] = field(default_factory=dict, hash=False)
    """Measured durations of calls within one node: op class -> group size -> (bytes, seconds)
    points. Where a call's group sits on one node and its class and size are listed, the comm
    model interpolates these points linearly in bytes (flat below the first, the α-β slope past
    the last) instead of the α-β line: a local machine's small collectives do not follow one
    (``prism-calibrate --table`` writes them, at the job's sizes with ``--sizes``)."""
    notes: str = ""
    """Where the numbers come from (free text)."""

    def busy_factor(self, nbytes) -> np.ndarray:
        """The ``busy_call`` factor at ``nbytes`` (an array welcome); 1 without a table."""
        n = np.asarray(nbytes, dtype=np.float64)
        if not self.busy_call:
            return np.ones_like(n)
        sizes = sorted((int(k), v) for k, v in self.busy_call.items())
        logs = np.log2([k for k, _ in sizes])
        factor = np.interp(np.log2(np.maximum(n, 1.0)), logs, [v for _, v in sizes])
        return np.maximum(factor, 1.0)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ClusterSpecError(f"name must be a non-empty string, got {self.name!r}")
        gpn = self.gpus_per_node
        if isinstance(gpn, bool) or not isinstance(gpn, int) or gpn < 1:
            raise ClusterSpecError(f"gpus_per_node must be a positive integer, got {gpn!r}")
        for name in _FLOAT_FIELDS:
            value = _number(name, getattr(self, name))
            positive = name.endswith("bandwidth_bytes_per_s")
            if (value <= 0) if positive else (value < 0):
                need = "positive" if positive else "non-negative"
                raise ClusterSpecError(f"{name} must be {need}, got {value!r}")
            object.__setattr__(self, name, value)
        for table in _FACTOR_TABLES:
            object.__setattr__(self, table, _check_table(table, getattr(self, table)))
        object.__setattr__(self, "busy_call", _check_busy_call(self.busy_call))
        object.__setattr__(self, "wake_compute", _check_gap_table("wake_compute", self.wake_compute))
        object.__setattr__(self, "measured", _check_measured(self.measured))

    def efficiency(self, op_class: str) -> float:
        return self.bandwidth_efficiency.get(op_class, 1.0)

    def latency_scale(self, op_class: str) -> float:
        return self.latency_factor.get(op_class, 1.0)

    # -- serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        for table in _TABLES:
            out[table] = dict(out[table])
        out["measured"] = {
            cls: {str(p): [list(point) for point in points] for p, points in by_size.items()}
            for cls, by_size in self.measured.items()
        }
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterSpec:
        data = {key: value for key, value in data.items() if key not in RETIRED_KEYS}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ClusterSpecError(f"unknown cluster spec key(s): {', '.join(unknown)}")
        missing = sorted(f.name for f in fields(cls) if f.name not in data and _required(f.name))
        if missing:
            raise ClusterSpecError(f"cluster spec lacks required key(s): {', '.join(missing)}")
        return cls(**data)

    def to_toml(self) -> str:
        data = self.to_dict()
        nested = (*_TABLES, "measured")
        lines = [f"{key} = {_toml_value(value)}" for key, value in data.items() if key not in nested]
        for table in _TABLES:
            lines += ["", f"[{table}]"]
            items = data[table].items()
            order = _by_int if all(str(k).isdecimal() for k in data[table]) else None  # µs, bytes
            lines += [f"{key} = {_toml_value(value)}" for key, value in sorted(items, key=order)]
        for cls, by_size in data["measured"].items():
            lines += ["", f"[measured.{cls}]"]
            for p, points in sorted(by_size.items(), key=_by_int):
                pairs = ", ".join(f"[{n}, {_toml_value(t)}]" for n, t in points)
                lines.append(f"{p} = [{pairs}]")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_toml(cls, text: str) -> ClusterSpec:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ClusterSpecError(f"not valid TOML: {e}") from None
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | os.PathLike) -> ClusterSpec:
        path = Path(path).expanduser()
        try:
            text = path.read_text()
        except OSError as e:
            raise ClusterSpecError(f"cannot read cluster spec {path}: {e.strerror or e}") from None
        try:
            return cls.from_toml(text)
        except ClusterSpecError as e:
            raise ClusterSpecError(f"{path}: {e}") from None

    def save(self, path: str | os.PathLike) -> Path:
        """Write the TOML beside ``path`` and rename it into place; returns the path written."""
        path = Path(path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.to_toml())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


def _required(name: str) -> bool:
    return name not in ("base_latency_s", "notes", "measured", *_TABLES)


def _by_int(item: tuple[str, object]) -> int:
    return int(item[0])


def wake_points_ns(table: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """A ``wake_compute`` table (µs -> s) as (wait ns, extra ns) arrays from (0, 0), for the engine."""
    table = _check_gap_table("wake_compute", table)
    points = sorted((int(k) * 1000, v * 1e9) for k, v in table.items() if int(k) > 0)
    waits = np.array([0] + [w for w, _ in points], np.float64)
    extra = np.array([0.0] + [e for _, e in points], np.float64)
    return waits, extra


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ClusterSpecError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _check_table(table: str, values: object) -> MappingProxyType[str, float]:
    if not hasattr(values, "items"):
        raise ClusterSpecError(f"{table} must be a table of op class -> number, got {values!r}")
    checked: dict[str, float] = {}
    for key, value in values.items():  # type: ignore[union-attr]
        if key not in OP_CLASSES:
            raise ClusterSpecError(
                f"unknown op class {key!r} in {table}; expected one of {', '.join(OP_CLASSES)}"
            )
        number = _number(f"{table}.{key}", value)
        if (number <= 0) if table == "bandwidth_efficiency" else (number < 0):
            raise ClusterSpecError(
                f"{table}.{key} must be {'positive' if table == 'bandwidth_efficiency' else 'non-negative'}, got {number!r}"
            )
        checked[key] = number
    return MappingProxyType(checked)


def _check_gap_table(where: str, values: object) -> MappingProxyType[str, float]:
    if not hasattr(values, "items"):
        raise ClusterSpecError(f"{where} must be a table of µs -> seconds, got {values!r}")
    checked: dict[str, float] = {}
    for key, value in values.items():  # type: ignore[union-attr]
        if not str(key).isdecimal():
            raise ClusterSpecError(f"{where} keys are whole microseconds, got {key!r}")
        checked[str(int(key))] = _number(f"{where}.{key}", value)
    return MappingProxyType(checked)


def _check_busy_call(values: object) -> MappingProxyType[str, float]:
    if not hasattr(values, "items"):
        raise ClusterSpecError(f"busy_call must be a table of bytes -> factor, got {values!r}")
    checked: dict[str, float] = {}
    for key, value in values.items():  # type: ignore[union-attr]
        if not str(key).isdecimal() or int(key) < 1:
            raise ClusterSpecError(f"busy_call keys are call sizes in bytes (1 or more), got {key!r}")
        factor = _number(f"busy_call.{key}", value)
        if factor <= 0:
            raise ClusterSpecError(f"busy_call.{key} must be positive, got {factor!r}")
        checked[str(int(key))] = factor
    return MappingProxyType(dict(sorted(checked.items(), key=_by_int)))


def _check_measured(values: object) -> MappingProxyType[str, MappingProxyType[int, Points]]:
    if not hasattr(values, "items"):
        raise ClusterSpecError(
            f"measured must be a table of op class -> group size -> points, got {values!r}"
        )
    checked: dict[str, MappingProxyType[int, Points]] = {}
    for cls, by_size in values.items():  # type: ignore[union-attr]
        if cls not in OP_CLASSES or cls == "all_reduce_tree":
            known = ", ".join(c for c in OP_CLASSES if c != "all_reduce_tree")
            raise ClusterSpecError(f"unknown op class {cls!r} in measured; expected one of {known}")
        if not hasattr(by_size, "items"):
            raise ClusterSpecError(f"measured.{cls} must be a table of group size -> points")
        sizes: dict[int, Points] = {}
        for p, points in by_size.items():
            where = f"measured.{cls}.{p}"
            if not str(p).isdecimal() or int(p) < 2:
                raise ClusterSpecError(f"measured.{cls} keys are group sizes of 2 or more, got {p!r}")
            sizes[int(p)] = _check_points(where, points)
        checked[cls] = MappingProxyType(dict(sorted(sizes.items())))
    return MappingProxyType(checked)


def _check_points(where: str, points: object) -> Points:
    if not isinstance(points, list | tuple) or not points:
        raise ClusterSpecError(f"{where} must be a non-empty list of [bytes, seconds] pairs, got {points!r}")
    pairs = []
    for point in points:
        if not isinstance(point, list | tuple) or len(point) != 2:
            raise ClusterSpecError(f"{where}: each point is [bytes, seconds], got {point!r}")
        n, t = point
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ClusterSpecError(f"{where}: bytes must be a non-negative integer, got {n!r}")
        t = _number(f"{where} at {n} bytes", t)
        if t < 0:
            raise ClusterSpecError(f"{where}: seconds must be non-negative, got {t!r} at {n} bytes")
        pairs.append((n, t))
    pairs.sort()
    if len({n for n, _ in pairs}) != len(pairs):
        raise ClusterSpecError(f"{where}: each size may appear once")
    return tuple(pairs)


def _toml_value(value: object) -> str:
    if isinstance(value, str):
        # JSON escapes are TOML basic-string escapes; TOML also forbids a raw DEL.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back to the same float
    return str(value)


# -- presets ---------------------------------------------------------------------------------


def local_path() -> Path:
    """The calibrated spec file: $PRISM_LOCAL_CLUSTER, else ~/.cache/prism/local.toml."""
    return Path(os.environ.get(LOCAL_ENV) or DEFAULT_LOCAL_PATH).expanduser()


def preset_names() -> tuple[str, ...]:
    """Packaged presets, then 'local'."""
    shipped = resources.files("prism.schemas") / "clusters"
    names = sorted(p.name.removesuffix(".toml") for p in shipped.iterdir() if p.name.endswith(".toml"))
    return (*names, "local")


def preset(name: str) -> ClusterSpec:
    """A packaged spec by name (e.g. 'h100-ib'), or 'local' as written by prism-calibrate."""
    if name == "local":
        path = local_path()
        if not path.is_file():
            raise ClusterSpecError(
                f"no calibrated local cluster spec at {path}; run `prism-calibrate` first "
                f"(or set {LOCAL_ENV} to a spec file)"
            )
        return ClusterSpec.load(path)
    shipped = resources.files("prism.schemas") / "clusters" / f"{name}.toml"
    if not shipped.is_file():
        raise ClusterSpecError(f"unknown cluster preset {name!r}; known: {', '.join(preset_names())}")
    return ClusterSpec.from_toml(shipped.read_text())


def load_cluster(name_or_path: str) -> ClusterSpec:
    """A preset by name, or a cluster spec TOML file."""
    path = Path(name_or_path)
    return ClusterSpec.load(path) if path.suffix == ".toml" or path.is_file() else preset(name_or_path)
