"""Deterministic sharded init: a shard is exactly the slice of the full tensor; a sharded,
pipelined model is exactly the full model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from prism.capture.workloads.gpt import init, rng
from prism.capture.workloads.gpt.config import GPTConfig
from prism.capture.workloads.gpt.init import ParamFactory, Shard, uniform_tensor
from prism.capture.workloads.gpt.model import GPTStage
from prism.capture.workloads.gpt.tensor_parallel import TPGroup


def splitmix64_reference(key: int, index: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = np.uint64(key) + (index.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def test_splitmix64_matches_unsigned_reference() -> None:
    index = np.concatenate([np.arange(1000), np.array([2**31, 2**40 + 7, 2**62 - 1])]).astype(np.int64)
    for key in (0, 1, rng.derive_key(1234, "layers.3.mlp.fc1.weight"), 2**64 - 1):
        got = rng.splitmix64(key, torch.from_numpy(index)).numpy().view(np.uint64)
        assert np.array_equal(got, splitmix64_reference(key, index))


def test_uniform_values_are_in_range_and_spread() -> None:
    u = rng.uniform(rng.derive_key(1, "x"), torch.arange(100_000))
    assert 0.0 <= u.min() and u.max() < 1.0
    assert abs(u.mean().item() - 0.5) < 0.01


def full(name: str, shape: tuple[int, ...], **kw) -> torch.Tensor:
    return uniform_tensor(seed=7, name=name, full_shape=shape, bound=0.5, dtype=torch.float64, **kw)


@pytest.mark.parametrize(
    ("shape", "dim", "count"), [((12, 10), 0, 2), ((12, 10), 1, 2), ((8, 12), 1, 4), ((12,), 0, 3)]
)
def test_shards_are_slices_of_the_full_tensor(shape: tuple[int, ...], dim: int, count: int) -> None:
    whole = full("w", shape)
    shards = [full("w", shape, shard=Shard(dim=dim, index=i, count=count)) for i in range(count)]
    assert torch.equal(torch.cat(shards, dim=dim), whole)
    assert whole.abs().max() <= 0.5


def test_generation_in_small_slabs_gives_the_same_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    shard = Shard(dim=1, index=1, count=2)
    expected = full("w", (9, 6), shard=shard)
    monkeypatch.setattr(init, "_SLAB_ELEMENTS", 5)
    assert torch.equal(full("w", (9, 6), shard=shard), expected)


def test_values_depend_on_seed_and_name_only() -> None:
    assert torch.equal(full("a", (4, 4)), full("a", (4, 4)))
    assert not torch.equal(full("a", (4, 4)), full("b", (4, 4)))
    other_seed = uniform_tensor(seed=8, name="a", full_shape=(4, 4), bound=0.5, dtype=torch.float64)
    assert not torch.equal(full("a", (4, 4)), other_seed)


def test_uneven_split_is_refused() -> None:
    with pytest.raises(ValueError, match="does not split"):
        Shard(dim=0, index=0, count=3).local_shape((10, 4))


CFG = GPTConfig(
    layers=4, hidden=16, heads=4, seq_len=8, vocab=32, microbatches=4, tp=1, pp=1, dp=1, dtype="float64"
)


def stage_params(cfg: GPTConfig, stage: int, tp_rank: int) -> dict[str, torch.Tensor]:
    """Parameters of one (stage, tp rank), named with global layer indices."""
    factory = ParamFactory(
        seed=cfg.seed, tp_rank=tp_rank, tp_size=cfg.tp, device=torch.device("cpu"), dtype=torch.float64
    )
    model = GPTStage(cfg, stage=stage, factory=factory, tp=TPGroup(rank=tp_rank, size=cfg.tp, group=None))
    out = {}
    for name, p in model.named_parameters():
        if name.startswith("layers."):
            _, local, rest = name.split(".", 2)
            name = f"layers.{cfg.stage_layers(stage)[int(local)]}.{rest}"
        out[name] = p.detach()
    return out


@pytest.mark.parametrize(("tp", "pp"), [(2, 2), (4, 1), (1, 4)])
def test_sharded_pipelined_model_is_the_full_model(tp: int, pp: int) -> None:
    reference = stage_params(CFG, 0, 0)
    cfg = CFG.with_layout(tp=tp, pp=pp, dp=1)
    pieces: dict[str, list[torch.Tensor]] = {}
    for stage in range(pp):
        for tp_rank in range(tp):
            for name, p in stage_params(cfg, stage, tp_rank).items():
                pieces.setdefault(name, []).append(p)
    assert pieces.keys() == reference.keys()
    for name, parts in pieces.items():
        whole = reference[name]
        split = [d for d in range(whole.dim()) if parts[0].shape[d] != whole.shape[d]]
        if split:  # tensor-parallel: the shards, in tp order, rebuild the full parameter
            assert torch.equal(torch.cat(parts, dim=split[0]), whole), name
        else:  # replicated on every tp rank
            assert all(torch.equal(p, whole) for p in parts), name


def test_tensor_parallel_split_of_each_parameter() -> None:
    params = stage_params(CFG.with_layout(tp=2, pp=1, dp=1), 0, 1)
    h, f, v = CFG.hidden, CFG.ffn, CFG.vocab
    assert params["embed.word.weight"].shape == (v // 2, h)
    assert params["embed.position.weight"].shape == (CFG.seq_len, h)
    assert params["layers.0.attn.qkv.weight"].shape == (3 * h // 2, h)
    assert params["layers.0.attn.proj.weight"].shape == (h, h // 2)
    assert params["layers.0.attn.proj.bias"].shape == (h,)
    assert params["layers.0.mlp.fc1.weight"].shape == (f // 2, h)
    assert params["layers.0.mlp.fc2.weight"].shape == (h, f // 2)
    assert params["head.out.weight"].shape == (v // 2, h)
    assert torch.equal(params["layers.0.norm1.weight"], torch.ones(h, dtype=torch.float64))
