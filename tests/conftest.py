"""Shared test set-up: tests marked ``gpu`` are skipped where CUDA is unavailable; the scripts
of ``benchmarks/`` are loaded by path through the ``benchmark_script`` fixture."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import settings

# The CLIs' rich consoles, made at import, keep a COLUMNS set then as their width for good; pytest-xdist's
# workers set COLUMNS=80. Without it, each console sizes itself at every call, by the env a test passes.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

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
def benchmark_script() -> Callable[[str], ModuleType]:
    """Load a script of benchmarks/ by name as a module of its own (the scripts import only
    ``prism``), to test its functions and ``main`` in-process."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
