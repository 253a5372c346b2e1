"""A Ray cluster node lost under load: every request answered or refused, none lost, and the recovery.

A Ray cluster on this host (serving/ray/launcher.py): a head and `--worker-nodes` more nodes, each
with `--cpus-per-node` CPUs; the model's replicas spread one per node (`max_replicas_per_node: 1` in
the Serve config deployed, checked by node id from the GCS's actor table). Clients keep sending;
the node of a replica that is not on the head (Serve's proxy and controller live there) is killed
whole (SIGKILL to every process of that node, as a machine lost). Counted: requests answered 200,
refused (any other HTTP status, by status), lost (no HTTP answer within the timeout: the property
is that there are none); the time from the kill to the last failed answer (after it, every answer
is 200), and, when a node is spare, the time until the replicas are back to their number.

    python -m benchmarks ray-node-loss [--model digits] [--worker-nodes 2] [--clients 4]
"""

from __future__ import annotations

import json
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

import psutil

from benchmarks.load import cli
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.loadgen import Target
from benchmarks.load.traffic import ClosedLoop, Traffic, payloads, say
from serving.ray import nodes, serve_config
from serving.ray.launcher import RayServe
from serving.ray.placement import Placement, placement
from serving.repo import shown

Progress = Callable[[str], None]
POLL_S = 0.5


@dataclass(frozen=True)
class NodeLossPlan:
    model: str = "digits"
    worker_nodes: int = 2  # a spare node: the lost replica can come back elsewhere
    replicas: int = 2
    cpus_per_node: int = 1
    clients: int = 4
    before_s: float = 4.0  # load before the kill
    after_s: float = 12.0  # load after it
    timeout_s: float = 30.0  # a request with no answer by then is lost
    replace_wait_s: float = 30.0  # after the load: how long to wait for the replicas to be back


@dataclass(frozen=True)
class NodeLossResult:
    plan: NodeLossPlan
    ready_s: float
    replica_nodes: tuple[str, ...]  # node id of each replica before the kill
    killed_node: str
    killed_processes: int
    traffic: Traffic  # the whole run
    after_kill: Traffic  # requests sent after the kill
    last_failure_s: Optional[float]  # kill -> the last request that did not get 200 (None: none failed)
    first_ok_s: Optional[float]  # kill -> the first 200 sent after the kill
    replicas_back_s: Optional[float]  # kill -> the replicas back to their number on live nodes (None: not within the wait)
    # The GCS's view after the load: a killed node's replica stays listed until the GCS declares the
    # node dead (its health checks time out), while Serve already routes around it.
    replica_nodes_after: tuple[str, ...]

    @property
    def spare(self) -> bool:
        """A node without a replica: the lost replica can come back there."""
        return 1 + self.plan.worker_nodes > self.plan.replicas

    @property
    def spread(self) -> bool:
        return len(set(self.replica_nodes)) == len(self.replica_nodes) == self.plan.replicas

    @property
    def problems(self) -> tuple[str, ...]:
        out = []
        if not self.spread:
            out.append(f"replicas not one per node: {self.replica_nodes}")
        if self.traffic.lost:
            out.append(f"{self.traffic.lost} request(s) lost: no HTTP answer within {self.plan.timeout_s:.0f} s")
        if not self.traffic.ok:
            out.append("no request succeeded")
        if self.spare and self.replicas_back_s is None:
            out.append(f"replicas not back to {self.plan.replicas} on live nodes {self.plan.replace_wait_s:g} s after the load")
        return tuple(out)

    def to_json(self) -> dict:
        traffic = {name: {"sent": t.sent, "ok": t.ok, "refused": dict(t.errors), "lost": t.lost}
                   for name, t in (("all", self.traffic), ("after_kill", self.after_kill))}
        return {"plan": asdict(self.plan), "ready_s": round(self.ready_s, 1), "replica_nodes": list(self.replica_nodes),
                "spread": self.spread, "killed_node": self.killed_node, "killed_processes": self.killed_processes,
                "traffic": traffic, "last_failure_s": _round(self.last_failure_s), "first_ok_s": _round(self.first_ok_s),
                "replicas_back_s": _round(self.replicas_back_s), "replica_nodes_after": list(self.replica_nodes_after),
                "problems": list(self.problems)}


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 2)


def serve_file(model_store: Path, plan: NodeLossPlan, folder: Path) -> Path:
    """The model's Serve config with `plan.replicas` replicas of one CPU each, at most one per node."""
    (app,) = serve_config.plans(model_store, (plan.model,), {})
    settings = replace(app.settings, min_workers=plan.replicas, max_workers=plan.replicas, threads=1)
    config = serve_config.portable((replace(app, settings=settings),), max_replicas_per_node=1)
    return serve_config.write(folder / "serve.yaml", config)


def gcs_address(ray_serve: RayServe) -> str:
    if ray_serve.head is None:
        raise BenchmarkError("the Ray cluster is not running")
    return f"{nodes.HOST}:{ray_serve.head.ports['port']}"


def node_process(ray_serve: RayServe, pid: int) -> int:
    """The `ray start` process (one node) a replica process runs under."""
    node_pids = set(ray_serve.node_pids)
    for parent in psutil.Process(pid).parents():
        if parent.pid in node_pids:
            return parent.pid
    raise BenchmarkError(f"replica pid {pid} runs under none of the cluster's nodes {sorted(node_pids)}")


def kill_node(node_pid: int) -> int:
    """SIGKILL a node's every process (its `ray start`, raylet, agents, workers): a machine lost."""
    root = psutil.Process(node_pid)
    victims = [root, *root.children(recursive=True)]
    for proc in victims:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(victims, timeout=10)
    return len(victims)


def _victim(ray_serve: RayServe, where: Placement, model: str) -> tuple[str, int]:
    """(node id, node pid) of a replica's node other than the head."""
    head = where.node_of_port(ray_serve.head.ports["node-manager-port"]) if ray_serve.head else ""
    for replica in where.replicas:
        if replica["app"] == model and replica["node_id"] != head:
            return replica["node_id"], node_process(ray_serve, replica["pid"])
    raise BenchmarkError(f"every replica of {model} is on the head node: nothing to kill but the head")


def run(plan: NodeLossPlan, model_store: Path, progress: Progress = say) -> NodeLossResult:
    with tempfile.TemporaryDirectory(prefix="node-loss-") as folder:
        config = serve_file(model_store, plan, Path(folder))
        with RayServe(model_store, serve_file=config, worker_nodes=plan.worker_nodes,  # as measured: Serve's proxy
                      num_cpus=plan.cpus_per_node, haproxy=False) as ray_serve:
            gcs, env = gcs_address(ray_serve), ray_serve.driver_env()
            before = placement(gcs, env)
            replica_nodes = tuple(before.replica_nodes(plan.model))
            progress(f"{len(replica_nodes)} replica(s) of {plan.model} on nodes {[n[:8] for n in replica_nodes]}")
            killed_node, node_pid = _victim(ray_serve, before, plan.model)
            target = Target.for_model(ray_serve.inference_url, plan.model, ray_serve.tokens.inference, plan.timeout_s)
            loop = ClosedLoop(target, payloads(plan.model), plan.clients, plan.before_s + plan.after_s + 60)
            with loop:
                time.sleep(plan.before_s)
                progress(f"killing node {killed_node[:8]} (pid {node_pid}) under {plan.clients} clients")
                killed_at = time.perf_counter()
                killed = kill_node(node_pid)
                # A spare node: the lost replica can come back there (polled under the load); none: the load goes on.
                spare = 1 + plan.worker_nodes > plan.replicas
                replicas_back = _wait_replicas(gcs, env, plan, killed_node, killed_at, killed_at + plan.after_s) if spare else None
                time.sleep(max(0.0, killed_at + plan.after_s - time.perf_counter()))
                traffic = loop.stop()
            if replicas_back is None and spare:
                replicas_back = _wait_replicas(gcs, env, plan, killed_node, killed_at, time.perf_counter() + plan.replace_wait_s)
            after = placement(gcs, env)
            samples = loop.snapshot()
            late = [s for s in samples if s.sent >= killed_at]
            failed = [s.done - killed_at for s in samples if s.status != 200 and s.done >= killed_at]
            first_ok = [s.done - killed_at for s in late if s.status == 200]
            return NodeLossResult(plan, ray_serve.started_s or 0.0, replica_nodes, killed_node, killed, traffic,
                                  Traffic.of(late), max(failed, default=None), min(first_ok, default=None),
                                  replicas_back, tuple(after.replica_nodes(plan.model)))


def _wait_replicas(gcs: str, env: dict[str, str], plan: NodeLossPlan, killed_node: str, killed_at: float, until: float) -> Optional[float]:
    """Seconds from the kill until `plan.replicas` live replicas, none on the killed node; None by `until`."""
    while time.perf_counter() < until:
        where = placement(gcs, env)
        alive = [n for n in where.replica_nodes(plan.model) if n != killed_node]
        if len(alive) >= plan.replicas and killed_node not in where.replica_nodes(plan.model):
            return time.perf_counter() - killed_at
        time.sleep(POLL_S)
    return None


def _seconds(value: Optional[float]) -> str:
    return "none" if value is None else f"{value:g} s"


def markdown(result: NodeLossResult, command: str) -> str:
    data = result.to_json()
    rows = [(name, t["sent"], t["ok"], ", ".join(f"{n}x{s}" for s, n in t["refused"].items()) or "none", t["lost"])
            for name, t in data["traffic"].items()]
    lines = [f"# A Ray node lost under load: {result.plan.model}", "", f"Command: `{command}`", "",
             f"{1 + result.plan.worker_nodes} nodes of {result.plan.cpus_per_node} CPU(s), {result.plan.replicas} "
             f"replicas at most one per node (spread: {result.spread}), {result.plan.clients} closed-loop clients; "
             f"the node of one replica killed whole ({result.killed_processes} processes) after "
             f"{result.plan.before_s:g} s, load for {result.plan.after_s:g} s more.", "",
             *cli.table(("requests", "sent", "200", "refused (status)", "lost"), rows), "",
             f"- kill -> first 200: {_seconds(data['first_ok_s'])}; kill -> last answer other than 200: "
             f"{_seconds(data['last_failure_s'])} (after it every answer was 200)",
             f"- kill -> replicas back to {result.plan.replicas} on live nodes: {_seconds(data['replicas_back_s'])}",
             f"- ready (cluster started, apps running): {data['ready_s']} s",
             f"- problems: {', '.join(result.problems) or 'none'}", ""]
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    p = cli.parser("ray-node-loss", __doc__.split("\n\n")[0])
    cli.add(p, "model", "model_store", "out", model={"help": f"default: {NodeLossPlan.model}"})
    defaults = NodeLossPlan()
    for name in ("worker_nodes", "replicas", "cpus_per_node", "clients"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    for name in ("before_s", "after_s", "timeout_s"):
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(defaults, name))
    args = p.parse_args(argv)
    plan = NodeLossPlan(args.model or defaults.model, args.worker_nodes, args.replicas, args.cpus_per_node, args.clients,
                        args.before_s, args.after_s, args.timeout_s)
    result = run(plan, Path(args.model_store))
    folder = cli.report_folder(args.out, "ray-node-loss", plan.model)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
    (folder / "report.md").write_text(markdown(result, cli.command_line("ray-node-loss", argv)), encoding="utf-8")
    say(f"report: {shown(folder)}/report.md; problems: {', '.join(result.problems) or 'none'}")
    return 1 if result.problems else 0
