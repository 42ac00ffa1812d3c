"""The built-in reference workload: a GPT decoder LM with Megatron-style tensor parallelism,
non-interleaved 1F1B pipeline parallelism and bucketed data-parallel gradient averaging.

    from prism.capture.workloads.gpt import GPTWorkload
    wl = GPTWorkload(cfg)          # after torch.distributed is initialised, world == cfg.layout
    result = wl.train_step(it)     # result.loss on the last stage, None elsewhere
"""

from prism.capture.workloads.gpt.train import GPTWorkload, StepResult
from prism.schemas.pipeline_schedule import Action, Step, one_f_one_b

__all__ = ["Action", "GPTWorkload", "Step", "StepResult", "one_f_one_b"]
