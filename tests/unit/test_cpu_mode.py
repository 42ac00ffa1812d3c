"""CPU mode answers a GPU program's set-up calls for the CPU and changes nothing it computes.

It patches torch process-wide, so it is checked in a process of its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from torch._utils import _get_available_device_type
    from prism.capture.cpu_mode import install_cpu_mode
    from prism.capture.interpose import UnsupportedCall

    assert _get_available_device_type() is None  # what GPU programs read as "cuda"
    install_cpu_mode()
    import torch._utils
    device = torch._utils._get_available_device_type()
    module = torch._utils._get_device_module(device)
    assert device == "cpu" and module is torch.cpu, device
    assert module.get_device_name(torch.device("cpu")) and module.get_device_properties("cpu").total_memory > 2**30
    assert module.memory_stats("cpu") == {} and module.reset_peak_memory_stats() is None and module.empty_cache() is None

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    dist.barrier(device_ids=[module.current_device()])  # ["cpu"]: gloo would refuse it
    # PREMUL_SUM, which gloo refuses: the scaled sum NCCL computes.
    x = torch.arange(4.0)
    dist.all_reduce(x, op=dist.ReduceOp.PREMUL_SUM(0.5))
    assert x.tolist() == [0.0, 0.5, 1.0, 1.5], x
    out, source = torch.empty(4), torch.arange(4.0)
    dist.reduce_scatter_tensor(out, source, op=dist.ReduceOp.PREMUL_SUM(2.0))
    assert out.tolist() == [0.0, 2.0, 4.0, 6.0] and source.tolist() == [0.0, 1.0, 2.0, 3.0]

    # A compiled FlexAttention trains on the CPU: forward and gradients as SDPA's.
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    compiled = torch.compile(flex_attention)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 16, requires_grad=True) for _ in range(3))
    mask = create_block_mask(lambda b, h, i, j: i >= j, 2, 4, 64, 64, device="cpu")
    out = compiled(q, k, v, block_mask=mask)
    out.sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref.sum().backward()
    assert (out - ref).abs().max() < 1e-5
    assert max((g - t.grad).abs().max() for g, t in zip(grads, (q, k, v))) < 1e-5

    try:
        torch.cuda.set_device(0)  # the line named below
    except UnsupportedCall as e:
        assert "torch.cuda.set_device at " in str(e) and "<string>:" in str(e), e
    else:
        raise AssertionError("torch.cuda.set_device passed")
    print("ok")
    """
)


def test_cpu_mode_answers_set_up_calls_and_keeps_the_numerics() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


UNEVEN_ALL_TO_ALL = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist, torch.multiprocessing as mp
    from prism.capture.cpu_mode import install_cpu_mode

    def run(rank, path):
        install_cpu_mode()
        dist.init_process_group("gloo", store=dist.FileStore(path, 2), rank=rank, world_size=2)
        # Rank r sends r + 1 + j rows of 3 to rank j, each row filled with 10 r + j (what gloo
        # refuses: tensors of several sizes in one list).
        sent = [torch.full((rank + 1 + j, 3), 10.0 * rank + j) for j in range(2)]
        for async_op in (False, True):
            got = [torch.empty(j + 1 + rank, 3) for j in range(2)]
            work = dist.all_to_all(got, sent, async_op=async_op)
            if async_op:
                work.wait()
            assert [tuple(t.shape) for t in got] == [(j + 1 + rank, 3) for j in range(2)]
            assert all(bool((t == 10.0 * j + rank).all()) for j, t in enumerate(got)), got
        # Even lists go to gloo's own all_to_all as before.
        got = [torch.empty(2) for _ in range(2)]
        dist.all_to_all(got, [torch.full((2,), float(rank))] * 2)
        assert [t.tolist() for t in got] == [[0.0, 0.0], [1.0, 1.0]]
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(run, args=(sys.argv[1],), nprocs=2)
        print("ok")
    """
)


def test_an_all_to_all_of_uneven_lists_runs_on_gloo_with_the_chunks_each_rank_sent(tmp_path) -> None:
    script = tmp_path / "uneven.py"
    script.write_text(UNEVEN_ALL_TO_ALL)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "store")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
