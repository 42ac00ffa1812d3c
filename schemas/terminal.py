"""Tables a terminal of 80 columns, or a CI log, shows whole.

Every command prints its tables through ``Table``: rich's, drawn without vertical rules or edge
padding, with adjacent paddings collapsed. Where its columns do not fit side by side as they
are, each gets at least the width of its longest word (of its header) or value and a share of
the rest, so that headers wrap between words and numbers are never cut; where even that is wider
than the terminal, values fold onto a second line rather than lose their end.
"""

from __future__ import annotations

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Column
from rich.table import Table as RichTable


class Table(RichTable):
    """A rich Table that keeps every header word and value whole (the module docstring)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("box", box.SIMPLE_HEAD)
        kwargs.setdefault("collapse_padding", True)
        kwargs.setdefault("pad_edge", False)
        super().__init__(*args, **kwargs)

    def add_column(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("overflow", "fold")
        super().add_column(*args, **kwargs)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        free = [c for c in self.columns if c.width is None]
        widths = self._fitted_widths(free, (self.width or options.max_width) - self._extra_width)
        for column, width in zip(free, widths or [None] * len(free), strict=True):
            column.width = width
        try:
            yield from super().__rich_console__(console, options)
        finally:
            for column in free:
                column.width = None

    def _fitted_widths(self, columns: list[Column], room: int) -> list[int] | None:
        """Content widths for ``columns`` within ``room`` (their paddings and the fixed columns
        taken out), each from its longest word up towards its longest line; None where rich's
        own layout already fits, or where not even the longest words do."""
        room -= sum(self._get_padding_width(c._index) + (c.width or 0) for c in self.columns)
        least = [_longest(column, str.split) for column in columns]
        most = [
            max(_longest(column, str.splitlines), low) for column, low in zip(columns, least, strict=True)
        ]
        if sum(most) <= room or sum(least) > room:
            return None
        spare, wanted = room - sum(least), sum(most) - sum(least)
        return [low + (high - low) * spare // wanted for low, high in zip(least, most, strict=True)]


def _longest(column: Column, pieces) -> int:
    """The widest piece (word or line) of the column's header and values."""
    texts = [str(column.header), *(str(cell) for cell in column.cells)]
    return max((cell_len(piece) for text in texts for piece in pieces(text)), default=0)
