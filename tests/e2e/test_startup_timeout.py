"""The startup timeout TorchServe applies to each model is the one the build wrote into its archive:
TorchServe 0.12 takes an archive's model-config.yaml value (120 s when left out) over
config.properties' default_startup_timeout and models= startupTimeout (docs/configuration.md)."""

from __future__ import annotations

import re

import pytest

from build.catalogue import STARTUP_TIMEOUT_S
from tests.e2e.conftest import MODELS

pytestmark = pytest.mark.e2e


def test_every_model_runs_under_the_archives_startup_timeout_and_loads_well_within_it(server):
    described = {name: server.describe(name) for name in MODELS}
    assert {name: d.get("startupTimeout") for name, d in described.items()} == dict.fromkeys(MODELS, STARTUP_TIMEOUT_S)
    ready = {m.group(1): float(m.group(2)) for m in re.finditer(r"(\S+) ready in ([\d.]+)s", server.log_text())}
    slow = {name: s for name, s in ready.items() if name in MODELS and s > STARTUP_TIMEOUT_S / 3}
    assert set(MODELS) <= set(ready) and not slow, f"loads within a third of the timeout expected: {ready}"
