"""Shared test set-up: tests marked ``gpu`` are skipped where CUDA is unavailable."""

from __future__ import annotations

import pytest
from hypothesis import settings

# No deadlines: timings on shared CI machines vary too much for per-example limits.
settings.register_profile("prism", deadline=None)
settings.load_profile("prism")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch  # only when needed: keeps collection of torch-free tests fast

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)
