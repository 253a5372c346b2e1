"""The engine a hostile test attacks, as the contract sees it: where requests go, which processes
serve a model (a worker that died is a broken contract), how a wedged model gets a fresh one, and
the model's own metrics (the batching witnesses). One adapter per engine: TorchServe (its
management API and metrics port) and Ray Serve (the cluster's replica processes and Ray's
Prometheus export of the same handler metrics)."""

from __future__ import annotations

import time
from typing import Optional

import requests

from benchmarks.load.server_metrics import BATCHES, Scrape
from handlers.engines.ray import ray_name
from serving import processes
from serving.client import Tokens
from serving.errors import ApiError
from serving.launcher import TorchServe
from serving.ray.launcher import RayServe

READY_TIMEOUT_S = 120.0


class Served:
    """One running engine. `grpc_target` is None where the engine serves no TorchServe gRPC;
    `frontend_500` says whether TorchServe's Java frontend answers a few bad requests itself."""

    engine = ""
    frontend_500 = False
    grpc_target: Optional[str] = None
    metrics_wait_s = 10.0  # how long the model's metrics take to show what it did
    examples_share = 1.0  # of each test's examples (HOSTILE_EXAMPLES too) this engine gets
    settle_s = 0.0  # how often the export refreshes, where it lags the answers

    def __init__(self, server: TorchServe | RayServe) -> None:
        self.server = server

    @property
    def tokens(self) -> Tokens:
        return self.server.tokens

    @property
    def inference_url(self) -> str:
        return self.server.inference_url

    def worker_pids(self, model: str) -> tuple[int, ...]:
        """The processes serving `model` now, sorted."""
        return tuple(sorted(self.server.worker_pids(model)))

    def ready_pids(self, model: str, other_than: tuple[int, ...] = ()) -> tuple[int, ...]:
        """The model's processes once every one is ready (a restarting one is waited for), none of
        them one of `other_than`."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            ready, listed = self.server.ready_worker_pids(model), self.worker_pids(model)
            if ready and ready == listed and not set(ready) & set(other_than):
                return ready
            if time.monotonic() > deadline:
                raise AssertionError(f"{model}: not ready after {READY_TIMEOUT_S:.0f} s (pids {listed}, "
                                     f"ready {ready})")
            time.sleep(0.5)

    def fresh_worker(self, model: str, pids: tuple[int, ...]) -> None:
        """A model that answers nothing gets fresh processes in place of `pids`."""
        raise NotImplementedError

    def metric(self, name: str) -> str:
        """A handler metric's name in this engine's export."""
        return name

    def scrape(self) -> Scrape:
        return Scrape.of(self.server.client.metrics_text())

    def batches(self, model: str) -> dict[int, int]:
        """Batches formed so far per batch size (the handler's HandlerBatches{BatchSize=...} counter)."""
        counts = self.scrape().by_label(self.metric(BATCHES), model, "BatchSize")
        return {int(size): int(n) for size, n in counts.items() if n > 0}

    def batches_since(self, model: str, before: dict[int, int], items: int) -> dict[int, int]:
        """Batches formed since `before`, once they account for `items` accepted requests and, where
        the export lags (`settle_s`), read the same twice that far apart: the metrics arrive a
        moment after the answers went out (a bounded wait)."""
        deadline = time.monotonic() + self.metrics_wait_s
        while True:
            now = self.batches(model)
            new = {size: n - before.get(size, 0) for size, n in now.items() if n > before.get(size, 0)}
            if time.monotonic() > deadline:
                return new
            if sum(size * n for size, n in new.items()) >= items:
                if not self.settle_s:
                    return new
                time.sleep(self.settle_s)
                if self.batches(model) == now:
                    return new
            time.sleep(0.2)


class OnTorchServe(Served):
    engine = "torchserve"
    frontend_500 = True

    def __init__(self, ts: TorchServe) -> None:
        super().__init__(ts)
        self.ts = ts
        self.grpc_target = ts.grpc_target

    def fresh_worker(self, model: str, pids: tuple[int, ...]) -> None:
        """The worker's process ended (a wedged one never unloads), then the model scaled to none and
        back (a wedged frontend thread goes with it)."""
        processes.end([p for p in map(processes.process, pids) if p is not None], grace_s=0.0)
        try:
            self.ts.client.scale_workers(model, 0, timeout_s=60)
            self.ts.client.scale_workers(model, 1, timeout_s=120)
        except (ApiError, requests.RequestException) as err:
            raise AssertionError(f"{model}: no fresh worker: {err}"[:400]) from None
        self.ready_pids(model, other_than=pids)


class OnRay(Served):
    """A Ray Serve cluster: a model is an application, its processes are its replicas
    (`ServeReplica:<app>:<deployment>`), and Serve's controller replaces one that dies."""

    engine = "ray"
    metrics_wait_s = 30.0
    settle_s = 2.5  # Ray's agent exports every second here (conftest's RAY_ENV)
    # Half: the families' own checks are the same code on both engines and get every example on
    # TorchServe; what is Ray's (its door, ingress, batcher, replica) is in every example.
    examples_share = 0.5

    def fresh_worker(self, model: str, pids: tuple[int, ...]) -> None:
        """The replicas' processes ended: Serve's controller starts new ones."""
        processes.end([p for p in map(processes.process, pids) if p is not None], grace_s=0.0)
        self.ready_pids(model, other_than=pids)

    def metric(self, name: str) -> str:
        return f"ray_{ray_name(name)}"
