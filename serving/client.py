"""A small REST client for one running TorchServe: inference, management and metrics APIs.

TorchServe 0.12 enforces token auth by default: every inference call (also /ping) needs
`Authorization: Bearer <inference key>`, every management call the management key; the keys are in
`key_file.json` in the server's working directory. A missing or wrong key answers HTTP 400 with
type InvalidKeyException (not 401/403). The metrics API (/metrics) needs no key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from serving.errors import ApiError, LauncherError

Body = bytes | str | Mapping[str, Any]


@dataclass(frozen=True)
class Tokens:
    inference: str
    management: str
    api: str = ""

    @classmethod
    def from_key_file(cls, path: Path) -> Tokens:
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls(
                inference=raw["inference"]["key"],
                management=raw["management"]["key"],
                api=raw.get("API", {}).get("key", ""),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LauncherError(f"cannot read TorchServe keys from {path}: {exc}") from exc

    @staticmethod
    def header(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}


@dataclass(frozen=True)
class Endpoints:
    inference: str
    management: str
    metrics: str


def encode_body(body: Body, content_type: str | None) -> tuple[bytes, str]:
    """Raw bytes and Content-Type for a POST: dict -> JSON, str -> UTF-8 text, bytes as given."""
    if isinstance(body, Mapping):
        return json.dumps(body).encode("utf-8"), content_type or "application/json"
    if isinstance(body, str):
        return body.encode("utf-8"), content_type or "text/plain; charset=utf-8"
    return bytes(body), content_type or "application/octet-stream"


@dataclass(frozen=True)
class Client:
    endpoints: Endpoints
    tokens: Tokens
    timeout_s: float = 120.0

    # -- inference -------------------------------------------------------------------------
    def ping(self, timeout_s: float = 5.0) -> requests.Response:
        return requests.get(
            f"{self.endpoints.inference}/ping",
            headers=Tokens.header(self.tokens.inference),
            timeout=timeout_s,
        )

    def predict(
        self,
        model: str,
        body: Body,
        content_type: str | None = None,
        *,
        token: str | None = None,
        timeout_s: float | None = None,
        stream: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> requests.Response:
        """POST raw bytes (never form encoding). Returns the response whatever its status.

        `token=""` sends no Authorization header; any other string is sent instead of the key.
        `stream=True`: the body is read as it arrives (iter_content), for streamed answers.
        `headers`: more request headers (X-Priority, say).
        """
        data, ctype = encode_body(body, content_type)
        headers = {**(headers or {}), "Content-Type": ctype}
        key = self.tokens.inference if token is None else token
        if key:
            headers.update(Tokens.header(key))
        return requests.post(
            f"{self.endpoints.inference}/predictions/{model}",
            data=data,
            headers=headers,
            timeout=timeout_s or self.timeout_s,
            stream=stream,
        )

    # -- management ------------------------------------------------------------------------
    def management(
        self, method: str, path: str, *, token: str | None = None, **kwargs: Any
    ) -> requests.Response:
        """Raw management call; returns the response whatever its status."""
        key = self.tokens.management if token is None else token
        headers = Tokens.header(key) if key else {}
        kwargs.setdefault("timeout", self.timeout_s)
        return requests.request(method, f"{self.endpoints.management}{path}", headers=headers, **kwargs)

    def _management_json(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self.management(method, path, **kwargs)
        if not resp.ok:
            raise ApiError(method, f"{self.endpoints.management}{path}", resp.status_code, resp.text)
        return resp.json()

    def list_models(self) -> tuple[str, ...]:
        raw = self._management_json("GET", "/models")
        return tuple(m["modelName"] for m in raw.get("models", []))

    def describe(self, model: str) -> dict[str, Any]:
        """GET /models/<name>: the default version's description (batchSize, workers, ...)."""
        raw = self._management_json("GET", f"/models/{model}")
        if not raw:
            raise LauncherError(f"describe {model}: empty answer")
        return raw[0]

    def scale_workers(
        self, model: str, min_workers: int, max_workers: int | None = None, timeout_s: float = 180.0
    ) -> dict[str, Any]:
        """PUT /models/<name>?min_worker=..&max_worker=..&synchronous=true; waits for the change."""
        params = {
            "min_worker": min_workers,
            "max_worker": max(min_workers, max_workers or min_workers),
            "synchronous": "true",
            "timeout": int(timeout_s),
        }
        return self._management_json("PUT", f"/models/{model}", params=params, timeout=timeout_s + 10)

    def worker_pids(self, model: str) -> tuple[int, ...]:
        return tuple(int(w["pid"]) for w in self.describe(model)["workers"] if w.get("pid", -1) > 0)

    def ready_workers(self, model: str) -> int:
        return sum(1 for w in self.describe(model)["workers"] if w.get("status") == "READY")

    # -- metrics ---------------------------------------------------------------------------
    def metrics_text(self) -> str:
        resp = requests.get(f"{self.endpoints.metrics}/metrics", timeout=self.timeout_s)
        if not resp.ok:
            raise ApiError("GET", f"{self.endpoints.metrics}/metrics", resp.status_code, resp.text)
        return resp.text
