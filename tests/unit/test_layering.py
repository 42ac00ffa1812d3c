"""Imports run one way between prism's packages: a package imports only those below it.

The order is the design's data flow: schemas <- peers <- capture, graph <- replay <- fidelity, and
inside graph: io, comm <- sim <- build, export, with traces read by build (and the replay). A module that
imports upwards makes a cycle between stages, however lazily it imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# What each package may import (besides itself); transitive closure is spelled out.
ALLOWED = {
    "schemas": set(),
    "peers": {"schemas"},
    "capture": {"schemas", "peers"},
    "graph": {"schemas", "peers"},
    "replay": {"schemas", "peers", "capture", "graph"},
    "fidelity": {"schemas", "peers", "capture", "graph", "replay"},
}
GRAPH_ALLOWED = {
    "io": set(),
    "comm": set(),
    "traces": set(),
    "sim": {"io", "comm"},
    "build": {"io", "comm", "sim", "traces"},
    "export": {"io", "sim"},
}


def _prism_imports(path: Path) -> list[tuple[str, int]]:
    """Every ``prism.*`` module a file imports (at any depth of the file), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found += [(n, node.lineno) for n in names if n.startswith("prism.")]
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.startswith("prism.")]
    return found


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_packages_below_it(package: str) -> None:
    wrong = []
    for path in _modules(package):
        for module, line in _prism_imports(path):
            target = module.split(".")[1]
            if target != package and target in ALLOWED and target not in ALLOWED[package]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("sub", sorted(GRAPH_ALLOWED))
def test_graph_sub_packages_import_one_way(sub: str) -> None:
    wrong = []
    for path in _modules(f"graph/{sub}"):
        for module, line in _prism_imports(path):
            parts = module.split(".")
            if parts[1] != "graph" or len(parts) < 3 or parts[2] not in GRAPH_ALLOWED:
                continue
            if parts[2] != sub and parts[2] not in GRAPH_ALLOWED[sub]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_every_module_lives_in_a_known_package() -> None:
    """graph/ holds only its sub-packages: a module at its top would sit outside the order."""
    loose = [p.name for p in (ROOT / "graph").glob("*.py") if p.name != "__init__.py"]
    assert not loose
    assert {p.name for p in (ROOT / "graph").iterdir() if (p / "__init__.py").is_file()} == set(GRAPH_ALLOWED)


def test_generic_code_imports_nothing_of_the_built_in_workload() -> None:
    """The built-in GPT is one program among others: what every program goes through reads its
    settings as a record (``prism.schemas.workload``), never its modules."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for package in ("schemas", "peers", "graph", "replay")
        for path in _modules(package)
        for module, line in _prism_imports(path)
        if module.startswith("prism.capture.workloads")
    ]
    assert not wrong, "\n".join(wrong)
