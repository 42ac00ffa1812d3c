"""Synthetic token data, a pure function of (seed, global microbatch, sample, position).

The first stage (inputs) and the last stage (labels = next tokens) compute the same sample
without communicating. Global microbatch ``g = (iteration * dp + dp_index) * M + m``, so one
process running ``dp * M`` microbatches per iteration sees exactly the same global batch as a
data-parallel run with ``M`` microbatches per rank.
"""

from __future__ import annotations

import torch

from prism.capture.workloads.gpt import rng
from prism.capture.workloads.gpt.config import GPTConfig

_STREAM = "data/tokens"


def global_microbatch(cfg: GPTConfig, *, iteration: int, dp_index: int, mb: int) -> int:
    """Index of microbatch ``mb`` of data-parallel rank ``dp_index`` among all microbatches ever."""
    return (iteration * cfg.dp + dp_index) * cfg.microbatches + mb


def sample_tokens(cfg: GPTConfig, gmb: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Tokens [micro_batch_size, seq_len + 1] of global microbatch ``gmb``."""
    width = cfg.seq_len + 1
    first = gmb * cfg.micro_batch_size * width
    index = torch.arange(first, first + cfg.micro_batch_size * width, dtype=torch.int64, device=device)
    return rng.integers(rng.derive_key(cfg.seed, _STREAM), index, cfg.vocab).view(cfg.micro_batch_size, width)


def inputs(cfg: GPTConfig, gmb: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Input ids [micro_batch_size, seq_len] (first stage)."""
    return sample_tokens(cfg, gmb, device)[:, :-1]


def labels(cfg: GPTConfig, gmb: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Next-token labels [micro_batch_size, seq_len] (last stage)."""
    return sample_tokens(cfg, gmb, device)[:, 1:]
