"""The fig8 GPU search ("GPUs Tangram needs") runs the node counts it reports, also when the
sensitivity sweep scales the GPU capacity: the MOPD workload is scaled by `gpu_capacity`, and
the search used to undo `capacity` instead, so at x1.25 it ran 1, 2, 4, 5, 6 nodes as 1..5."""

import pytest

from evaluation.experiments.common import Runner, overriding
from evaluation.experiments.fig8gpu import _need, exact_nodes


@pytest.mark.parametrize("factor", [0.75, 1.0, 1.25, 1.5])
def test_exact_nodes_undo_the_gpu_factor(factor):
    with overriding({"size": {"gpu_capacity": factor}}):
        assert [exact_nodes(16, n).gpu.nodes for n in range(1, 7)] == [1, 2, 3, 4, 5, 6]


def test_search_rows_name_the_nodes_that_ran():
    cfg = {"at": 16, "nodes": 2}
    with overriding({"size": {"gpu_capacity": 1.5}}), Runner(3, quiet=True) as runner:
        _, rows = _need(cfg, runner, base=0.0)  # base 0: no count meets it, every one runs
    assert [r["x"] for r in rows] == [8, 16, 24]  # round(2 x 1.5) = 3 nodes, each run exactly
