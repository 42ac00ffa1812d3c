"""Does a gloo ``isend`` post return before its receiver posts the matching ``irecv``?

    .venv/bin/python benchmarks/gloo_post_late_receiver.py [--late-ms 30] [--repeats 5]

Two local gloo processes; for each size the receiver posts its irecv ``--late-ms`` after the
sender's isend, and the sender's post (the isend call, entry to return) is timed. A post that
waited for the receiver (a rendezvous) would take about ``--late-ms``; one that returns at once
leaves the transfer to gloo's own thread. Prints the median post per size.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES_KIB = (16, 64, 128, 256, 512, 1024, 2048, 4096)


def _rank(rank: int, port: int, late_s: float, repeats: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    for kib in SIZES_KIB:
        x = torch.ones(kib * 256)  # float32: 4 bytes an element
        posts = []
        for _ in range(repeats):
            dist.barrier()
            if rank == 0:
                t = time.perf_counter()
                work = dist.isend(x, 1)
                posts.append(time.perf_counter() - t)
                work.wait()
            else:
                time.sleep(late_s)
                dist.irecv(x, 0).wait()
        if rank == 0:
            print(f"{kib:6d} KiB: post median {statistics.median(posts) * 1e3:7.2f} ms", flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--late-ms", type=float, default=30.0, help="how late the receiver posts")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from torch.distributed.elastic.utils.distributed import get_free_port

    print(
        f"receiver posts {args.late_ms:g} ms after the sender; sender's isend post, median of {args.repeats}"
    )
    mp.spawn(_rank, args=(get_free_port(), args.late_ms / 1e3, args.repeats), nprocs=2)


if __name__ == "__main__":
    main()
