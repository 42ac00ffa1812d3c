"""prism-build-graph's up-front check that the graph fits the machine (memory, then disk)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prism.graph.build.builder import (
    BUILD_BYTES_PER_NODE,
    FILE_BYTES_PER_NODE,
    MEMORY_BASE_BYTES,
    SIMULATE_BYTES_PER_NODE,
    BuildError,
    check_room,
)

GIB = 2**30


def test_a_graph_that_fits_passes(tmp_path: Path) -> None:
    check_room(tmp_path / "g.parquet", 23_000_000, available_memory=16 * GIB, free_disk=10 * GIB)


def test_too_little_memory_names_what_the_graph_needs_and_what_there_is(tmp_path: Path) -> None:
    nodes = 100_000_000
    with pytest.raises(BuildError) as error:
        check_room(tmp_path / "g.parquet", nodes, available_memory=GIB, free_disk=100 * GIB)
    needed = (MEMORY_BASE_BYTES + BUILD_BYTES_PER_NODE * nodes) / GIB
    assert f"{nodes:,} nodes" in str(error.value) and f"{needed:.1f} GiB" in str(error.value)
    assert "1.0 GiB are available" in str(error.value)


def test_a_graph_simulated_after_its_build_needs_the_simulations_memory(tmp_path: Path) -> None:
    nodes = 50_000_000  # fits a build, not the simulation after it
    memory = MEMORY_BASE_BYTES + BUILD_BYTES_PER_NODE * nodes + GIB
    assert memory < MEMORY_BASE_BYTES + SIMULATE_BYTES_PER_NODE * nodes
    check_room(tmp_path / "g.parquet", nodes, available_memory=memory, free_disk=100 * GIB)
    with pytest.raises(BuildError, match="building and simulating it.*without --simulate"):
        check_room(
            tmp_path / "g.parquet", nodes, simulated_nodes=nodes, available_memory=memory, free_disk=100 * GIB
        )
    # The simulation reads each distinct dp replica once: 1 of 64 fits.
    check_room(
        tmp_path / "g.parquet",
        nodes,
        simulated_nodes=nodes // 64,
        available_memory=memory,
        free_disk=100 * GIB,
    )


def test_too_little_disk_names_the_directory(tmp_path: Path) -> None:
    nodes = 10_000_000
    with pytest.raises(BuildError, match=str(tmp_path)) as error:
        check_room(
            tmp_path / "g.parquet",
            nodes,
            available_memory=64 * GIB,
            free_disk=FILE_BYTES_PER_NODE * nodes - 1,
        )
    assert "GiB on disk" in str(error.value)
