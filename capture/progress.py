"""Progress of rank processes: a line protocol on their stdout, and its display on the console."""

from __future__ import annotations

import json

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

PROGRESS_PREFIX = "PRISM_PROGRESS "
"""Rank processes print this prefix followed by one JSON object per event."""


def report(**fields: object) -> None:
    """Emit one progress event from a rank process."""
    print(PROGRESS_PREFIX + json.dumps(fields), flush=True)


class RankProgress:
    """A rich progress bar per rank, fed with the events of ``prism.capture.launch``."""

    def __init__(self, console: Console, labels: dict[int, str]) -> None:
        self._labels = labels
        self._tasks: dict[int, int] = {}
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )

    def __enter__(self) -> RankProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def starting(self, rank: int) -> None:
        label = self._labels.get(rank, f"rank {rank}")
        self._tasks[rank] = self.progress.add_task(label, total=None, status="starting (import, build model)")

    def __call__(self, event: dict) -> None:
        task = self._tasks.get(event.get("rank", -1))
        if task is None:
            return
        kind = event.get("event")
        if kind == "start":
            self.progress.update(task, total=event["total"], completed=0, status="running")
        elif kind == "iteration":
            self.progress.update(task, completed=event["done"], status=f"last iteration {event['ms']:.0f} ms")
        elif kind == "done":
            self.progress.update(task, status="traces written")
