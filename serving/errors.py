"""The launcher's exception family (serving/): catch `LauncherError` for all."""

from __future__ import annotations


class LauncherError(RuntimeError):
    """Base of the family: starting, driving or measuring TorchServe went wrong (catch it to catch all)."""


class ConfigError(LauncherError, ValueError):
    """config.properties (or a value meant for it) is missing or malformed."""


class StartupError(LauncherError):
    """TorchServe did not come up healthy with READY workers in time; the message has log tails."""


class ApiError(LauncherError):
    """A management/inference call answered with an unexpected HTTP status."""

    def __init__(self, method: str, url: str, status: int, body: str) -> None:
        super().__init__(f"{method} {url} -> HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body
