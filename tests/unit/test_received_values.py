"""Values received from real peers in the value pass, given back to receives from virtual peers."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prism.peers.received_values import MAX_BYTES, ReceivedValues
from prism.schemas.received_values import ReceivedValuesError, read_received_values, write_received_values


def test_a_recorded_receive_is_given_back_in_the_same_order_per_peer() -> None:
    recording = ReceivedValues(record=True)
    for peer, value in ((7, 1), (3, 10), (7, 2)):
        slot = recording.next_slot(peer)
        recording.record(peer, slot, [torch.tensor([value], dtype=torch.int32)])
    replaying = ReceivedValues(recording.recorded())
    got = []
    for peer in (3, 7, 7):  # another interleaving of the peers: only the order per peer counts
        buffer = torch.zeros(1, dtype=torch.int32)
        assert replaying.fill(peer, replaying.next_slot(peer), [buffer])
        got.append((peer, int(buffer)))
    assert got == [(3, 10), (7, 1), (7, 2)]


def test_a_receive_with_no_fitting_value_is_left_to_stand_in_data() -> None:
    recording = ReceivedValues(record=True)
    recording.record(1, recording.next_slot(1), [torch.ones(4)])
    big = torch.ones(MAX_BYTES // 4 + 1)
    recording.record(1, recording.next_slot(1), [big])  # an activation: not kept
    replaying = ReceivedValues(recording.recorded())
    assert replaying.knows_next(1)
    assert not replaying.fill(1, replaying.next_slot(1), [torch.zeros(5)])  # other shape
    assert not replaying.knows_next(1)
    assert not replaying.fill(1, replaying.next_slot(1), [torch.zeros_like(big)])
    assert not replaying.fill(2, replaying.next_slot(2), [torch.zeros(4)])  # a peer never heard from


def test_filling_a_buffer_that_requires_grad_works() -> None:
    replaying = ReceivedValues({0: [[torch.full((3,), 2.0)]]})
    buffer = torch.zeros(3, requires_grad=True)  # pipelining receives into leaves that need grad
    assert replaying.fill(0, replaying.next_slot(0), [buffer])
    assert buffer.tolist() == [2.0, 2.0, 2.0] and buffer.requires_grad


def test_a_values_file_round_trips(tmp_path: Path) -> None:
    received = {512: [[torch.tensor([1], dtype=torch.int32)], None, [torch.arange(160, dtype=torch.uint8)]]}
    write_received_values(tmp_path / "rank0.pt", 0, received)
    rank, back = read_received_values(tmp_path / "rank0.pt")
    assert rank == 0 and back.keys() == {512} and back[512][1] is None
    assert torch.equal(back[512][2][0], received[512][2][0])


def _saved(data: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(data, buffer)
    return buffer.getvalue()


VALID = {"schema": "prism.received_values", "version": 1, "rank": 0, "received": {1: [[torch.ones(2)], None]}}
leaves = st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=4), st.just(torch.zeros(1)))
trees = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(leaves.filter(lambda x: isinstance(x, (int, str))), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        st.binary(max_size=200).map(lambda b: b),
        st.fixed_dictionaries({k: trees for k in VALID}).map(_saved),
        st.sampled_from(sorted(VALID)).flatmap(lambda k: trees.map(lambda v: _saved({**VALID, k: v}))),
        st.integers(0, len(_saved(VALID)) - 1).map(lambda n: _saved(VALID)[:n]),
    )
)
def test_reading_any_file_gives_values_or_one_clear_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "values.pt"
    path.write_bytes(content)
    try:
        rank, received = read_received_values(path)
    except ReceivedValuesError:
        return
    assert isinstance(rank, int)
    for receives in received.values():
        for receive in receives:
            assert receive is None or all(isinstance(t, torch.Tensor) for t in receive)


def test_a_values_file_of_another_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "v.pt"
    path.write_bytes(_saved({**VALID, "version": 99}))
    with pytest.raises(ReceivedValuesError, match="version 99"):
        read_received_values(path)


class _Payload:
    """What a crafted file would run on load, if prism unpickled arbitrary objects."""

    def __reduce__(self):
        return (Path.touch, (Path(os.environ["PRISM_TEST_PWNED"]),))


def test_a_crafted_values_file_runs_no_code(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.setenv("PRISM_TEST_PWNED", str(marker))
    crafted = tmp_path / "rank0.values.pt"
    torch.save({"schema": "x", "payload": _Payload()}, crafted)
    with pytest.raises(ReceivedValuesError, match="not a values file"):
        read_received_values(crafted)
    assert not marker.exists()
