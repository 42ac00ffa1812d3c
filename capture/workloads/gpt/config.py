"""Configuration of the built-in GPT workload: the record its capture's job and its graphs keep.

The generic stages read only its shape (``prism.schemas.workload``); the GPT's own rules (heads
over tp, layers over pp, ...) are checked here, where the workload is built.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from prism.schemas.layout import ParallelLayout
from prism.schemas.pipeline_shape import PipelineShape, ShapeError
from prism.schemas.workload import DEVICES

DTYPES = ("float32", "float64", "bfloat16", "float16")
ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
INT_FIELDS = (
    "layers",
    "hidden",
    "heads",
    "seq_len",
    "vocab",
    "micro_batch_size",
    "microbatches",
    "tp",
    "pp",
    "dp",
)
"""GPTConfig fields that must be positive integers."""


class ConfigError(ValueError):
    """A model/layout combination that cannot run."""


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """A GPT decoder LM and the parallel layout it is trained with."""

    layers: int = 32
    """Transformer blocks in the whole model (split evenly over pipeline stages)."""
    hidden: int = 256
    """Model width."""
    heads: int = 8
    """Attention heads (split evenly over tensor-parallel ranks)."""
    ffn_hidden: int | None = None
    """MLP inner width; None means 4 * hidden."""
    seq_len: int = 64
    """Tokens per sample."""
    vocab: int = 4096
    """Vocabulary size (split evenly over tensor-parallel ranks)."""
    micro_batch_size: int = 1
    """Samples per microbatch."""
    microbatches: int = 16
    """Microbatches per iteration on each data-parallel rank."""
    tp: int = 8
    """Tensor-parallel degree."""
    pp: int = 16
    """Pipeline-parallel degree."""
    dp: int = 64
    """Data-parallel degree."""
    dtype: str = "float32"
    """Parameter and activation dtype."""
    device: str = "cpu"
    """'cpu' (gloo) or 'cuda' (NCCL)."""
    seed: int = 1234
    """Seed of weights and synthetic data."""
    grad_bucket_mb: float = 25.0
    """Size of the data-parallel gradient all-reduce buckets, in MiB."""
    lr: float = 1e-3
    """Adam learning rate."""

    def __post_init__(self) -> None:
        self.validate()

    @property
    def ffn(self) -> int:
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.hidden

    @property
    def itemsize(self) -> int:
        """Bytes per element of ``dtype``."""
        return ITEMSIZE[self.dtype]

    @property
    def shape(self) -> PipelineShape:
        """Its layout, microbatches and layers (``ShapeError`` where 1F1B cannot run them)."""
        return PipelineShape(
            tp=self.tp, pp=self.pp, dp=self.dp, microbatches=self.microbatches, layers=self.layers
        )

    @property
    def layout(self) -> ParallelLayout:
        return self.shape.layout

    @property
    def layers_per_stage(self) -> int:
        return self.shape.layers_per_stage

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def stage_layers(self, stage: int) -> range:
        """Global indices of the layers that ``stage`` holds."""
        return self.shape.stage_layers(stage)

    def validate(self) -> None:
        for name in INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        ffn = self.ffn_hidden
        if ffn is not None and (isinstance(ffn, bool) or not isinstance(ffn, int) or ffn < 1):
            raise ConfigError(f"ffn_hidden must be a positive integer or None, got {ffn!r}")
        checks = [
            (
                self.hidden % self.heads == 0,
                f"hidden ({self.hidden}) must be divisible by heads ({self.heads})",
            ),
            (self.heads % self.tp == 0, f"heads ({self.heads}) must be divisible by tp ({self.tp})"),
            (self.ffn % self.tp == 0, f"ffn hidden ({self.ffn}) must be divisible by tp ({self.tp})"),
            (self.vocab % self.tp == 0, f"vocab ({self.vocab}) must be divisible by tp ({self.tp})"),
            (self.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}"),
            (self.device in DEVICES, f"device must be one of {', '.join(DEVICES)}, got {self.device!r}"),
            (self.grad_bucket_mb > 0, f"grad bucket size must be positive, got {self.grad_bucket_mb}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        try:
            self.layout  # noqa: B018  (validates the layers over pp, the microbatches, the degrees)
        except ShapeError as e:
            raise ConfigError(str(e)) from None

    def with_layout(self, *, tp: int, pp: int, dp: int) -> GPTConfig:
        return replace(self, tp=tp, pp=pp, dp=dp)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GPTConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown GPT config fields: {', '.join(sorted(unknown))}")
        return cls(**data)
