"""Ending one Ray cluster of the launcher's (serving/ray/launcher.py): every process it started,
found by its node sessions and by the marker variable each of its processes carries."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from serving import processes

MARKER_ENV = "RAY_LAUNCHER_RUN"
STOP_GRACE_S = 5.0


def log(message: str) -> None:
    print(f"[ray-launcher] {message}", file=sys.stderr, flush=True)


def session_processes(marker: str) -> list[psutil.Process]:
    """Every live process of one cluster (its marker variable's value), zombies left out."""
    return [p for p in processes.tagged(MARKER_ENV, marker) if processes.process(p.pid) is not None]


def end_cluster(workdir: Path, node_procs: list[subprocess.Popen] | None = None,
                node_pids: tuple[int, ...] = ()) -> None:
    """Every process of one cluster ended: each node's session (ray start, its daemons, their workers)
    and whatever carries the cluster's marker outside those groups (workers in groups of their own,
    HAProxy): SIGTERM to all at once, SIGKILL to what is left after the grace period, then a last sweep.
    `node_procs`: the nodes this process started; `node_pids`: those another process started."""
    began = time.monotonic()
    procs = list(node_procs or [])
    pids = [n.pid for n in procs] + list(node_pids)
    tagged = session_processes(str(workdir))
    for pid in pids:
        _signal_group(pid, signal.SIGTERM)
    alive = [p for p in (processes.process(pid) for pid in pids) if p is not None]
    killed = processes.end(list({p.pid: p for p in [*alive, *tagged]}.values()), grace_s=STOP_GRACE_S)
    for pid in pids:
        _signal_group(pid, signal.SIGKILL)
    for node in procs:
        try:
            node.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log(f"node process {node.pid} did not exit after SIGKILL")
    late = session_processes(str(workdir))
    processes.end(late, grace_s=0.0)
    if killed or late:
        log(f"{len(killed)} process(es) needed SIGKILL, {len(late)} more found after the nodes ended")
    log(f"stopped in {time.monotonic() - began:.1f} s")


def stop_detached(state: Mapping[str, Any]) -> None:
    """End a cluster `RayServe.detach` left running, and remove its folder."""
    workdir = Path(state["workdir"])
    end_cluster(workdir, node_pids=tuple(int(p) for p in state.get("node_pids", ())))
    shutil.rmtree(workdir, ignore_errors=True)


def _signal_group(pid: int, signum: signal.Signals) -> None:
    """SIGTERM or SIGKILL to a node's whole process group (its session: start_new_session)."""
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return
    if pgid != pid:  # not the group it leads: never signal someone else's group
        return
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return
