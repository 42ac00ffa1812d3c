"""The record_function mark grammar: format_mark / parse_mark are inverse; bad names are rejected."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.schemas.annotations import (
    PREFIX,
    Direction,
    Mark,
    MarkError,
    Part,
    Phase,
    comm_mark_name,
    format_mark,
    group_label,
    is_mark,
    parse_mark,
    try_parse_mark,
)

ints = st.none() | st.integers(min_value=-(10**12), max_value=10**12)
texts = st.none() | st.text(st.characters(exclude_characters="|="), max_size=20)

marks = st.builds(
    Mark,
    phase=st.sampled_from(Phase),
    iter=ints,
    dir=st.none() | st.sampled_from(Direction),
    stage=ints,
    mb=ints,
    layer=ints,
    part=st.none() | st.sampled_from(Part),
    peer=ints,
    bucket=ints,
    op=texts,
    group=texts,
    gseq=ints,
    bytes=ints,
)


@settings(max_examples=300, deadline=None)
@given(marks)
def test_format_parse_round_trip(mark: Mark) -> None:
    name = format_mark(mark)
    assert name.startswith(PREFIX + mark.phase.value)
    assert is_mark(name)
    parsed = parse_mark(name)
    assert parsed == mark
    assert try_parse_mark(name) == mark
    assert format_mark(parsed) == name


@pytest.mark.parametrize(
    ("mark", "name"),
    [
        (Mark(phase=Phase.ITERATION, iter=3), "prism:iter|iter=3"),
        (Mark(phase=Phase.FORWARD, stage=1, mb=4, layer=9), "prism:fwd|stage=1|mb=4|layer=9"),
        (Mark(phase=Phase.BACKWARD, stage=0, mb=4, part=Part.EMBED), "prism:bwd|stage=0|mb=4|part=embed"),
        (
            Mark(phase=Phase.SEND, dir=Direction.FORWARD, stage=1, mb=4, peer=17),
            "prism:send|dir=fwd|stage=1|mb=4|peer=17",
        ),
        (Mark(phase=Phase.P2P_WAIT, stage=1), "prism:p2p_wait|stage=1"),
        (Mark(phase=Phase.GRAD_SYNC, bucket=2), "prism:grad_sync|bucket=2"),
        (Mark(phase=Phase.OPTIMIZER), "prism:optim"),
        (
            Mark(phase=Phase.COMM, op="all_reduce", group="tp.3", gseq=12, bytes=4096),
            "prism:comm|op=all_reduce|group=tp.3|gseq=12|bytes=4096",
        ),
    ],
)
def test_documented_examples(mark: Mark, name: str) -> None:
    assert format_mark(mark) == name
    assert parse_mark(name) == mark


def test_fields_are_written_in_fixed_order_and_typed_on_read() -> None:
    # keyword order of the constructor does not matter; the name's field order is fixed
    assert format_mark(Mark(phase=Phase.FORWARD, layer=2, mb=1, stage=0)) == "prism:fwd|stage=0|mb=1|layer=2"
    m = parse_mark("prism:recv|dir=bwd|stage=2|mb=0|peer=5")
    assert m.dir is Direction.BACKWARD and isinstance(m.stage, int) and m.layer is None


@pytest.mark.parametrize(
    "name",
    [
        "prism:",
        "prism:nope",
        "prism:FWD",
        "prism:fwd|stage",
        "prism:fwd|stage=x",
        "prism:fwd|stage=",
        "prism:fwd|stage=1.5",
        "prism:fwd|unknown=1",
        "prism:fwd|phase=bwd",
        "prism:fwd|stage=1|",
        "prism:fwd||stage=1",
        "prism:send|dir=sideways",
        "prism:fwd|part=torso",
        "prism:fwd|Stage=1",
    ],
)
def test_malformed_prism_names_raise(name: str) -> None:
    with pytest.raises(MarkError):
        parse_mark(name)
    assert try_parse_mark(name) is None


@pytest.mark.parametrize("name", ["aten::mm", "", "Prism:fwd", " prism:fwd", "prism", "ProfilerStep#3"])
def test_non_prism_names(name: str) -> None:
    assert not is_mark(name)
    assert try_parse_mark(name) is None
    with pytest.raises(MarkError, match="not a prism mark"):
        parse_mark(name)


@pytest.mark.parametrize("bad", ["all|reduce", "a=b", "|", "=", "x|y=z"])
@pytest.mark.parametrize("key", ["op", "group"])
def test_values_with_separators_are_rejected(key: str, bad: str) -> None:
    with pytest.raises(MarkError, match=key):
        format_mark(Mark(phase=Phase.COMM, **{key: bad}))


def test_mark_error_is_a_value_error() -> None:
    assert issubclass(MarkError, ValueError)


def test_repeated_field_is_malformed() -> None:
    with pytest.raises(MarkError):
        parse_mark("prism:fwd|stage=1|stage=2")


def test_group_label() -> None:
    assert group_label("tp", 3) == "tp.3"
    assert group_label("dp", 0) == "dp.0"
    assert group_label("world", 0) == "world"
    assert parse_mark(format_mark(Mark(phase=Phase.COMM, group=group_label("pp", 5)))).group == "pp.5"


@settings(max_examples=200)
@given(
    op=st.text(st.characters(exclude_characters="|="), min_size=1, max_size=12),
    group=texts,
    pg=texts,
    gseq=st.integers(min_value=0, max_value=10**9),
    nbytes=st.integers(min_value=0, max_value=10**12),
)
def test_a_calls_mark_named_in_parts_is_the_mark_format_mark_writes(op, group, pg, gseq, nbytes) -> None:
    mark = Mark(phase=Phase.COMM, op=op, group=group, pg=pg, gseq=gseq, bytes=nbytes)
    name = comm_mark_name(op, group, pg, gseq, nbytes)
    assert name == format_mark(mark)
    assert parse_mark(name) == mark


def test_a_calls_mark_refuses_what_the_grammar_refuses() -> None:
    with pytest.raises(MarkError):
        comm_mark_name("all_reduce", "tp|0", "3", 0, 8)
