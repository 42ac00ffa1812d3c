"""More programs captured at 1,024 ranks, built, validated, simulated, and one rank replayed with
its memory: a Hugging Face GPT-2 and torch.compile'd models under DDP, DDP accumulating gradients
under no_sync, a Hugging Face Llama with tensor parallelism inside FSDP2."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from prism.graph.io.parquet import read_rank
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import simulate
from prism.schemas import graph_format as gf
from prism.schemas.comm_log import read_comm_log
from prism.schemas.iterations import clean_unprofiled
from prism.schemas.manifest import CaptureFiles, read_manifest
from tests.integration.programs import captured_and_built, replayed

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LAYOUT = ("--tp", "1", "--pp", "1", "--dp", "1024")
TINY = ("--steps", "50", "--hidden", "32", "--vocab", "64", "--seq", "8", "--batch", "2")

pytestmark = pytest.mark.slow


def check_ddp_program(tmp_path: Path, *program: str) -> None:
    capture, graph = captured_and_built(tmp_path / "cap", LAYOUT, program)
    # DDP's bucket all-reduces span the 1,024 ranks and a wait node waits for each of them.
    nodes = read_rank(graph, 513).to_pandas()
    reduce = nodes.index[nodes[gf.NAME] == "all_reduce"]
    assert len(reduce) >= 1 and (nodes.loc[reduce, gf.GROUP_SIZE] == 1024).all()
    waits = nodes[nodes[gf.NAME] == "prism:wait"]
    assert sorted(d for deps in waits[gf.DEPS] for d in deps) == sorted(reduce.tolist())
    manifest = read_manifest(capture)
    (rank,) = manifest.ranks
    unprofiled = np.median(clean_unprofiled(rank.result.iteration_ns, manifest.job.warmup))
    sim = simulate(load_sim_graph(graph), iterations=2)
    assert 0.5 * unprofiled < sim.iteration_ns[513] < 2 * unprofiled
    assert sim.peak_bytes[513] > rank.result.static_bytes > 0
    assert abs(replayed(graph, 513).mem_err_pct) < 0.1


def test_a_hugging_face_gpt2_under_ddp(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    check_ddp_program(tmp_path, str(EXAMPLES / "hf_gpt2_ddp.py"), *TINY, "--layers", "2", "--heads", "2")


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_a_compiled_model_under_ddp(tmp_path: Path, where: str) -> None:
    flags = ("--compile-inside",) if where == "inside" else ()
    check_ddp_program(tmp_path, str(EXAMPLES / "compile_ddp.py"), *TINY, *flags)


def test_ddp_accumulating_gradients_reduces_them_after_its_last_microbatch_only(tmp_path: Path) -> None:
    program = (
        str(EXAMPLES / "ddp.py"),
        *TINY,
        "--layers",
        "2",
        "--accumulate",
        "3",
        "--bucket-cap-mb",
        "0.001",
    )
    _, graph = captured_and_built(tmp_path / "cap", LAYOUT, program)
    # An iteration is three forward-backward pairs then the optimizer; under no_sync the first two
    # backwards reduce nothing, and the last reduces every bucket (several: 1 KB buckets).
    nodes = read_rank(graph, 513).to_pandas()
    phases = nodes[gf.PHASE].astype(str)
    blocks = [phase for phase, _ in itertools.groupby(p for p in phases if p != "iter")]
    assert blocks == ["fwd", "bwd", "fwd", "bwd", "fwd", "bwd", "optim"]
    reduce = nodes.index[nodes[gf.NAME] == "all_reduce"]
    assert len(reduce) > 1 and (nodes.loc[reduce, gf.GROUP_SIZE] == 1024).all()
    assert reduce.min() > phases[phases == "fwd"].index.max()
    assert abs(replayed(graph, 9).mem_err_pct) < 0.1


def test_a_hugging_face_llama_with_tensor_parallelism_inside_fsdp2(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    layout = ("--tp", "2", "--pp", "1", "--dp", "512")
    program = (str(EXAMPLES / "hf_llama.py"), "--tp", "2", *TINY, "--layers", "2")
    capture, graph = captured_and_built(tmp_path / "cap", layout, program, warmup=3)
    # The projections' all-reduces on the rank's tp group, FSDP2's gathers and reductions on its dp
    # group, and the clipping's norms on both.
    log = read_comm_log(CaptureFiles(capture).comm(0))
    calls = {(c.op, c.label) for c in log.calls}
    assert {
        ("all_reduce", "tp.0"),
        ("all_gather", "dp.0"),
        ("reduce_scatter", "dp.0"),
        ("all_reduce", "dp.0"),
    } <= calls
    sim = simulate(load_sim_graph(graph), iterations=2)
    assert sim.iteration_ns.min() > 0 and sim.peak_bytes.min() > 0
    assert abs(replayed(graph, 9).mem_err_pct) < 0.1
