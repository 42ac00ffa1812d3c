"""Values received from real peers, given back when the same receive comes from a virtual peer.

Most programs only look at the shapes of what they receive; some look at values: pipelining
stages vote on static or dynamic shapes with a [1] int32 tensor and then send each other the
pickled shapes of their inputs and gradients (``send_object_list``), and the receiving stage sizes
its buffers from them. A capture therefore runs the ranks that exchange such values together
once, recording what each received from its real peers (``record=True``); when a rank then runs
alone, a receive from a (now virtual) peer gets the recorded value instead of stand-in data.

Receives are matched by peer and by their order among this rank's receives from that peer: a
deterministic program receives the same things in the same order on every run. A recorded value
is used only where shapes and dtypes agree; values above ``MAX_BYTES`` (activations, gradients)
are not kept, and such receives get stand-in data as before.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence

import torch

from prism.schemas.received_values import Received

MAX_BYTES = 64 * 1024
"""Largest receive (all its tensors together) whose values are recorded."""


class ReceivedValues:
    """One rank's receives, per peer in order: recorded from real peers, or given to virtual ones."""

    def __init__(
        self, known: Mapping[int, Sequence[list[torch.Tensor] | None]] | None = None, *, record: bool = False
    ) -> None:
        self._known: Received = {peer: list(values) for peer, values in (known or {}).items()}
        self._recording = record
        self._next: defaultdict[int, int] = defaultdict(int)
        self._lock = threading.Lock()  # receives may be issued from autograd's or a helper thread

    @property
    def recording(self) -> bool:
        return self._recording

    def next_slot(self, peer: int) -> int:
        """The position of a new receive from ``peer`` among this rank's receives from it."""
        with self._lock:
            slot = self._next[peer]
            self._next[peer] += 1
            return slot

    def knows_next(self, peer: int) -> bool:
        """Whether the next receive from ``peer`` has a known value."""
        with self._lock:
            return self._value(peer, self._next[peer]) is not None

    def record(self, peer: int, slot: int, tensors: Sequence[torch.Tensor]) -> None:
        """Keep a copy of what receive ``slot`` from ``peer`` left in ``tensors`` (if small)."""
        if not self._recording:
            return
        kept = None
        if sum(t.numel() * t.element_size() for t in tensors) <= MAX_BYTES:
            kept = [t.detach().to("cpu", copy=True) for t in tensors]
        with self._lock:
            values = self._known.setdefault(peer, [])
            values.extend([None] * (slot + 1 - len(values)))
            values[slot] = kept

    def fill(self, peer: int, slot: int, tensors: Sequence[torch.Tensor]) -> bool:
        """Write the known value of receive ``slot`` from ``peer`` into ``tensors``; False if none fits."""
        with self._lock:
            known = self._value(peer, slot)
            if known is not None:  # each receive happens once: let its copy go
                self._known[peer][slot] = None
        if known is None or len(known) != len(tensors):
            return False
        if any(k.shape != t.shape or k.dtype != t.dtype for k, t in zip(known, tensors, strict=True)):
            return False
        with torch.no_grad():  # a receive buffer may be a leaf that requires grad
            for k, t in zip(known, tensors, strict=True):
                t.copy_(k)
        return True

    def pointers(self) -> set[int]:
        """Data pointers of the values held: host memory prism holds, not the program."""
        with self._lock:
            return {t.untyped_storage().data_ptr() for vs in self._known.values() for v in vs if v for t in v}

    def recorded(self) -> Received:
        """Everything recorded so far."""
        with self._lock:
            return {peer: list(values) for peer, values in self._known.items()}

    def _value(self, peer: int, slot: int) -> list[torch.Tensor] | None:
        values = self._known.get(peer, ())
        return values[slot] if slot < len(values) else None
