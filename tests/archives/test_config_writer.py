"""The archives `make build` writes leave batching and workers to config.properties."""

from __future__ import annotations

import pytest

from benchmarks.tune.config_writer import check_archives
from build.catalogue import Catalogue
from serving.repo import CATALOGUE

pytestmark = pytest.mark.archives


def test_real_archives_carry_no_frontend_keys(model_store):
    """Every catalogue model's archive, built: a missing one fails here rather than passing unseen."""
    names = Catalogue.load(CATALOGUE).names
    assert names
    check_archives({name: model_store / f"{name}.mar" for name in names})
