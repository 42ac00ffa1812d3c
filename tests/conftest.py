"""Shared test set-up: tests marked ``gpu`` are skipped where CUDA is unavailable; the scripts
of ``benchmarks/`` are imported through the ``benchmark_module`` fixture."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

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


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def benchmark_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], ModuleType]]:
    """Import a script of benchmarks/ by name (they import each other as top-level modules);
    afterwards forget every module loaded from there, so that each test starts afresh."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    yield importlib.import_module
    for name, module in list(sys.modules.items()):
        if Path(getattr(module, "__file__", None) or "/").parent == BENCHMARKS:
            del sys.modules[name]
