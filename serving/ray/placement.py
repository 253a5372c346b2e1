"""Where a cluster's Serve replicas run: each live replica's node, from the GCS's own tables.

    python -m serving.ray.placement --address 127.0.0.1:<gcs port>

prints one JSON object: `nodes` (node id, node manager port, alive) and `replicas` (app, node id,
pid) for every live replica. A driver process of its own (no dashboard needed), so the caller never
joins the cluster; `placement(gcs, env)` runs it and parses the answer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from serving.errors import LauncherError
from serving.repo import REPO_ROOT

REPLICA_CLASS = "ServeReplica:"  # Serve's replica actors: ServeReplica:<app>:<deployment>
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Placement:
    nodes: tuple[dict, ...]  # {"node_id", "node_manager_port", "alive"}
    replicas: tuple[dict, ...]  # {"app", "node_id", "pid"}

    def node_of_port(self, node_manager_port: int) -> str:
        for node in self.nodes:
            if node["node_manager_port"] == node_manager_port:
                return node["node_id"]
        raise LauncherError(f"no node of the cluster has node manager port {node_manager_port}")

    def replica_nodes(self, app: str) -> list[str]:
        return sorted(r["node_id"] for r in self.replicas if r["app"] == app)


def placement(gcs_address: str, env: Mapping[str, str]) -> Placement:
    """The cluster's placement, read by a driver process (`env`: the cluster's, for PYTHONPATH and TMPDIR)."""
    try:
        done = subprocess.run([sys.executable, "-m", "serving.ray.placement", "--address", gcs_address],
                              cwd=REPO_ROOT, env=dict(env), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LauncherError(f"reading the placement from {gcs_address} took over {TIMEOUT_S:.0f} s") from exc
    if done.returncode != 0:
        raise LauncherError(f"reading the placement from {gcs_address} failed: {done.stderr.strip()[-2000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return Placement(tuple(found["nodes"]), tuple(found["replicas"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.ray.placement", description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="the head's GCS address, host:port")
    args = parser.parse_args(argv)

    import ray
    from ray._private import state

    ray.init(address=args.address, logging_level="error", log_to_driver=False)
    try:
        nodes = [{"node_id": n["NodeID"], "node_manager_port": n["NodeManagerPort"], "alive": n["Alive"]}
                 for n in ray.nodes()]
        replicas = [{"app": info["ActorClassName"].split(":")[1], "node_id": info["Address"]["NodeID"],
                     "pid": info["Pid"]}
                    for info in state.actors(actor_state_name="ALIVE").values()
                    if info["ActorClassName"].startswith(REPLICA_CLASS)]
    finally:
        ray.shutdown()
    print(json.dumps({"nodes": nodes, "replicas": replicas}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
