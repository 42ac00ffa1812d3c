"""The built-in workload's settings, as a capture's job and a graph's metadata record them.

The generic stages do not know the built-in workload: its settings are a record of its own
(``prism.capture.workloads.gpt.config``), of which they read only the job's shape, by the keys
below: the layout's degrees and the device, and, for a graph of another layout, the layers the
pipeline stages share and the microbatches of an iteration.
"""

from __future__ import annotations

from collections.abc import Mapping

from prism.schemas.layout import ParallelLayout

DEVICES = ("cpu", "cuda")
LAYOUT_KEYS = ("tp", "pp", "dp")
"""The record's layout degrees."""
SHAPE_KEYS = (*LAYOUT_KEYS, "layers", "microbatches")
"""What a graph built for another shape than the captured one changes in the record."""


class RecordError(ValueError):
    """A workload record without the shape the stages read; the message is one line."""


def _positive(record: Mapping, key: str) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RecordError(f"the workload record's {key} must be a positive integer, got {value!r}")
    return value


def record_layout(record: Mapping) -> ParallelLayout:
    """The layout a workload record's job runs on."""
    return ParallelLayout(**{key: _positive(record, key) for key in LAYOUT_KEYS})


def record_device(record: Mapping) -> str:
    """'cpu' or 'cuda'."""
    device = record.get("device", "cpu")
    if device not in DEVICES:
        raise RecordError(f"the workload record's device must be one of {', '.join(DEVICES)}, got {device!r}")
    return device


def record_shape(record: Mapping) -> dict[str, int]:
    """The record's ``SHAPE_KEYS``."""
    return {key: _positive(record, key) for key in SHAPE_KEYS}


def reshaped(record: Mapping, **shape: int) -> dict:
    """``record`` for a job of another shape (``SHAPE_KEYS`` only); every other setting kept."""
    unknown = set(shape) - set(SHAPE_KEYS)
    if unknown:
        raise RecordError(f"not a shape of the record: {', '.join(sorted(unknown))}")
    return {**record, **shape}
