"""The command class of every ``prism-*`` command (``@app.command(cls=PrismCommand)``; a command
with sub-commands: ``typer.Typer(cls=PrismGroup)``).

A usage error (an unknown option, a value of the wrong type, a missing argument) ends the command
as every other error of prism does: one ``error:`` line and exit 2, not click's framed panel with
the usage above it, so that scripts and people read every failure the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import partial
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup


def _main_with_error_lines(main, standalone_mode: bool) -> Any:
    """Run click's ``main`` (non-standalone) and end as a prism command ends."""
    if not standalone_mode:
        return main()
    try:
        code = main()  # the exit code of a typer.Exit, else what the command returned (None)
    except typer.TyperException as e:  # click's errors, vendored by typer
        if not e.format_message():  # no arguments: the help was shown
            sys.exit(e.exit_code)
        ctx = getattr(e, "ctx", None)  # a usage error's: names the command
        hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        Console(stderr=True).print(
            f"[bold red]error:[/] {escape(e.format_message())}{hint}", highlight=False, soft_wrap=True
        )
        sys.exit(e.exit_code)
    except typer.Abort:
        Console(stderr=True).print("[bold red]interrupted[/]", highlight=False)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


class _ErrorLines:
    """``main`` of a click command or group, ending as a prism command ends."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        run = partial(super().main, args, prog_name, complete_var, standalone_mode=False,  # type: ignore[misc]
                      windows_expand_args=windows_expand_args, **extra)  # fmt: skip
        return _main_with_error_lines(run, standalone_mode)


class PrismCommand(_ErrorLines, TyperCommand):
    """A command (``@app.command(cls=PrismCommand)``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Help is shown as written: rich would take '[default: 1]' for markup and drop it.
        for param in self.params:
            if getattr(param, "help", None):
                param.help = escape(param.help)  # type: ignore[attr-defined]


class PrismGroup(_ErrorLines, TyperGroup):
    """A command with sub-commands (``typer.Typer(cls=PrismGroup)``, e.g. ``prism-export trace``)."""
