"""The built-in reference workload: a GPT decoder LM with Megatron-style tensor parallelism,
non-interleaved 1F1B pipeline parallelism and bucketed data-parallel gradient averaging.

    from prism.capture.workloads.gpt.config import GPTConfig
    from prism.capture.workloads.gpt.train import GPTWorkload
    wl = GPTWorkload(cfg)          # after torch.distributed is initialised, world == cfg.layout
    result = wl.train_step(it)     # result.loss on the last stage, None elsewhere

The package imports nothing itself, so that its configuration is read without torch.
"""
