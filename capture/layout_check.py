"""A program's groups are checked against the capture's layout as the program builds them.

A group that is no group of the layout (one axis's, or the world) means the layout is not the
program's: its calls could not be mapped to the target job's ranks, and the build would refuse
them only after the whole capture ran. The capture stops at the group's creation instead, with
one line naming the group, the layout's groups nearest to it and the options that would match
(``prism.schemas.layout_match``). A group of one rank makes no call with a peer and passes; a
flattening of several axes (torchtitan flattens dp and cp for its loss) is a group of the layout,
labelled by its axes (``dp_cp.0``).
"""

from __future__ import annotations

from prism.capture.interpose import program_line
from prism.schemas.annotations import group_label
from prism.schemas.layout import ParallelLayout
from prism.schemas.layout_match import outside_layout


class GroupOutsideLayout(RuntimeError):
    """The program built a group the layout does not have (one line: which, and what would match)."""


def checked_labeler(layout: ParallelLayout):
    """Group label ('tp.3', 'dp.0', 'dp_shard_cp.1', 'world') of a group the program builds; raises
    ``GroupOutsideLayout`` for a group of more than one rank that is none of the layout's."""

    def label(ranks: tuple[int, ...]) -> str | None:
        found = layout.group_of_ranks(ranks)
        if found is not None:
            return group_label(*found)
        if len(ranks) == 1:
            return None
        raise GroupOutsideLayout(f"the program builds {outside_layout(layout, ranks)} (at {program_line()})")

    return label
