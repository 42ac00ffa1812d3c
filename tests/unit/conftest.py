"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from prism.capture import annotate
from prism.capture.phase_timer import PhaseTimer


@pytest.fixture
def timer() -> Iterator[PhaseTimer]:
    """A phase timer every ``annotate`` mark opens through, for the test's duration."""
    timer = PhaseTimer()
    annotate.set_phase_timer(timer)
    yield timer
    annotate.set_phase_timer(None)
