"""Layer marks of a program prism knows nothing about: each block of its layer stack, forward
and backward, so that its graph names every unit's layer as the built-in workload's does.

A program's layer blocks are the children of the outermost ``ModuleList`` or ``ModuleDict``
under a root module (``prism.capture.program_phases``) whose children are all named by integers:
torchtitan's and Hugging Face's ``layers.<i>``, a stage's ``blocks.<i>``. Block ``i`` is marked
``fwd|layer=i`` over each call and ``bwd|layer=i`` over its backward (``annotate.BackwardRange``),
``i`` being its name (a pipeline stage that keeps global names gives global layers); where the
rank has several roots (an interleaved schedule's stages), the marks name the root's index too,
``stage=s``, as its forward marks do (``prism.capture.program_phases``). A compiled
module's inside is not searched: hooks there would run inside compiled code; a compiled block
is marked from outside.

Marks are opened only while something reads them (``annotate.marks_are_read``: the profiler
records, or a replay's ``--delay`` set a block hook), so that the iterations a graph is timed by
run as the user's job does, without them; a block's own forward nested in another (activation
checkpointing's recomputation, inside backward) is not marked again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.hooks import RemovableHandle

from prism.capture import annotate
from prism.schemas.annotations import Mark, Phase

_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict)


def _compiled(module: torch.nn.Module) -> bool:
    return hasattr(module, "_orig_mod")  # torch.compile's OptimizedModule


def layer_blocks(root: torch.nn.Module) -> Iterator[tuple[int, torch.nn.Module]]:
    """The layer blocks under ``root``, each with its index, in registration order."""
    if _compiled(root):
        return
    for _, child in root.named_children():
        named = list(child.named_children())
        if isinstance(child, _CONTAINERS) and named and all(name.isdigit() for name, _ in named):
            yield from ((int(name), block) for name, block in named)
        else:
            yield from layer_blocks(child)


def _first_tensor(value: object) -> torch.Tensor | None:
    """The first tensor needing a gradient in ``value`` (a block's inputs or outputs)."""
    return next((t for t in tree_leaves(value) if isinstance(t, torch.Tensor) and t.requires_grad), None)


class LayerMarks:
    """Marks the calls of every layer block under the roots it is given (``install``)."""

    def __init__(self, marking: Callable[[], bool]) -> None:
        self._marking = marking  # False on other threads and inside a backward pass

    def install(self, roots: list[torch.nn.Module]) -> list[RemovableHandle]:
        """Hook every layer block under ``roots``; the handles remove the hooks."""
        handles = []
        several = len(roots) > 1
        for at, root in enumerate(roots):
            for index, block in layer_blocks(root):
                begins, ends = self._hooks(index, at if several else None)
                handles += [
                    # First and last: the block's own hooks (FSDP's unshard and reshard) are in its mark.
                    block.register_forward_pre_hook(begins, with_kwargs=True, prepend=True),
                    block.register_forward_hook(ends, with_kwargs=True, always_call=True),
                ]
        return handles

    def _hooks(self, index: int, stage: int | None) -> tuple[Callable, Callable]:
        forward = Mark(phase=Phase.FORWARD, stage=stage, layer=index)
        backward = Mark(phase=Phase.BACKWARD, stage=stage, layer=index)
        calls: list[tuple[object, annotate.BackwardRange] | None] = []  # the block's open calls

        def begins(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            if not (self._marking() and annotate.marks_are_read()):
                calls.append(None)
                return
            opened = annotate.mark(forward)
            opened.__enter__()
            backward_range = annotate.BackwardRange(backward)
            if torch.is_grad_enabled():
                backward_range.ends_at(_first_tensor((args, kwargs)))
            calls.append((opened, backward_range))

        def ends(module: torch.nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            call = calls.pop() if calls else None
            if call is None:
                return
            opened, backward_range = call
            opened.__exit__(None, None, None)
            if torch.is_grad_enabled():
                backward_range.begins_at(_first_tensor(output))

        return begins, ends
