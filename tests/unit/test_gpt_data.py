"""Synthetic data: stages agree without talking, and data parallelism splits one global batch."""

from __future__ import annotations

import torch

from prism.capture.workloads.gpt import data
from prism.capture.workloads.gpt.config import GPTConfig

CFG = GPTConfig(
    layers=2, hidden=16, heads=2, seq_len=12, vocab=50, micro_batch_size=3, microbatches=4, tp=1, pp=2, dp=2
)


def test_labels_are_the_next_tokens_of_the_inputs() -> None:
    for gmb in range(5):
        x, y = data.inputs(CFG, gmb), data.labels(CFG, gmb)
        assert x.shape == y.shape == (CFG.micro_batch_size, CFG.seq_len)
        assert torch.equal(x[:, 1:], y[:, :-1])


def test_data_parallel_ranks_split_the_single_process_batch() -> None:
    single = CFG.with_layout(tp=1, pp=2, dp=1)
    single = GPTConfig(**{**single.to_dict(), "microbatches": CFG.dp * CFG.microbatches})
    for iteration in range(3):
        for dp_index in range(CFG.dp):
            for mb in range(CFG.microbatches):
                ours = data.global_microbatch(CFG, iteration=iteration, dp_index=dp_index, mb=mb)
                theirs = data.global_microbatch(
                    single, iteration=iteration, dp_index=0, mb=dp_index * CFG.microbatches + mb
                )
                assert ours == theirs


def test_every_microbatch_is_distinct_and_tokens_in_range() -> None:
    seen = set()
    for iteration in range(2):
        for dp_index in range(CFG.dp):
            for mb in range(CFG.microbatches):
                seen.add(data.global_microbatch(CFG, iteration=iteration, dp_index=dp_index, mb=mb))
    assert seen == set(range(2 * CFG.dp * CFG.microbatches))
    tokens = torch.stack([data.sample_tokens(CFG, g) for g in seen])
    assert tokens.min() >= 0 and tokens.max() < CFG.vocab
    assert len({tuple(t.flatten().tolist()) for t in tokens}) == len(seen)


def test_tokens_depend_on_the_seed() -> None:
    other = GPTConfig(**{**CFG.to_dict(), "seed": CFG.seed + 1})
    assert torch.equal(data.sample_tokens(CFG, 0), data.sample_tokens(CFG, 0))
    assert not torch.equal(data.sample_tokens(CFG, 0), data.sample_tokens(other, 0))
