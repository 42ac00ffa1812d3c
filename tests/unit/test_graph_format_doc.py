"""docs/graph-format.md lists exactly the columns of schemas.graph_format.SCHEMA, with their Arrow types."""

from __future__ import annotations

import re
from pathlib import Path

from prism.schemas.graph_format import SCHEMA

DOC = Path(__file__).resolve().parents[2] / "docs" / "graph-format.md"
ROW = re.compile(r"^\|\s*`(?P<column>[a-z_0-9]+)`\s*\|\s*`(?P<type>[^`]+)`\s*\|")


def documented_columns() -> dict[str, str]:
    """column -> Arrow type, from the rows of the table under '## Columns'."""
    section = DOC.read_text().split("## Columns", 1)[1].split("\n## ", 1)[0]
    rows = [ROW.match(line) for line in section.splitlines()]
    found = [(m["column"], m["type"]) for m in rows if m]
    assert len(found) == len({c for c, _ in found}), "a column is listed twice"
    return dict(found)


def test_every_schema_column_is_documented_with_its_type() -> None:
    documented = documented_columns()
    for field in SCHEMA:
        assert field.name in documented, f"column {field.name!r} missing from {DOC.name}"
        assert documented[field.name] == str(field.type), f"column {field.name!r}: type differs"


def test_no_documented_column_is_missing_from_the_schema() -> None:
    assert set(documented_columns()) - set(SCHEMA.names) == set()


def test_columns_are_documented_in_schema_order() -> None:
    assert list(documented_columns()) == SCHEMA.names
