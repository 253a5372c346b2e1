"""The Ray Serve launcher: a cluster on this host serving model archives, as serving/launcher.py
starts TorchServe (tests and benchmarks can use either).

    from serving.ray.launcher import RayServe

    with RayServe("model_store", models=("digits",)) as ray_serve:
        ray_serve.predict("digits", {"inputs": [[0] * 8] * 8}).json()

What it does, and why:
- A fresh temp folder per cluster (short: Ray's Unix sockets live under it) holding the head's
  `--temp-dir`, the console log of every process it starts, key_file.json (TorchServe's format:
  the inference key guards /predictions), the Serve config file it deploys and the unpacked archives.
- One head node (`ray start --head --block`, dashboard off unless asked) and `worker_nodes` more
  nodes joining it, each in a session of its own on free loopback ports (serving/ray/nodes.py).
- The apps (serving/ray/serve_config.py, serving/ray/app.py) deployed by a driver process that
  waits on Serve's status (serving/ray/deploy.py); the ingress on a free loopback port: Serve's
  HAProxy ingress (RAY_SERVE_ENABLE_HA_PROXY=1, its files and admin ports moved into the cluster's
  folder and onto free ports), or with `haproxy=False` Serve's Python proxy.
- Ready when every app runs and the proxy answers /-/healthz; a failure names the log to read.
- Stop always (also on Ctrl-C and SIGTERM): each node's process group, then every process carrying
  the cluster's marker variable (workers, proxies, HAProxy), SIGTERM then SIGKILL; then the folder.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import psutil
import requests
import yaml

from serving import processes
from serving.client import Body, Client, Endpoints, Tokens
from serving.errors import LauncherError, StartupError
from serving.ray import nodes, routes_config, serve_config
from serving.ray.ending import MARKER_ENV, end_cluster, log, session_processes
from serving.ray.placement import REPLICA_CLASS
from serving.repo import REPO_ROOT
from serving.ts_config import ModelSettings

POLL_S = 0.25
LOG_TAIL_LINES = 30

__all__ = ["RayServe"]


class RayServe:
    """Context manager around one Ray cluster serving archives. Always stops it on exit."""

    def __init__(
        self,
        model_store: str | Path,
        *,
        models: tuple[str, ...] | list[str] = (),
        settings: Mapping[str, ModelSettings] | None = None,
        serve_file: Optional[Path] = None,  # a Serve config file to deploy (make tune ENGINE=ray's) instead
        worker_nodes: int = 0,
        num_cpus: Optional[int] = None,
        haproxy: bool = True,
        dashboard: bool = False,
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = 180.0,
        keep_workdir: Optional[bool] = None,
        max_request_size: Optional[int] = None,
        job_queue_size: Optional[int] = None,
    ) -> None:
        self.model_store = Path(model_store).resolve()
        self.serve_file = serve_file
        self.apps = (serve_config.read(serve_file, self.model_store) if serve_file is not None else
                     serve_config.plans(self.model_store, tuple(models), dict(settings or {})))
        self.worker_nodes = worker_nodes
        # Ray's CPU count is what it schedules by: every replica of every app must fit (threads are the
        # handler's own plan), else a replica waits for a CPU that never frees.
        self.num_cpus = num_cpus or max(os.cpu_count() or 1, sum(a.settings.min_workers * (a.settings.threads or 1)
                                                                 for a in self.apps))
        self.haproxy = haproxy
        self.dashboard = dashboard
        self.extra_env = dict(env or {})
        self.start_timeout_s = start_timeout_s
        # TorchServe's limits at the door, from the repository's config.properties unless given.
        shipped = serve_config.configured_limits(REPO_ROOT / "config.properties")
        self.limits = routes_config.DoorLimits(max_request_size or shipped.max_request_size,
                                               job_queue_size or shipped.job_queue_size)
        # RAY_LAUNCHER_KEEP=1 keeps every cluster's folder (logs, config) for a post-mortem.
        self.keep_workdir = bool(os.environ.get("RAY_LAUNCHER_KEEP")) if keep_workdir is None else keep_workdir
        self.workdir: Optional[Path] = None
        self.head: Optional[nodes.NodeSpec] = None
        self.started_s: Optional[float] = None  # seconds from start() to ready
        self._nodes: list[subprocess.Popen] = []
        self._client: Optional[Client] = None
        self._driver_env: Optional[dict[str, str]] = None
        self._haproxy_ports: tuple[int, ...] = ()
        self._old_sigterm: Any = None

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> RayServe:
        self._old_sigterm = processes.sigterm_as_interrupt()
        try:
            self.start()
        except BaseException:
            processes.restore_sigterm(self._old_sigterm)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            processes.restore_sigterm(self._old_sigterm)

    def start(self) -> RayServe:
        if self.workdir is not None:
            raise LauncherError("this Ray cluster is already started")
        began = time.monotonic()
        self.workdir = Path(tempfile.mkdtemp(prefix="ray-"))
        try:
            self._start(began + self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - began
        log(f"ready in {self.started_s:.1f} s: {', '.join(a.model for a in self.apps)} at {self.inference_url}")
        return self

    def stop(self) -> None:
        """Idempotent: every process of the cluster ended, its folder removed (unless kept)."""
        workdir, self.workdir = self.workdir, None
        if workdir is None:
            return
        try:
            end_cluster(workdir, self._nodes)
        finally:
            self._nodes.clear()
            self._client = None
            self.head = None
            if self.keep_workdir:
                log(f"kept {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)

    def detach(self) -> dict[str, Any]:
        """Leave the cluster running after this process exits (make serve ENGINE=ray): what
        `stop_detached` needs to end it later (its folder, node pids, URL, key file)."""
        workdir = self._require_workdir()
        self.keep_workdir = True
        state = {"workdir": str(workdir), "node_pids": list(self.node_pids), "url": self.inference_url,
                 "metrics": self.endpoints.metrics, "key_file": str(workdir / "key_file.json"),
                 "models": [a.model for a in self.apps]}
        self.workdir, self._nodes = None, []
        return state

    # -- starting --------------------------------------------------------------------------
    def _start(self, deadline: float) -> None:
        workdir = self._require_workdir()
        (workdir / "tmp").mkdir()
        (workdir / "archives").mkdir()
        (workdir / "logs").mkdir()
        key_file = _write_keys(workdir / "key_file.json")
        env = self._driver_env = self._env(workdir)
        self.head = nodes.head(self.num_cpus, workdir / "session", self.dashboard)
        self._start_node(self.head, env, deadline)
        gcs = f"{nodes.HOST}:{self.head.ports['port']}"
        for index in range(1, self.worker_nodes + 1):
            self._start_node(nodes.worker(index, self.num_cpus, gcs), env, deadline)
        http_port = nodes.spare_ports(1, avoid=self._haproxy_ports)[0]
        config = serve_config.write(workdir / "serve.yaml", self._with_routes(serve_config.serve_config(
            self.apps, http_port, workdir / "archives", key_file) if self.serve_file is None else serve_config.localise(
            yaml.safe_load(self.serve_file.read_text(encoding="utf-8")), self.model_store, http_port,
            workdir / "archives", key_file), key_file))
        self._deploy(gcs, config, env, deadline)
        endpoints = Endpoints(inference=f"http://{nodes.HOST}:{http_port}", management="",
                              metrics=f"http://{nodes.HOST}:{self.head.ports['metrics-export-port']}")
        self._client = Client(endpoints, Tokens.from_key_file(key_file))
        self._wait_http(deadline)

    def _with_routes(self, config: dict[str, Any], key_file: Path) -> dict[str, Any]:
        """Every model app given the size limit, and the ingress app that serves the other routes."""
        return routes_config.with_ingress(config, str(key_file), self.limits)

    def _env(self, workdir: Path) -> dict[str, str]:
        env = dict(os.environ)
        path = [str(REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        env.update(
            PYTHONPATH=os.pathsep.join(path),  # the replicas import serving.ray.app
            TMPDIR=str(workdir / "tmp"),
            RAY_USAGE_STATS_ENABLED="0",
            # Ray starts its workers at nice 15 (its raylet's worker_niceness) so its daemons stay
            # responsive; the replicas are the servers here and run at the niceness of the caller,
            # as TorchServe's workers do. A caller's own RAY_worker_niceness wins.
            RAY_worker_niceness=env.get("RAY_worker_niceness", "0"),
            # Ray prestarts a worker without a runtime_env for the first driver; ours (serving/ray/deploy.py)
            # has one (the setup hook), so that worker would idle for the cluster's life.
            RAY_prestart_worker_first_driver="0",
            # Serve's throughput-optimised mode, its documented switch: the replica's own code on its
            # HTTP loop, the per-request access log buffered (1,000 lines, flushed at once on an error)
            # and written once rather than also to stderr, gRPC between deployments, the start-up heap
            # frozen. A caller's own value wins.
            RAY_SERVE_THROUGHPUT_OPTIMIZED=env.get("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1"),
            **nodes.replica_port_env(),
            **{MARKER_ENV: str(workdir)},
        )
        if self.haproxy:
            haproxy_dir = workdir / "haproxy"
            haproxy_dir.mkdir()
            stats, metrics = self._haproxy_ports = nodes.spare_ports(2)
            env.update(
                RAY_SERVE_ENABLE_HA_PROXY="1",
                RAY_SERVE_HAPROXY_CONFIG_FILE_LOC=str(haproxy_dir / "haproxy.cfg"),
                RAY_SERVE_HAPROXY_SOCKET_PATH=str(haproxy_dir / "admin.sock"),
                RAY_SERVE_HAPROXY_SERVER_STATE_BASE=str(haproxy_dir),
                RAY_SERVE_HAPROXY_SERVER_STATE_FILE=str(haproxy_dir / "server-state"),
                RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH=str(haproxy_dir / "metrics.sock"),
                RAY_SERVE_HAPROXY_STATS_PORT=str(stats),
                RAY_SERVE_HAPROXY_METRICS_PORT=str(metrics),
            )
        env.update(self.extra_env)
        if "RAY_AUTH_MODE" not in env:
            # Ray's gRPC servers (GCS, raylets, workers) listen on every interface: without a token anyone
            # who can reach a port can join as a driver and run code. Each cluster gets its own token.
            token = workdir / "ray_auth_token"
            token.touch(mode=0o600)
            token.write_text(secrets.token_hex(32), encoding="utf-8")
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
            env.pop("RAY_AUTH_TOKEN", None)
        return env

    def driver_env(self) -> dict[str, str]:
        """The environment a driver process of this cluster needs (its token among it)."""
        self._require_workdir()
        if self._driver_env is None:
            raise LauncherError("the Ray cluster is not started yet")
        return dict(self._driver_env)

    def _start_node(self, node: nodes.NodeSpec, env: dict[str, str], deadline: float) -> None:
        workdir = self._require_workdir()
        console = workdir / "logs" / f"{node.name}.log"
        with open(console, "ab") as out:
            proc = subprocess.Popen(node.command(_ray_exe()), cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    # Own session: a Ctrl-C in the terminal reaches us, not Ray; we stop it.
                                    start_new_session=True)
        self._nodes.append(proc)
        port = node.ports["port"] if node.head else node.ports["node-manager-port"]
        while not _listening(port):
            if proc.poll() is not None:
                raise StartupError(f"{node.name} node exited {proc.returncode}; read {console}\n{_tail(console)}")
            if time.monotonic() > deadline:
                raise StartupError(f"{node.name} node not listening on {port} after {self.start_timeout_s:.0f} s; "
                                   f"read {console}\n{_tail(console)}")
            time.sleep(POLL_S)
        log(f"{node.name} node up (pid {proc.pid}, {'GCS' if node.head else 'raylet'} on {port})")

    def _deploy(self, gcs: str, config: Path, env: dict[str, str], deadline: float) -> None:
        workdir = self._require_workdir()
        console = workdir / "logs" / "deploy.log"
        timeout = max(1.0, deadline - time.monotonic())
        with open(console, "ab") as out:
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "serving.ray.deploy", "--address", gcs, "--config", str(config),
                     "--timeout", f"{timeout:.0f}"],
                    cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True, timeout=timeout + 30, check=False)
            except subprocess.TimeoutExpired:
                done = None
        if done is None or done.returncode != 0:
            logs = workdir / "session" / "session_latest" / "logs" / "serve"
            raise StartupError(f"the Serve apps did not start; read {console} and the replica logs in {logs}\n"
                               f"{_tail(console)}")

    def _wait_http(self, deadline: float) -> None:
        url = f"{self.inference_url}/-/healthz"
        while True:
            try:
                if requests.get(url, timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                logs = self._require_workdir() / "session" / "session_latest" / "logs" / "serve"
                raise StartupError(f"Serve's HTTP proxy does not answer {url}; read the proxy logs in {logs}")
            time.sleep(POLL_S)

    # -- access ------------------------------------------------------------------------------
    def _require_workdir(self) -> Path:
        if self.workdir is None:
            raise LauncherError("the Ray cluster is not running (use it as a context manager)")
        return self.workdir

    @property
    def client(self) -> Client:
        self._require_workdir()
        if self._client is None:
            raise LauncherError("the Ray cluster is not ready yet")
        return self._client

    @property
    def tokens(self) -> Tokens:
        return self.client.tokens

    @property
    def endpoints(self) -> Endpoints:
        return self.client.endpoints

    @property
    def inference_url(self) -> str:
        return self.endpoints.inference

    @property
    def node_pids(self) -> tuple[int, ...]:
        return tuple(n.pid for n in self._nodes)

    def processes(self) -> list[psutil.Process]:
        """Every live process of this cluster (memory figures, leak checks)."""
        return session_processes(str(self._require_workdir()))

    def predict(self, model: str, body: Body, content_type: str | None = None, **kwargs: Any) -> requests.Response:
        return self.client.predict(model, body, content_type, **kwargs)

    def list_models(self) -> tuple[str, ...]:
        return tuple(app.model for app in self.apps)

    def worker_pids(self, model: str) -> tuple[int, ...]:
        """The model's replica processes (Serve titles them `ServeReplica:<app>:<deployment>`), sorted."""
        title = f"{REPLICA_CLASS}{model}:"
        found = []
        for proc in self.processes():
            try:
                if any(title in part for part in proc.cmdline()):
                    found.append(proc.pid)
            except psutil.Error:  # ended meanwhile
                continue
        return tuple(sorted(found))

    def ready_worker_pids(self, model: str) -> tuple[int, ...]:
        """The model's replica pids while Serve says it is ready (OIP v2 readiness), else ()."""
        try:
            ready = requests.get(f"{self.inference_url}/v2/models/{model}/ready", timeout=10,
                                 headers=Tokens.header(self.tokens.inference)).status_code == 200
        except requests.RequestException:
            return ()
        return self.worker_pids(model) if ready else ()


def _ray_exe() -> Path:
    exe = Path(sys.executable).parent / "ray"
    if not exe.is_file():
        raise LauncherError(f"{exe} not found: install ray[serve] (requirements/dev.txt) in {sys.prefix}")
    return exe


def _write_keys(path: Path) -> Path:
    """key_file.json as TorchServe writes it (serving.client.Tokens reads it)."""
    keys = {role: {"key": secrets.token_urlsafe(24)} for role in ("management", "inference", "API")}
    path.write_text(json.dumps(keys, indent=2), encoding="utf-8")
    path.chmod(0o600)
    return path


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((nodes.HOST, port)) == 0


def _tail(path: Path) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL_LINES:])
    except OSError:
        return ""
