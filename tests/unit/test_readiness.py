"""The launcher's waits give up with a StartupError that says why: a dead frontend, or the deadline."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from serving.client import Endpoints
from serving.errors import StartupError
from serving.readiness import Readiness

pytestmark = pytest.mark.unit

ENDPOINTS = Endpoints(inference="http://127.0.0.1:9", management="http://127.0.0.1:9", metrics="http://127.0.0.1:9")


def test_a_frontend_that_exited_fails_at_once(tmp_path: Path) -> None:
    waits = Readiness(tmp_path, ENDPOINTS, java_pid=None, deadline=time.monotonic() + 60, timeout_s=60)
    began = time.monotonic()
    with pytest.raises(StartupError, match="TorchServe exited while starting"):
        waits.wait(("m",))
    assert time.monotonic() - began < 5


def test_missing_keys_time_out_naming_what_never_came(tmp_path: Path) -> None:
    waits = Readiness(tmp_path, ENDPOINTS, java_pid=os.getpid(), deadline=time.monotonic() + 1, timeout_s=1)
    with pytest.raises(StartupError, match="key_file.json never appeared"):
        waits.wait(())
