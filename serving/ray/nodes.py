"""`ray start` command lines for one head node and its worker nodes, every port a free loopback one.

A node is one `ray start --block` process in a session of its own: its GCS (head only), raylet,
dashboard agent, log monitor and the raylet's workers are its children and carry its environment,
so the launcher can end them all by process group and by marker variable.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from serving import processes

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
