"""prism-capture -- train.py: an unmodified torch.distributed program captured at a large world."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from prism.capture.cli import app
from prism.graph.build.cli import app as build_app
from prism.graph.io.validate import validate_graph
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import simulate
from prism.schemas.comm_log import read_comm_log
from prism.schemas.manifest import CaptureFiles, read_manifest
from tests.integration.programs import replayed

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
runner = CliRunner()
TINY_DDP = ("--hidden", "32", "--layers", "1", "--vocab", "64", "--batch", "2", "--seq", "8")


def capture(tmp_path: Path, *options: str, program: tuple[str, ...]):
    out = tmp_path / "cap"
    result = runner.invoke(app, [*options, "-o", str(out), "--", *program])
    return result, out


def error_line(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("error:"))


@pytest.mark.slow
def test_ddp_at_1024_ranks_is_captured_from_its_optimizer_steps(tmp_path: Path) -> None:
    layout = ("--tp", "1", "--pp", "1", "--dp", "1024")
    program = (str(EXAMPLES / "ddp.py"), "--steps", "50", *TINY_DDP)
    result, out = capture(tmp_path, *layout, "--warmup", "3", "--iterations", "2", program=program)
    assert result.exit_code == 0, result.output
    manifest = read_manifest(out)
    assert manifest.job.workload == "program" and manifest.layout.world_size == 1024
    (rank,) = manifest.ranks
    assert rank.rank == 0
    # Five optimizer steps were five iterations, then prism ended the program (50 asked for).
    assert len(rank.result.iteration_ns) == 5
    assert rank.result.parameter_count > 0
    files = CaptureFiles(out)
    log = read_comm_log(files.comm(0))
    assert log.world_size == 1024
    # DDP's gradient all-reduces went through prism's backend over all 1024 ranks, every
    # iteration; its set-up (parameter verification and broadcast) came first.
    reductions = [c for c in log.calls if c.op == "all_reduce" and c.group_size == 1024]
    assert len(reductions) >= 5
    assert {c.op for c in log.calls[:3]} & {"all_gather", "broadcast"}
    assert files.kineto(0).is_file() and files.et(0).is_file()


TINY_MODEL = (
    "--steps",
    "50",
    "--hidden",
    "32",
    "--layers",
    "2",
    "--vocab",
    "64",
    "--batch",
    "2",
    "--seq",
    "8",
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("example", "layout", "expected"),
    [
        # FSDP2: per-block all-gathers (in place: the input is the rank's own slot of the output)
        # and reduce-scatters over all dp ranks.
        ("fsdp2.py", (1, 1024), {("all_gather", "dp.0"), ("reduce_scatter", "dp.0")}),
        # DTensor tp inside FSDP2 on a 2-D mesh: init_device_mesh makes every tp and dp group
        # (the rank belongs to one of each), the tp all-reduces and the dp all-gathers land on them.
        (
            "tp_fsdp.py",
            (2, 512),
            {("all_reduce", "tp.0"), ("all_gather", "dp.0"), ("reduce_scatter", "dp.0")},
        ),
    ],
)
def test_sharded_programs_are_captured_at_1024_ranks_and_replayed(
    tmp_path: Path, example: str, layout: tuple[int, int], expected: set[tuple[str, str]]
) -> None:
    tp, dp = layout
    extra = ("--tp", str(tp)) if example == "tp_fsdp.py" else ()
    program = (str(EXAMPLES / example), *extra, *TINY_MODEL)
    # Three clean warm-up iterations: the profiler correction is their median, which one
    # iteration slowed by a busy machine does not move.
    options = ("--tp", str(tp), "--pp", "1", "--dp", str(dp), "--warmup", "5", "--iterations", "2")
    result, out = capture(tmp_path, *options, program=program)
    assert result.exit_code == 0, result.output
    (rank,) = read_manifest(out).ranks
    assert len(rank.result.iteration_ns) == 7
    log = read_comm_log(CaptureFiles(out).comm(0))
    calls = {(c.op, c.label) for c in log.calls}
    assert expected <= calls, calls
    assert all(
        c.group_size == {"tp": tp, "dp": dp}[c.label[:2]] for c in log.calls if c.label[:2] in ("tp", "dp")
    )
    # ... and its graph is built from the traces alone, valid, and simulates.
    graph = tmp_path / "graph.parquet"
    built = runner.invoke(
        build_app, [str(out), "--tp", str(tp), "--pp", "1", "--dp", str(dp), "-o", str(graph)]
    )
    assert built.exit_code == 0, built.output
    assert validate_graph(graph).ok
    assert simulate(load_sim_graph(graph), iterations=2).iteration_ns.min() > 0
    assert abs(replayed(graph, 9).mem_err_pct) < 0.1  # one rank for real, with its memory


def test_the_calls_programs_make_work_with_one_real_rank_among_1024(tmp_path: Path) -> None:
    tour = Path(__file__).resolve().parents[1] / "data" / "programs" / "api_tour.py"
    options = ("--tp", "2", "--pp", "1", "--dp", "512", "--warmup", "3", "--iterations", "2")
    result, out = capture(tmp_path, *options, program=(str(tour),))
    assert result.exit_code == 0, result.output
    log = read_comm_log(CaptureFiles(out).comm(0))
    labels = {g.label for g in log.groups}
    assert {"world", "tp.0", "dp.0"} <= labels
    ops = {c.op for c in log.calls}
    assert {"all_reduce", "barrier", "all_gather", "broadcast", "send", "recv"} <= ops
    # The training loop's gradient all-reduce on the dp group, once per captured iteration.
    grads = [c for c in log.calls if c.op == "all_reduce" and c.label == "dp.0"]
    assert len(grads) == 5


def test_a_missing_program_is_one_error_line(tmp_path: Path) -> None:
    result, out = capture(tmp_path, "--tp", "1", "--pp", "1", "--dp", "4", program=("no_such_train.py",))
    assert result.exit_code == 2
    assert "program not found: no_such_train.py" in error_line(result.output)
    assert not out.exists()


def test_a_program_captured_for_one_profiled_iteration_is_refused(tmp_path: Path) -> None:
    program = (str(EXAMPLES / "ddp.py"), *TINY_DDP)
    result, out = capture(tmp_path, "--dp", "4", "--iterations", "1", program=program)
    assert result.exit_code == 2
    assert "--iterations must be at least 2 for a program" in error_line(result.output)
    assert not out.exists()


def test_a_program_that_raises_shows_its_traceback_and_leaves_nothing(tmp_path: Path) -> None:
    script = tmp_path / "boom.py"
    script.write_text(
        "import torch.distributed as dist\ndist.init_process_group('gloo')\nraise ValueError('bad batch size 7')\n"
    )
    result, out = capture(tmp_path, "--tp", "1", "--pp", "1", "--dp", "4", program=(str(script),))
    assert result.exit_code == 2
    assert "rank 0 exited with code 1" in error_line(result.output)
    assert "ValueError: bad batch size 7" in result.output
    assert not out.exists()


def test_a_program_that_never_initialises_torch_distributed_is_an_error(tmp_path: Path) -> None:
    script = tmp_path / "local.py"
    script.write_text("print('training alone')\n")
    result, out = capture(tmp_path, "--tp", "1", "--pp", "1", "--dp", "4", program=(str(script),))
    assert result.exit_code == 2
    assert "never initialised torch.distributed" in result.output
    assert not out.exists()


def test_a_program_with_too_few_steps_says_how_many_it_made(tmp_path: Path) -> None:
    program = (str(EXAMPLES / "ddp.py"), "--steps", "2", *TINY_DDP)
    result, out = capture(tmp_path, "--tp", "1", "--pp", "1", "--dp", "4", "--warmup", "3", program=program)
    assert result.exit_code == 2
    assert "ended after 2 optimizer step(s); the capture needs 5" in result.output
    assert not out.exists()


def test_a_call_prism_cannot_emulate_names_itself_and_the_programs_line(tmp_path: Path) -> None:
    script = tmp_path / "watchdog.py"
    script.write_text(
        "import torch.distributed as dist\ndist.init_process_group('gloo')\ndist.monitored_barrier()\n"
    )
    result, out = capture(tmp_path, "--tp", "1", "--pp", "1", "--dp", "4", program=(str(script),))
    assert result.exit_code == 2
    assert f"UnsupportedCall: torch.distributed.monitored_barrier at {script}:3" in result.output
    assert not out.exists()


def test_objects_from_a_virtual_rank_are_refused_naming_the_call_and_line(tmp_path: Path) -> None:
    script = tmp_path / "objects.py"
    script.write_text(
        "import torch.distributed as dist\ndist.init_process_group('gloo')\n"
        "got = [None]\ndist.broadcast_object_list(got, src=0)\ndist.recv_object_list(got, src=3)\n"
    )
    result, out = capture(tmp_path, "--tp", "1", "--pp", "1", "--dp", "4", program=(str(script),))
    assert result.exit_code == 2
    # Rank 0's own broadcast passes; the receive from virtual rank 3 stops the run.
    assert f"recv_object_list at {script}:5: the objects come from rank 3, a virtual rank" in " ".join(
        result.output.split()
    )
    assert not out.exists()


TWO_OPTIMIZERS = """
import sys
import torch, torch.distributed as dist
{prelude}
dist.init_process_group("gloo")
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
first = torch.optim.SGD(model[0].parameters(), lr=0.01)
second = torch.optim.SGD(model[1].parameters(), lr=0.01)
def train_step():
    model(torch.ones(4, 8)).sum().backward()
    dist.all_reduce(model[0].weight.grad)  # one call per training step
    first.step()
    second.step()  # two optimizer steps per training step
{loop}
"""
PROFILED_LOOP = """
def written(prof):
    open(sys.argv[1], "w").write("the program's own trace")
schedule = torch.profiler.schedule(wait=1, warmup=1, active=2)
with torch.profiler.profile(schedule=schedule, on_trace_ready=written) as prof:
    for _ in range(6):
        train_step()
        prof.step()
"""
MARKED_LOOP = """
for i in range(6):
    with annotate.iteration(i):
        train_step()
"""


@pytest.mark.parametrize(
    ("prelude", "loop"),
    [("", PROFILED_LOOP), ("from prism.capture import annotate", MARKED_LOOP)],
    ids=["own-profiler", "own-marks"],
)
def test_a_programs_own_profiler_steps_or_iteration_marks_end_its_iterations(
    tmp_path: Path, prelude: str, loop: str
) -> None:
    script = tmp_path / "two_optimizers.py"
    script.write_text(TWO_OPTIMIZERS.format(prelude=prelude, loop=loop))
    trace = tmp_path / "own_trace.txt"
    result, out = capture(
        tmp_path, "--tp", "1", "--pp", "1", "--dp", "64", "--warmup", "3", "--iterations", "2",
        program=(str(script), str(trace)),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (rank,) = read_manifest(out).ranks
    assert len(rank.result.iteration_ns) == 5
    # Each iteration was a whole training step (one all-reduce), not one of its optimizer steps:
    # prism ended the program after five training steps, not after two and a half.
    log = read_comm_log(CaptureFiles(out).comm(0))
    reductions = [c for c in log.calls if c.op == "all_reduce"]
    assert len(reductions) == 5
    assert not trace.exists()  # prism recorded; the program's own profiler recorded nothing


def test_ddp_captured_at_a_rank_other_than_the_root_passes_ddps_shape_check(tmp_path: Path) -> None:
    # DDP checks its parameters' shapes against rank 0's, broadcast from rank 0 (virtual here):
    # by the layout's symmetry rank 0 holds what rank 7 holds.
    program = (str(EXAMPLES / "ddp.py"), "--steps", "50", *TINY_DDP)
    result, out = capture(
        tmp_path, "--tp", "1", "--pp", "1", "--dp", "1024", "--ranks", "7", "--warmup", "3", "--iterations", "2",
        program=program,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert [r.rank for r in read_manifest(out).ranks] == [7]


def test_optimizers_stepped_in_turn_without_the_programs_own_cuts_are_refused(tmp_path: Path) -> None:
    script = tmp_path / "two_optimizers.py"
    script.write_text(TWO_OPTIMIZERS.format(prelude="", loop="for _ in range(20):\n    train_step()\n"))
    result, out = capture(
        tmp_path, "--tp", "1", "--pp", "1", "--dp", "64", "--warmup", "4", "--iterations", "2",
        program=(str(script),),
    )  # fmt: skip
    assert result.exit_code == 2
    line = error_line(result.output)
    assert "no training step" in line and "torch.profiler" in line
    assert not out.exists()


CONTAINER_OPTIMIZER = """
import sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(4)])
class Container(torch.optim.Optimizer):
    # An Optimizer that steps one inner optimizer per model part (torchtitan's OptimizersContainer).
    def __init__(self, parts):
        self.inner = [torch.optim.AdamW(part.parameters()) for part in parts]
        super().__init__([p for part in parts for p in part.parameters()], dict())
    def step(self, closure=None):
        for optimizer in self.inner:
            optimizer.step()
optimizer = Container([model[:2], model[2:]])
def train_step():
    model(torch.ones(256, 128)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    optimizer.step()
    optimizer.zero_grad()
{loop}
"""


def predicted_ms(tmp_path: Path, loop: str, name: str) -> tuple[float, int, list[int]]:
    """The graph's simulated iteration (ms), the all-reduces rank 0 made, and its calls per kept
    iteration."""
    script = tmp_path / f"{name}.py"
    script.write_text(CONTAINER_OPTIMIZER.format(loop=loop))
    out = tmp_path / name
    options = ("--tp", "1", "--pp", "1", "--dp", "64", "--warmup", "6", "--iterations", "2")
    result = runner.invoke(app, [*options, "-o", str(out), "--", str(script), str(tmp_path / "trace.txt")])
    assert result.exit_code == 0, result.output
    graph = tmp_path / f"{name}.parquet"
    built = runner.invoke(build_app, [str(out), "--tp", "1", "--pp", "1", "--dp", "64", "-o", str(graph)])
    assert built.exit_code == 0, built.output
    reductions = [c for c in read_comm_log(CaptureFiles(out).comm(0)).calls if c.op == "all_reduce"]
    (rank,) = read_manifest(out).ranks
    predicted = float(simulate(load_sim_graph(graph), iterations=2).iteration_ns.mean()) / 1e6
    return predicted, len(reductions), list(rank.result.calls[rank.result.steady_from :])


@pytest.mark.slow
def test_a_container_optimizers_steps_give_the_graph_its_profiler_steps_give(tmp_path: Path) -> None:
    profiled = PROFILED_LOOP.replace("range(6)", "range(20)").replace(
        "wait=1, warmup=1, active=2", "wait=6, warmup=1, active=2"
    )
    from_steps, calls, steps_iterations = predicted_ms(
        tmp_path, "for _ in range(20):\n    train_step()\n", "steps"
    )
    from_profiler, _, profiler_iterations = predicted_ms(tmp_path, profiled, "profiler")
    # Eight training steps, each one iteration with its eight all-reduces, not one per inner optimizer.
    assert calls == 8 * 8
    # The same program cut at its optimizer steps or at its profiler's: the same calls each iteration.
    assert steps_iterations == profiler_iterations and len(set(steps_iterations)) == 1


def test_a_group_outside_the_layout_stops_the_capture_at_once_naming_the_order(tmp_path: Path) -> None:
    # tp_fsdp.py builds its (dp, tp) mesh tp-fastest; captured with dp fastest, its first group is
    # no group of the layout.
    program = (str(EXAMPLES / "tp_fsdp.py"), "--tp", "2", *TINY_MODEL)
    options = (
        "--tp",
        "2",
        "--pp",
        "1",
        "--dp",
        "4",
        "--order",
        "dp-tp-pp",
        "--warmup",
        "3",
        "--iterations",
        "2",
    )
    result, out = capture(tmp_path, *options, program=program)
    assert result.exit_code == 2
    line = error_line(result.output)
    assert "no group of tp=2 pp=1 dp=4 (dp-tp-pp" in line and "tp_fsdp.py:" in line
    assert "would match: --tp 2 --pp 1 --dp 4 --order tp-dp-pp (its dp group)" in line
    assert not out.exists()
