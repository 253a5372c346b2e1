"""Past one machine, simulated: a Ray cluster of two nodes on this host (head + one worker node, one CPU
each), two replicas of digits spread one per node (checked by node id), the worker node killed whole
under a small closed-loop load: every request gets an HTTP answer (200, or a refusal with its status),
none is lost. The measured run (a spare node, longer load, recovery times) is the ray-node-loss verb."""

from __future__ import annotations

import pytest

from benchmarks.reliability.node_loss import NodeLossPlan, run

pytestmark = pytest.mark.e2e

PLAN = NodeLossPlan(model="digits", worker_nodes=1, replicas=2, cpus_per_node=1, clients=3, before_s=2.0,
                    after_s=4.0, timeout_s=20.0)


def test_a_node_killed_under_load_loses_no_request(model_store):
    result = run(PLAN, model_store, progress=print)
    assert result.spread, f"replicas not one per node: {result.replica_nodes}"
    assert result.killed_node in result.replica_nodes
    assert result.traffic.lost == 0, f"lost silently: {result.traffic.describe()}"
    assert result.after_kill.ok > 0, f"nothing served after the kill: {result.after_kill.describe()}"
    assert not result.problems, result.problems
