"""Every archive `make build` wrote passes its self-check on this machine (handlers/self_check.py):
each variant's worker, started in-process, measures the variant on its packed held-out inputs
within the gate's bound, in one forward pass of the gate's few inputs. A variant this host's gate
rejected is skipped with the gate's figure (tests/archived.py)."""

from __future__ import annotations

import logging
import re

import pytest

from build.catalogue import Catalogue
from handlers import self_check
from serving.fake_context import extract
from serving.repo import CATALOGUE
from tests.archived import archived

from .conftest import make_handler

pytestmark = pytest.mark.archives

CATALOGUE_NOW = Catalogue.load(CATALOGUE)
VARIANTS = [(name, variant.name) for name in CATALOGUE_NOW.names for variant in CATALOGUE_NOW.entry(name).variants]


@pytest.mark.parametrize(("model", "variant"), VARIANTS, ids=[f"{m}.{v}" for m, v in VARIANTS])
def test_each_archived_variant_passes_its_self_check_here(model_store, tmp_path, caplog, model, variant):
    model_dir = extract(archived(model_store, model, variant), tmp_path / model)
    assert (model_dir / self_check.FILE).is_file(), f"{model} {variant}: the build packed no self-check"
    caplog.set_level(logging.INFO, logger="handlers.self_check")
    make_handler(model_dir, model, runtime={"warmup": False})
    line = next((r.getMessage() for r in caplog.records if "self-check passed" in r.getMessage()), None)
    assert line is not None, caplog.text
    ms = float(re.search(r"in ([\d.]+) ms", line).group(1))
    inputs = int(re.search(r"on (\d+) held-out input", line).group(1))
    print(f"\n{line}")
    # One forward pass of a handful of inputs: their count is the property; the time only guards
    # against a hang (a shared 2-core host moves a TorchScript first pass from 0.5 to 1.6 s).
    assert 1 <= inputs <= CATALOGUE_NOW.entry(model).gate.self_check, line
    assert ms < 10_000, line
