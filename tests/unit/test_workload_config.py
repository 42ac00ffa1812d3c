"""GPTConfig validation: every impossible model/layout combination is a ConfigError naming its cause."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from prism.capture.workloads.gpt.config import ConfigError, GPTConfig
from prism.schemas.layout import ParallelLayout

SMALL = dict(layers=4, hidden=64, heads=4, seq_len=8, vocab=128, microbatches=2, tp=2, pp=2, dp=2)


def test_defaults_are_valid() -> None:
    cfg = GPTConfig()
    assert cfg.layout == ParallelLayout(tp=8, pp=16, dp=64)
    assert cfg.ffn == 4 * cfg.hidden
    assert cfg.layers_per_stage * cfg.pp == cfg.layers
    assert cfg.head_dim * cfg.heads == cfg.hidden


def test_derived_quantities() -> None:
    cfg = GPTConfig(**SMALL, ffn_hidden=96)
    assert cfg.ffn == 96
    assert [cfg.stage_layers(s) for s in range(2)] == [range(0, 2), range(2, 4)]
    assert cfg.with_layout(tp=4, pp=1, dp=1).layout == ParallelLayout(tp=4, pp=1, dp=1)
    with pytest.raises(ConfigError, match="heads"):
        cfg.with_layout(tp=8, pp=1, dp=1)  # 4 heads over 8 tp ranks


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        (dict(heads=3, hidden=66), r"heads \(3\) must be divisible by tp \(2\)"),
        (dict(hidden=66, heads=4), r"hidden \(66\) must be divisible by heads \(4\)"),
        (dict(layers=5), r"layers \(5\) must be divisible by pp \(2\)"),
        (dict(microbatches=3, pp=4, layers=8), r"microbatches \(3\) must be at least pp \(4\)"),
        (dict(vocab=127), r"vocab \(127\) must be divisible by tp \(2\)"),
        (dict(ffn_hidden=99), r"ffn hidden \(99\) must be divisible by tp \(2\)"),
        (
            dict(hidden=66, heads=2, ffn_hidden=None, tp=4, vocab=128),
            r"heads \(2\) must be divisible by tp \(4\)",
        ),
        (dict(dtype="float8"), r"dtype .*'float8'"),
        (dict(dtype="torch.float32"), r"dtype .*'torch.float32'"),
        (dict(device="tpu"), r"device .*'tpu'"),
        (dict(device="cuda:0"), r"device .*'cuda:0'"),
        (dict(grad_bucket_mb=0.0), r"grad bucket size must be positive"),
    ],
)
def test_invalid_combinations(change: dict, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        GPTConfig(**{**SMALL, **change})


INT_FIELDS = [
    "layers",
    "hidden",
    "heads",
    "seq_len",
    "vocab",
    "micro_batch_size",
    "microbatches",
    "tp",
    "pp",
    "dp",
]


@pytest.mark.parametrize("name", INT_FIELDS)
@pytest.mark.parametrize("bad", [0, -2, True, 2.0, "2", None])
def test_non_positive_or_non_int_fields(name: str, bad: object) -> None:
    with pytest.raises(ConfigError, match=rf"^{name} must be a positive integer, got {bad!r}"):
        GPTConfig(**{**SMALL, name: bad})


@pytest.mark.parametrize("bad", [0, -8, 8.0])
def test_bad_ffn_hidden(bad: object) -> None:
    with pytest.raises(ConfigError, match="ffn"):
        GPTConfig(**{**SMALL, "ffn_hidden": bad})


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_frozen() -> None:
    with pytest.raises(AttributeError):
        GPTConfig().tp = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    "cfg", [GPTConfig(), GPTConfig(**SMALL, ffn_hidden=96, dtype="bfloat16", device="cuda")]
)
def test_to_dict_from_dict_round_trip(cfg: GPTConfig) -> None:
    data = cfg.to_dict()
    assert set(data) == {f.name for f in fields(GPTConfig)}
    assert GPTConfig.from_dict(data) == cfg
    assert GPTConfig.from_dict(json.loads(json.dumps(data))) == cfg


def test_from_dict_rejects_unknown_fields_and_validates() -> None:
    with pytest.raises(ConfigError, match="unknown GPT config fields: bogus, zeta"):
        GPTConfig.from_dict({**GPTConfig().to_dict(), "zeta": 1, "bogus": 2})
    with pytest.raises(ConfigError, match="layers"):
        GPTConfig.from_dict({**GPTConfig().to_dict(), "layers": 33})
    assert GPTConfig.from_dict({"tp": 2}) == GPTConfig(tp=2)
