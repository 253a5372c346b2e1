"""The tests follow the build's verdict: a variant's archive, or a skip where this host's accuracy
gate rejected it, or a failure where it is missing for any other reason.

The gate's verdict depends on the host (an int8 variant passes on one CPU and fails on another), so
a test that needs a non-default variant asks here instead of assuming the archive exists. The build
report (model_store/build_report.json, written by the build that made the store) says which
variants the gate rejected and by how much: those are skipped with that figure. An archive missing
without such a line (the build did not run, or failed, or the file was removed) is a failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest

from build import report
from build.catalogue import Catalogue
from serving.repo import CATALOGUE


def gate_rejection(store: Path, model: str, variant: str) -> Optional[str]:
    """The gate's verdict on this variant when the build that made `store` rejected it, else None."""
    line = next((v for v in report.read(store).get(model, []) if v.variant == variant), None)
    if line is None or line.archive is not None or not (line.gate or "").startswith("FAILED"):
        return None
    return line.gate


def archived(store: Path, model: str, variant: Optional[str] = None, catalogue: Path = CATALOGUE) -> Path:
    """`model`'s archive of `variant` (None: its default) in `store`; skips the calling test when this
    host's gate rejected the variant, fails it when the archive is missing for another reason."""
    entry = Catalogue.load(catalogue).entry(model)
    chosen = entry.default_variant if variant is None else next((v for v in entry.variants if v.name == variant), None)
    if chosen is None:
        pytest.fail(f"{model} has no variant {variant!r} in {catalogue.name}", pytrace=False)
    rejected = gate_rejection(store, model, chosen.name)
    if rejected is not None:
        pytest.skip(f"{model} {chosen.name}: the accuracy gate rejected it on this host ({rejected}); "
                    f"see {store.name}/build_report.md")
    archive = store / chosen.archive_name(model)
    if not archive.is_file():
        pytest.fail(f"{archive.name}: missing, and the build report shows no gate rejection of {model} "
                    f"{chosen.name} (was `make build` run, and did it succeed?)", pytrace=False)
    return archive
