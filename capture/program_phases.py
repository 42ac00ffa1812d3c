"""Phase marks of a program prism knows nothing about: its forward, backward and optimizer steps.

The built-in workload marks its blocks itself (``prism.capture.annotate``); a user's program does
not, yet a graph needs phases (so that the profiler correction is per phase, and a replay or a
simulation reports forward, backward and optimizer time, not only the iteration). A program
capture and its replay mark, on the program's main thread:

- **backward**: every run of the autograd engine (``loss.backward()``, ``torch.autograd.backward``
  or ``grad``: a pipeline schedule's per-microbatch backward, DDP's and FSDP's gradient hooks
  inside it); a run from nodes inside the graph to parameters alone (a split-backward schedule's
  weight pass, ``torch.distributed.pipelining``'s ``stage_backward_weight``: one run per group of
  parameters) is ``part=weights``, with the layer block (and stage) of its parameters where they
  share one, while a trace is recorded: its work is that layer's, though no block's backward
  range opens in it;
- **optimizer**: every outermost ``Optimizer.step`` (``prism.capture.optimizer_steps``: a container
  optimizer's inner steps are inside its own);
- **forward**: every call of a *root module*, a module no other module holds that owns a
  parameter an optimizer steps (the DDP or FSDP wrapper, a compiled module, a pipeline stage's
  module), outside the backward pass (checkpoint recomputation belongs to backward); where a rank
  has several roots (an interleaved schedule's stages), the mark's ``stage`` is the root's index
  (roots in the order the optimizer holds their parameters);
- **layers**: each block of a root's layer stack, forward and backward, while a trace is recorded
  (``prism.capture.program_layers``).

The roots are found once, at the first optimizer step, and hooked on the root instances alone:
global module hooks would run Python on every module call of the program, a cost the real job
does not pay. The iteration before the first step is set-up and cold start, never measured.
What is in no mark (zeroing gradients, the loss outside a module, data loading) is glue.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

import torch
import torch.autograd
from torch.autograd.graph import GradientEdge
from torch.utils.hooks import RemovableHandle

from prism.capture import annotate
from prism.capture.held_parameters import program_parameters
from prism.capture.optimizer_steps import OuterStepHooks, register_outer_step_hooks
from prism.capture.program_layers import LayerMarks, layer_blocks
from prism.schemas.annotations import Mark, Part, Phase
from prism.schemas.held_parameters import HeldParameters


def root_modules(stepped: torch.optim.Optimizer | None = None) -> list[torch.nn.Module]:
    """Live modules that no other live module holds as a child and that own a parameter some live
    optimizer steps, in the order the optimizers hold their parameters (``stepped``'s first: the
    one the program steps), so that a rank's stages are numbered as its optimizer steps them."""
    # type() and issubclass, not isinstance: a dead weakref.proxy raises on it (torch.compile keeps some)
    objects = [(obj, type(obj)) for obj in gc.get_objects()]
    modules = [obj for obj, kind in objects if issubclass(kind, torch.nn.Module)]
    optimizers = [obj for obj, kind in objects if issubclass(kind, torch.optim.Optimizer)]
    if stepped is not None:
        optimizers = [stepped, *(o for o in optimizers if o is not stepped)]
    order: dict[int, int] = {}
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                order.setdefault(id(p), len(order))
    children = {id(child) for module in modules for child in module.children()}
    roots = [
        module
        for module in modules
        if id(module) not in children and any(id(p) in order for p in module.parameters())
    ]
    return sorted(roots, key=lambda m: min(order.get(id(p), len(order)) for p in m.parameters()))


def _parameter_of(edge: object) -> object:
    """The parameter a run's input stands for: itself, or the one whose gradient a
    ``GradientEdge`` to its accumulator gives (None for any other node)."""
    if isinstance(edge, GradientEdge):
        return getattr(edge.node, "variable", None)
    return edge


def parameter_places(roots: list[torch.nn.Module]) -> dict[int, tuple[int | None, int | None]]:
    """Every parameter of ``roots`` by id: its root's index where there are several (the stage
    its marks name), and its layer block's index (None outside every block)."""
    several = len(roots) > 1
    places: dict[int, tuple[int | None, int | None]] = {}
    for at, root in enumerate(roots):
        stage = at if several else None
        places |= {id(p): (stage, None) for p in root.parameters()}
        for index, block in layer_blocks(root):
            places |= {id(p): (stage, index) for p in block.parameters()}
    return places


class ProgramPhases:
    """Opens forward, backward and optimizer marks around a program's own calls (``install``), and
    the marks of its layer blocks (``prism.capture.program_layers``) where ``marks_layers``."""

    marks_layers = True

    def __init__(self) -> None:
        self._thread = threading.get_ident()
        self._forward_depth = 0
        self._backward_depth = 0
        self._open: dict[Phase, object] = {}  # what ``_enter`` opened for each open phase
        self._handles: list[RemovableHandle | OuterStepHooks] = []
        self._engine_run_backward: Callable | None = None
        self._rooted = False
        self._roots: list[torch.nn.Module] = []
        self._places: dict[int, tuple[int | None, int | None]] = {}  # parameter id: (stage, layer)

    def install(self) -> None:
        """Start marking; call before the program runs (and before the capture's own step hook, so
        that an optimizer mark closes before the step ends the iteration)."""
        self._handles.append(register_outer_step_hooks(pre=self._optimizer_begins, post=self._optimizer_ends))
        self._engine_run_backward = torch.autograd._engine_run_backward
        torch.autograd._engine_run_backward = self._backward

    def remove(self) -> None:
        """Stop marking and close what is open."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._engine_run_backward is not None:
            torch.autograd._engine_run_backward = self._engine_run_backward
            self._engine_run_backward = None
        for phase in list(self._open):
            self._close(phase)

    # -- marks -----------------------------------------------------------------------------------
    def _mine(self) -> bool:
        return threading.get_ident() == self._thread

    def _enter(self, marked: Mark) -> None:
        mark = annotate.mark(marked)
        mark.__enter__()
        self._open[marked.phase] = mark

    def _close(self, phase: Phase) -> None:
        mark = self._open.pop(phase, None)
        if mark is not None:
            mark.__exit__(None, None, None)

    # -- backward --------------------------------------------------------------------------------
    def _backward(self, *args: object, **kwargs: object) -> object:
        run = self._engine_run_backward
        assert run is not None
        if not self._mine() or self._backward_depth:  # a nested grad (double backward) is the same pass
            return run(*args, **kwargs)
        self._backward_depth += 1
        weights = self._weights_run(args[0], args[4] if len(args) > 4 else ())
        self._enter(weights or Mark(phase=Phase.BACKWARD))
        try:
            with annotate.closing_block_ranges():
                return run(*args, **kwargs)
        finally:
            self._close(Phase.BACKWARD)
            self._backward_depth -= 1

    def _weights_run(self, outputs: object, inputs: object) -> Mark | None:
        """The mark of a run from nodes inside the graph (gradient edges, not tensors) to the
        program's parameters alone, while marks are read; None for any other run."""
        if not (self._places and inputs and annotate.marks_are_read()):
            return None
        if not all(isinstance(o, GradientEdge) for o in outputs):
            return None
        places = {self._places.get(id(_parameter_of(i)), None) for i in inputs}
        if None in places:
            return None
        stages, layers = {s for s, _ in places}, {layer for _, layer in places}
        return Mark(
            phase=Phase.BACKWARD,
            stage=stages.pop() if len(stages) == 1 else None,
            layer=layers.pop() if len(layers) == 1 else None,
            part=Part.WEIGHTS,
        )

    # -- optimizer -------------------------------------------------------------------------------
    def _optimizer_begins(self, optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        if self._mine() and Phase.OPTIMIZER not in self._open:
            self._enter(Mark(phase=Phase.OPTIMIZER))

    def _optimizer_ends(self, optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        if not self._mine():
            return
        self._close(Phase.OPTIMIZER)
        if not self._rooted:
            self._rooted = True
            roots = self._roots = root_modules(optimizer)
            for root in roots:
                self._handles += [
                    root.register_forward_pre_hook(self._forward_begins, prepend=True),
                    root.register_forward_hook(self._forward_ends, always_call=True),
                ]
            if self.marks_layers:
                self._handles += LayerMarks(lambda: self._mine() and not self._backward_depth).install(roots)
                self._places = parameter_places(roots)

    def held_parameters(self) -> HeldParameters | None:
        """What the program's parameters hold now, each in its layer block
        (``prism.capture.held_parameters.program_parameters``); None before its first optimizer step."""
        if not self._roots:
            return None
        optimizers = [obj for obj in gc.get_objects() if issubclass(type(obj), torch.optim.Optimizer)]
        return program_parameters(self._roots, optimizers)

    # -- forward ---------------------------------------------------------------------------------
    def _forward_begins(self, module: torch.nn.Module, args: object) -> None:
        if not self._mine() or self._backward_depth:
            return
        self._forward_depth += 1
        if self._forward_depth == 1:
            # Which root runs, where a rank has several (a schedule's stages on one rank, two
            # models trained together): their passes are no microbatches of one stage.
            several = len(self._roots) > 1
            stage = next(i for i, r in enumerate(self._roots) if r is module) if several else None
            self._enter(Mark(phase=Phase.FORWARD, stage=stage))

    def _forward_ends(self, module: torch.nn.Module, args: object, output: object) -> None:
        if not self._mine() or self._backward_depth or not self._forward_depth:
            return
        self._forward_depth -= 1
        if self._forward_depth == 0:
            self._close(Phase.FORWARD)
