"""benchmarks/ keeps maintained tools: every script is listed in benchmarks/README.md, every listed
script is run by a Makefile target, and no script lives under benchmarks/results/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
# Scripts that benchmarks/gpu_checks.sh runs: its Makefile target (gpu-checks) runs them.
RUNNER = "gpu_checks.sh"


def _scripts() -> list[str]:
    return sorted(p.name for p in BENCHMARKS.iterdir() if p.suffix in (".py", ".sh"))


def _table_rows() -> list[list[str]]:
    """The README table's rows (after its header and rule), cells stripped."""
    lines = (BENCHMARKS / "README.md").read_text().splitlines()
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines if line.startswith("|")]
    return rows[2:]


def _recipes() -> str:
    """The Makefile's recipe lines (those a tab starts, continuations included), with the variables
    they use expanded (``$(RECORD)`` is ``$(BIN)/python benchmarks/record.py``)."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    lines = text.splitlines()
    variables = {}
    for line in lines:
        match = re.match(r"^([A-Za-z0-9_]+)\s*[?:]?=\s*(.*)$", line)
        if match:
            variables[match.group(1)] = match.group(2)
    recipes = "\n".join(line for line in lines if line.startswith("\t"))
    for _ in range(5):  # variables name variables: a few rounds expand them all
        recipes = re.sub(r"\$\(([A-Za-z0-9_]+)\)", lambda m: variables.get(m.group(1), m.group(0)), recipes)
    return recipes


def _targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z0-9_.-]+):", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))


def test_every_script_is_in_the_readme_table() -> None:
    listed = {row[0].strip("`") for row in _table_rows()}
    assert _scripts(), "no scripts found in benchmarks/"
    missing = [name for name in _scripts() if name not in listed]
    assert not missing, f"benchmarks/README.md does not list {missing}"
    gone = sorted(listed - set(_scripts()))
    assert not gone, f"benchmarks/README.md lists scripts that are not in benchmarks/: {gone}"


def test_every_listed_script_is_run_by_a_makefile_recipe() -> None:
    recipes = _recipes()
    runner = (BENCHMARKS / RUNNER).read_text()
    assert f"benchmarks/{RUNNER}" in recipes
    for row in _table_rows():
        name = row[0].strip("`")
        assert f"benchmarks/{name}" in recipes or f"benchmarks/{name}" in runner, (
            f"{name} is in no Makefile recipe (nor in {RUNNER})"
        )


def test_every_target_the_table_names_is_in_the_makefile() -> None:
    targets = _targets()
    for row in _table_rows():
        named = set(re.findall(r"\b(results(?:-[a-z0-9]+)*|respec|gpu-checks|fetch-traces)\b", row[2]))
        assert named or row[0] == "`record.py`", f"no make target for {row[0]}"
        assert named <= targets, f"{row[0]}: {sorted(named - targets)} not in the Makefile"


def test_no_script_under_results() -> None:
    scripts = [p.relative_to(ROOT) for p in (BENCHMARKS / "results").rglob("*") if p.suffix in (".py", ".sh")]
    assert not scripts, f"scripts under benchmarks/results/: {scripts}"
