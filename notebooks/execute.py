"""Execute notebooks (jupytext percent-format ``.py`` files) top to bottom, their figures written
to ``--figures``: ``python notebooks/execute.py --figures docs/figures notebooks/*.py``.

The tests run every notebook this way on a small sample; ``make figures`` makes the figures the
README and docs show. A cell that fails fails the run, with the cell's error."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import jupytext
from nbclient import NotebookClient


def execute(notebook: Path, figures: Path, timeout_s: int = 900) -> None:
    nb = jupytext.read(notebook)
    os.environ["PRISM_FIGURES"] = str(figures.resolve())
    NotebookClient(
        nb, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(notebook.parent)}}
    ).execute()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--figures", type=Path, default=Path("figures"))
    args = parser.parse_args(argv)
    for notebook in args.notebooks:
        print(f"executing {notebook}", file=sys.stderr)
        execute(notebook, args.figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
