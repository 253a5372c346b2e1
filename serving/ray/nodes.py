"""`ray start` command lines for one head node and its worker nodes, every port a free loopback one.

A node is one `ray start --block` process in a session of its own: its GCS (head only), raylet,
dashboard agent, log monitor and the raylet's workers are its children and carry its environment,
so the launcher can end them all by process group and by marker variable.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from serving import processes
from serving.errors import LauncherError

HOST = "127.0.0.1"
# Each node's own ports; the head adds the GCS port and Ray Client's.
NODE_PORTS = (
    "node-manager-port",
    "object-manager-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
    "metrics-export-port",
)
HEAD_PORTS = ("port", "ray-client-server-port", *NODE_PORTS)
# The smallest object store Ray accepts is 75 MiB; the archives' tensors never go through it.
OBJECT_STORE_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class NodeSpec:
    """One node to start: head (with the cluster's temp dir) or a worker joining `gcs_address`."""

    name: str
    num_cpus: int
    ports: dict[str, int]
    temp_dir: Optional[Path] = None  # the head's; workers on this host share its session folder
    gcs_address: Optional[str] = None  # a worker's head
    dashboard_port: Optional[int] = None  # None: no dashboard

    @property
    def head(self) -> bool:
        return self.gcs_address is None

    def command(self, ray_exe: Path) -> list[str]:
        args = [str(ray_exe), "start", "--block", "--disable-usage-stats", f"--node-ip-address={HOST}",
                f"--num-cpus={self.num_cpus}", f"--object-store-memory={OBJECT_STORE_BYTES}"]
        if self.head:
            args += ["--head", f"--temp-dir={self.temp_dir}"]
            if self.dashboard_port is None:
                args.append("--include-dashboard=false")
            else:
                args += ["--include-dashboard=true", f"--dashboard-host={HOST}", f"--dashboard-port={self.dashboard_port}"]
        else:
            args.append(f"--address={self.gcs_address}")
        args += [f"--{name}={port}" for name, port in self.ports.items()]
        return args


def head(num_cpus: int, temp_dir: Path, dashboard: bool) -> NodeSpec:
    ports = processes.free_loopback_ports(len(HEAD_PORTS) + 1)
    return NodeSpec("head", num_cpus, dict(zip(HEAD_PORTS, ports)), temp_dir=temp_dir,
                    dashboard_port=ports[-1] if dashboard else None)


def worker(index: int, num_cpus: int, gcs_address: str) -> NodeSpec:
    ports = processes.free_loopback_ports(len(NODE_PORTS))
    return NodeSpec(f"worker-{index}", num_cpus, dict(zip(NODE_PORTS, ports)), gcs_address=gcs_address)


# Serve's replicas take their direct-ingress ports (HAProxy sends to them) from one range per host
# unless told otherwise (HTTP 30000-31000, gRPC 40000-41000): two clusters on one host would share
# it, and a port a dead replica freed could go to the other cluster's replica, which the first
# cluster's HAProxy would then send its requests to. Each cluster takes its own block of free ones.
REPLICA_PORT_BLOCK = 100
# Ports a cluster's processes bind late (replicas, HAProxy, Serve's HTTP port) come from above Ray's
# worker ports (10002-19999) and below Linux's ephemeral range (32768-60999) and Serve's own default
# (30000): a free port picked there is not taken meanwhile by a port-0 bind or an outgoing connection
# of the processes that start first.
REPLICA_PORT_SPAN = (20000, 28000)
SPARE_PORT_SPAN = (28000, 30000)


def replica_port_env(rng: Optional[random.Random] = None, tries: int = 50) -> dict[str, str]:
    """Serve's direct-ingress port ranges for one cluster: an HTTP and a gRPC block, each of ports all
    free on 127.0.0.1 when picked, at random among the span's blocks (two clusters rarely meet)."""
    rng = rng or random.Random()
    low, high = REPLICA_PORT_SPAN
    blocks = list(range(low, high, REPLICA_PORT_BLOCK))
    picked: list[int] = []
    for base in rng.sample(blocks, min(tries, len(blocks))):
        if all(processes.loopback_port_free(port) for port in range(base, base + REPLICA_PORT_BLOCK)):
            picked.append(base)
            if len(picked) == 2:
                http, grpc = picked
                return {"RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(http),
                        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(http + REPLICA_PORT_BLOCK - 1),
                        "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": str(grpc),
                        "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": str(grpc + REPLICA_PORT_BLOCK - 1)}
    raise LauncherError(f"no two blocks of {REPLICA_PORT_BLOCK} free loopback ports in {low}-{high} for the "
                        "replicas: free some ports, or stop other servers")


def spare_ports(count: int, avoid: Collection[int] = (), rng: Optional[random.Random] = None,
                tries: int = 500) -> tuple[int, ...]:
    """`count` distinct ports of SPARE_PORT_SPAN, none in `avoid`, each free on every interface when picked."""
    rng = rng or random.Random()
    low, high = SPARE_PORT_SPAN
    picked: list[int] = []
    for port in rng.sample(range(low, high), min(tries, high - low)):
        if port not in avoid and processes.port_free_everywhere(port):
            picked.append(port)
            if len(picked) == count:
                return tuple(picked)
    raise LauncherError(f"no {count} free ports in {low}-{high} for the cluster: free some ports, or stop other servers")
