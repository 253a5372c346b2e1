"""Waiting for a started TorchServe: its keys, its /ping, then a READY worker per model.

Every wait checks that the frontend still lives and gives up at one deadline, with the log tails.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import requests

from serving import processes, ts_logs
from serving.client import Client, Endpoints, Tokens
from serving.errors import LauncherError, StartupError

MAX_LOAD_FAILURES = 3
POLL_S = 0.5


@dataclass(frozen=True)
class Readiness:
    """The deadline and the facts one start's waits need."""

    workdir: Path
    endpoints: Endpoints
    java_pid: int | None
    deadline: float
    timeout_s: float

    def wait(self, models: tuple[str, ...]) -> Client:
        """A client once the keys exist, /ping answers 200 and every model has a READY worker."""
        client = self._client()
        for name in models:
            self._model(client, name)
        return client

    def _client(self) -> Client:
        key_file = self.workdir / "key_file.json"
        client: Client | None = None
        while client is None:
            self._check_alive("starting")
            if key_file.is_file():
                try:
                    client = Client(self.endpoints, Tokens.from_key_file(key_file))
                except LauncherError:
                    pass  # written while we read it; try again
            if client is None:
                self._sleep("key_file.json never appeared")
        while True:
            self._check_alive("starting")
            try:
                if client.ping(timeout_s=2).status_code == 200:
                    return client
            except requests.RequestException:
                pass
            self._sleep("/ping never answered 200")

    def _model(self, client: Client, name: str) -> None:
        while True:
            self._check_alive(f"loading {name}")
            try:
                resp = client.management("GET", f"/models/{name}", timeout=10)
            except requests.ConnectionError:
                # The management port binds a moment after the inference port answers /ping
                # (seconds apart on a loaded machine): not up yet, not a failure.
                self._sleep("the management API never answered")
                continue
            if resp.status_code == 404:
                raise StartupError(f"model {name!r} is not registered\n{self.tails()}")
            if resp.ok:
                desc = resp.json()[0]
                ready = sum(1 for w in desc["workers"] if w.get("status") == "READY")
                if ready >= max(1, int(desc.get("minWorkers", 1))):
                    return
            failures = ts_logs.load_failures(self.workdir, name)
            if failures >= MAX_LOAD_FAILURES:
                raise StartupError(f"model {name!r} failed to load {failures} times\n{self.tails()}")
            self._sleep(f"model {name!r} has no READY worker")

    def tails(self) -> str:
        return ts_logs.tails(self.workdir)

    def _sleep(self, what: str) -> None:
        if time.monotonic() > self.deadline:
            raise StartupError(f"timed out after {self.timeout_s:.0f} s: {what}\n{self.tails()}")
        time.sleep(POLL_S)

    def _check_alive(self, doing: str) -> None:
        if processes.process(self.java_pid) is None:
            raise StartupError(f"TorchServe exited while {doing}\n{self.tails()}")
