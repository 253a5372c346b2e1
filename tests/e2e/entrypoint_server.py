"""Run TorchServe from generated deploy/ files with the argv a container would run, on this machine.

The container's paths (/home/model-server/..., /mnt/models/...) are rewritten to a temp folder
that mirrors them, and the 0.0.0.0 addresses to free 127.0.0.1 ports; nothing else of the argv
changes. Two environment additions that a container does not need: JAVA_HOME (the resolved Java)
and TEMP/TMPDIR in the temp folder (a container's /tmp is its own; here the worker sockets and
torchserve's pid file must not meet another server's). Always stopped: the whole process tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import requests

from serving import java, processes
from serving.client import Client, Endpoints, Tokens
from serving.errors import ApiError, LauncherError
from serving.properties import format_properties, read
from serving.ts_config import ServerConfig


def rewrite_config(src: Path, dest: Path, prefix: str, root: Path) -> ServerConfig:
    """The container's config.properties with its paths under `root` and free loopback ports."""
    props = {k: v.replace(prefix, str(root)) for k, v in read(src).items()}
    ports = processes.free_loopback_ports(5)
    for key, port in zip(("inference_address", "management_address", "metrics_address"), ports):
        props[key] = f"http://127.0.0.1:{port}"
    props["grpc_inference_port"], props["grpc_management_port"] = str(ports[3]), str(ports[4])
    dest.write_text(format_properties(props, f"{src} with paths under {root} and loopback ports"), encoding="utf-8")
    return ServerConfig.load(dest)


class EntrypointServer:
    """`argv` and `env` as the container has them (paths already rewritten), started in `root`."""

    def __init__(self, argv: Sequence[str], root: Path, config: ServerConfig, env: Mapping[str, str],
                 models: Sequence[str], start_timeout_s: float = 300.0) -> None:
        self.argv = tuple(argv)
        self.root = root
        self.config = config
        self.env = dict(env)
        self.models = tuple(models)
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.client: Client | None = None

    def __enter__(self) -> EntrypointServer:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start(self) -> None:
        tmp = self.root / "tmp"
        tmp.mkdir(exist_ok=True)
        env = java.env_for(java.resolve(), {k: v for k, v in os.environ.items() if not k.startswith("TS_")})
        env.update(self.env, TEMP=str(tmp), TMPDIR=str(tmp))
        # argv[0] is `torchserve` on the image's PATH; here the venv's.
        exe = str(Path(sys.executable).parent / self.argv[0])
        print(f"[entrypoint] {' '.join(self.argv)} (in {self.root})", file=sys.stderr, flush=True)
        self.console = open(self.root / "console.log", "wb")
        self.proc = subprocess.Popen([exe, *self.argv[1:]], cwd=self.root, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self.console, stderr=subprocess.STDOUT, start_new_session=True)
        endpoints = Endpoints(inference=self.config.address("inference_address"),
                              management=self.config.address("management_address"),
                              metrics=self.config.address("metrics_address"))
        deadline = time.monotonic() + self.start_timeout_s
        key_file = self.root / "key_file.json"
        while self.client is None:
            self._wait(deadline, "key_file.json")
            if key_file.is_file():
                try:
                    self.client = Client(endpoints, Tokens.from_key_file(key_file))
                except LauncherError:
                    pass  # being written
        for name in self.models:
            while True:
                try:
                    if self.client.ready_workers(name) >= 1:
                        break
                except (requests.RequestException, ApiError, LauncherError):
                    pass  # management port not bound yet, or the model not registered yet
                self._wait(deadline, f"a READY worker of {name}")
        print(f"[entrypoint] ready: {', '.join(self.models)}", file=sys.stderr, flush=True)

    def _wait(self, deadline: float, what: str) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"torchserve exited {self.proc.returncode} waiting for {what}:\n{self.tails()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {self.start_timeout_s:.0f} s waiting for {what}:\n{self.tails()}")
        time.sleep(0.5)

    def tails(self) -> str:
        parts = []
        for path in (self.root / "console.log", self.root / "logs" / "ts_log.log", self.root / "logs" / "model_log.log"):
            if path.is_file():
                parts.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(parts)

    def stop(self) -> None:
        """SIGTERM the process tree (the JVM and its workers too), SIGKILL what is left after 10 s."""
        if self.proc is None:
            return
        root = processes.process(self.proc.pid)
        processes.end(processes.tree(root))
        self.proc.wait(timeout=30)
        self.proc = None
        self.console.close()


def temp_root(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
