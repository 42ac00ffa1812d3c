"""What a captured rank's parameters cost it across iterations, one entry a parameter.

Recorded by the capture from the model and optimizer (``prism.capture.held_parameters``) in
every captured rank's result, so that the graph builder can give a target stage that holds other
layers than the captured one its static memory and its gradient buckets without knowing the
model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


class HeldParametersError(ValueError):
    """A record that cannot describe a rank's parameters."""


@dataclass(frozen=True, kw_only=True)
class HeldParameters:
    """A rank's parameters in registration order."""

    numels: tuple[int, ...]
    """Elements of each parameter."""
    layers: tuple[int, ...]
    """Global index of the layer block each belongs to (a ``layers.<i>.`` part of its name), -1
    for the parameters outside the blocks (embeddings before them, a head after them)."""
    held_bytes: tuple[int, ...]
    """Bytes each keeps between iterations: itself, its gradient and its optimizer state."""
    itemsize: int
    """Bytes per element of the gradients (what the buckets hold)."""
    bucket_bytes: int
    """Cap of a data-parallel gradient bucket (``prism.schemas.grad_buckets.plan_buckets``); a
    program's: its DistributedDataParallel's cap, 0 where nothing buckets its gradients."""
    first_bucket_bytes: int = 0
    """Cap of the first bucket filled, where smaller than the others' (DDP's default 1 MiB); 0:
    ``bucket_bytes``."""
    bucket_copies: bool = False
    """The buckets hold a copy of every gradient (DDP without ``gradient_as_bucket_view``), so
    each parameter adds its gradient's bytes again to what the rank keeps."""
    stages: tuple[int, ...] = ()
    """Where the rank holds several pipeline stages (an interleaved schedule's), the stage each
    parameter belongs to, as the rank numbers them (its root modules in the order its optimizer
    holds their parameters, ``prism.capture.program_phases``); empty where it holds one."""

    def __post_init__(self) -> None:
        n = len(self.numels)
        if len(self.layers) != n or len(self.held_bytes) != n:
            raise HeldParametersError("numels, layers and held_bytes must have one entry a parameter")
        if min(self.numels, default=1) < 1 or min(self.held_bytes, default=0) < 0:
            raise HeldParametersError("a parameter has at least one element and holds no negative bytes")
        if self.itemsize < 1 or self.bucket_bytes < 0 or self.first_bucket_bytes < 0:
            raise HeldParametersError("itemsize must be positive and bucket_bytes not negative")
        if self.stages and (len(self.stages) != n or min(self.stages) < 0):
            raise HeldParametersError("stages, where given, has one entry a parameter, none negative")

    def chunks(self) -> list[list[int]]:
        """Positions of each stage's parameters, stages in the order they first appear (one
        chunk of every parameter where the rank holds one stage)."""
        if not self.stages:
            return [list(range(len(self.numels)))]
        out: dict[int, list[int]] = {}
        for i, stage in enumerate(self.stages):
            out.setdefault(stage, []).append(i)
        return list(out.values())

    def in_layer(self, layer: int) -> list[int]:
        """Positions of the parameters of ``layer``."""
        return [i for i, at in enumerate(self.layers) if at == layer]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> HeldParameters:
        try:
            return cls(
                numels=tuple(int(x) for x in data["numels"]),
                layers=tuple(int(x) for x in data["layers"]),
                held_bytes=tuple(int(x) for x in data["held_bytes"]),
                itemsize=int(data["itemsize"]),
                bucket_bytes=int(data["bucket_bytes"]),
                first_bucket_bytes=int(data.get("first_bucket_bytes", 0)),
                bucket_copies=bool(data.get("bucket_copies", False)),
                stages=tuple(int(x) for x in data.get("stages", ())),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise HeldParametersError(f"held parameters: {e}") from e
