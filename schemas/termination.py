"""Every ``prism-*`` command stops on SIGTERM and SIGHUP as it does on Ctrl-C.

``timeout``, Slurm's ``scancel`` and ``docker stop`` send SIGTERM, a closed terminal SIGHUP;
Python's default for both ends the process at once, past every ``finally``, so a command would
leave its temporary output behind. Raised as ``KeyboardInterrupt`` in the main thread, they take
the path Ctrl-C takes: the command removes what it had not finished and leaves earlier output as
it was.
"""

from __future__ import annotations

import signal
from types import FrameType

TERMINATION_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def stop_on_termination() -> None:
    """Make SIGTERM and SIGHUP raise ``KeyboardInterrupt`` in the main thread from now on."""
    for sig in TERMINATION_SIGNALS:
        signal.signal(sig, _interrupt)
