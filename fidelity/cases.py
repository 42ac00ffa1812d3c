"""Cases of the fidelity benchmark: ``"tp=1 pp=2 dp=1 layers=4 hidden=128 ..."`` <-> GPTConfig.

A case names a model and a layout small enough to run every rank for real on this machine.
Keys are GPTConfig field names, plus the short forms ``seq`` (seq_len), ``mbs``
(micro_batch_size) and ``ffn`` (ffn_hidden). Fields a case leaves out keep GPTConfig's
defaults, except the degrees: tp, pp and dp default to 1 (GPTConfig's 8/16/64 could never run
fully here).
"""

from __future__ import annotations

import dataclasses
import random

from prism.capture.workloads.gpt.config import ConfigError, GPTConfig

ALIASES = {"seq": "seq_len", "mbs": "micro_batch_size", "ffn": "ffn_hidden"}
_SHORT = {v: k for k, v in ALIASES.items()}
_FIELDS = {f.name: f for f in dataclasses.fields(GPTConfig)}
_DEGREE_DEFAULTS = {"tp": 1, "pp": 1, "dp": 1}

_SMALL = "layers=4 hidden=128 heads=4 seq=64 mbs=2 microbatches=8"
_MEDIUM = "layers=4 hidden=256 heads=8 seq=64 mbs=2 microbatches=8"
_LAYOUTS = ("tp=2 pp=1 dp=1", "tp=1 pp=2 dp=1", "tp=1 pp=1 dp=2")
_BUILT_LARGER = "tp=1 pp=2 dp=1 layers=8 hidden=128 heads=4 seq=64 mbs=2 microbatches=8 captured_layers=6 captured_microbatches=4"
DEFAULT_CASES: tuple[str, ...] = (
    *(f"{layout} {model}" for model in (_SMALL, _MEDIUM) for layout in _LAYOUTS),
    _BUILT_LARGER,
)
"""World size 2 each: one process per core of a 2-core machine. The last one's graph is built for
8 layers and 8 microbatches from a capture of 6 and 4."""


class CaseError(ValueError):
    """A case string that does not name a valid GPTConfig; the message is one line."""


def _value(name: str, text: str) -> object:
    default = _FIELDS[name].default
    if name == "ffn_hidden":
        return None if text.lower() == "none" else int(text)
    if isinstance(default, bool):
        raise ValueError("booleans are not case fields")
    if isinstance(default, int):
        return int(text)
    if isinstance(default, float):
        return float(text)
    return text


CAPTURED_PREFIX = "captured_"
CAPTURED_FIELDS = ("dp", "layers", "microbatches")
"""What a case may capture smaller than its job (``captured_layers=4``): the build scales these
from a capture (``prism-build-graph --dp/--layers/--microbatches``), so such a case tests a graph
built for a layout the capture did not run against a real run of that layout."""


def _items(text: str) -> list[tuple[str, str, str]]:
    """(key, field name, raw value) of each key=value item."""
    items = []
    for item in text.split():
        key, sep, raw = item.partition("=")
        if not sep or not raw:
            raise CaseError(f"case item {item!r} is not key=value")
        items.append((key, ALIASES.get(key, key), raw))
    return items


def captured_config(text: str) -> GPTConfig:
    """What the case's slice captures: its job with the ``captured_*`` fields it names."""
    target = parse_case(text)
    changes: dict[str, object] = {}
    for key, _, raw in _items(text):
        if not key.startswith(CAPTURED_PREFIX):
            continue
        name = key.removeprefix(CAPTURED_PREFIX)
        if name not in CAPTURED_FIELDS:
            known = ", ".join(CAPTURED_PREFIX + f for f in CAPTURED_FIELDS)
            raise CaseError(f"unknown case key {key!r}; a case may capture smaller only by {known}")
        try:
            changes[name] = int(raw)
        except ValueError:
            raise CaseError(f"case key {key!r}: cannot read {raw!r} as a {name} value") from None
    try:
        return dataclasses.replace(target, **changes)
    except ConfigError as e:
        raise CaseError(f"case {text!r}, as captured: {e}") from None


def parse_case(text: str) -> GPTConfig:
    """The GPTConfig of a case string (space-separated key=value pairs): the job its real run runs
    and its graph is built for (``captured_*`` keys say what its slice captures instead:
    ``captured_config``)."""
    values: dict[str, object] = dict(_DEGREE_DEFAULTS)
    for key, name, raw in _items(text):
        if key.startswith(CAPTURED_PREFIX):
            continue
        if name not in _FIELDS:
            known = ", ".join(sorted([*_FIELDS, *ALIASES]))
            raise CaseError(f"unknown case key {key!r}; known keys: {known}")
        try:
            values[name] = _value(name, raw)
        except ValueError:
            raise CaseError(f"case key {key!r}: cannot read {raw!r} as a {name} value") from None
    try:
        return GPTConfig(**values)
    except ConfigError as e:
        raise CaseError(f"case {text!r}: {e}") from None


_ALWAYS = ("tp", "pp", "dp", "layers", "hidden", "heads", "seq_len", "micro_batch_size", "microbatches")


def case_label(config: GPTConfig, captured: GPTConfig | None = None) -> str:
    """Canonical case string: layout and model size, then every other field off its default, then
    the ``captured_*`` fields where ``captured`` differs from ``config``."""
    defaults = GPTConfig(**_DEGREE_DEFAULTS)
    names = [
        *_ALWAYS,
        *(n for n in _FIELDS if n not in _ALWAYS and getattr(config, n) != getattr(defaults, n)),
    ]
    label = " ".join(f"{_SHORT.get(n, n)}={getattr(config, n)}" for n in names)
    if captured is not None:
        smaller = [n for n in CAPTURED_FIELDS if getattr(captured, n) != getattr(config, n)]
        label += "".join(f" {CAPTURED_PREFIX}{n}={getattr(captured, n)}" for n in smaller)
    return label


# -- random cases --------------------------------------------------------------------------------
RANDOM_LAYOUTS = _LAYOUTS
RANDOM_CHOICES: dict[str, tuple] = {
    "hidden": (64, 128, 192, 256),
    "heads": (2, 4, 8),
    "layers": (2, 4, 6, 8),
    "seq": (32, 64, 128),
    "mbs": (1, 2, 4),
    "microbatches": (1, 2, 4, 8),
    "vocab": (1024, 4096),
}
"""Each field's values, drawn uniformly and independently (``random_cases``)."""
BF16_SHARE = 0.25
"""Share of random cases in bfloat16 (the rest float32)."""
MAX_CASE_GFLOP = 3.0
"""Training FLOPs of one rank's iteration (6 x parameters x tokens) above which a draw is redrawn,
so that every case runs in seconds on a 2-core CPU (bfloat16, slower there, a quarter of it)."""


def _case_gflop(config: GPTConfig) -> float:
    params = 12 * config.layers * config.hidden**2 + config.vocab * config.hidden
    tokens = config.micro_batch_size * config.seq_len * config.microbatches
    return 6 * params * tokens / (config.tp * config.pp) / 1e9


def random_cases(count: int, seed: int) -> list[str]:
    """``count`` cases drawn with ``seed``: a world-2 layout (tp=2, pp=2 or dp=2, uniformly), then
    each field of ``RANDOM_CHOICES`` uniformly and bfloat16 in ``BF16_SHARE`` of them, the fields
    drawn again while GPTConfig rejects them for the layout (heads that do not divide hidden or
    tp, fewer microbatches than stages), a head is narrower than 16, or the case is heavier than
    ``MAX_CASE_GFLOP``. The same seed gives the same cases."""
    rng = random.Random(seed)
    return [_draw(rng, rng.choice(RANDOM_LAYOUTS)) for _ in range(count)]


def _draw(rng: random.Random, layout: str) -> str:
    while True:
        fields = " ".join(f"{key}={rng.choice(values)}" for key, values in RANDOM_CHOICES.items())
        dtype = "bfloat16" if rng.random() < BF16_SHARE else "float32"
        try:
            config = parse_case(f"{layout} {fields} dtype={dtype}")
        except CaseError:
            continue
        budget = MAX_CASE_GFLOP / (4 if dtype == "bfloat16" else 1)
        if config.hidden // config.heads >= 16 and _case_gflop(config) <= budget:
            return case_label(config)
