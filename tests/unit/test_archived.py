"""The tests follow the build's verdict (tests/archived.py): a variant this host's gate rejected is
skipped with the gate's figure, never an error; one missing for another reason fails."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.archived import archived, gate_rejection
from tests.tiny import catalogue_entries

pytestmark = pytest.mark.unit

REJECTED = "FAILED: min cosine 0.9883 (needs >= 0.99) over 316 inputs, worst held_out.txt:57"


@pytest.fixture
def store_and_catalogue(tiny_catalogue, tmp_path):
    """A store whose build archived `tiny.mar` and `tiny.onnx.mar`, and whose gate rejected onnx-int8."""
    entry = {k: v for k, v in catalogue_entries()["tiny_tensor"].items() if k != "serialisation"}
    entry["variants"] = ["eager", "onnx", "onnx-int8", "int8"]
    catalogue = tiny_catalogue.parent / f"{tmp_path.name}.yaml"
    catalogue.write_text(yaml.safe_dump({"models": {"tiny": entry}}))
    store = tmp_path / "store"
    store.mkdir()
    line = {"gate": "passed: top-1 agreement 1.0000 (needs >= 1) over 2 inputs", "gate_worst": 1.0, "size_mib": 0.1,
            "items_per_s": {}}
    report = [{**line, "variant": "eager", "archive": "tiny.mar"}, {**line, "variant": "onnx", "archive": "tiny.onnx.mar"},
              {**line, "variant": "onnx-int8", "archive": None, "gate": REJECTED, "gate_worst": 0.9883}]
    (store / "build_report.json").write_text(json.dumps({"models": {"tiny": report}}))
    for name in ("tiny.mar", "tiny.onnx.mar"):
        (store / name).write_bytes(b"PK")
    return store, catalogue


def test_an_archived_variant_is_its_archive(store_and_catalogue):
    store, catalogue = store_and_catalogue
    assert archived(store, "tiny", None, catalogue) == store / "tiny.mar"
    assert archived(store, "tiny", "onnx", catalogue) == store / "tiny.onnx.mar"
    assert gate_rejection(store, "tiny", "onnx") is None


def test_a_variant_the_gate_rejected_here_is_skipped_with_the_gates_figure(store_and_catalogue):
    store, catalogue = store_and_catalogue
    assert gate_rejection(store, "tiny", "onnx-int8") == REJECTED
    with pytest.raises(pytest.skip.Exception, match=r"tiny onnx-int8: the accuracy gate rejected it on this host "
                                                    r"\(FAILED: min cosine 0.9883 \(needs >= 0.99\)"):
        archived(store, "tiny", "onnx-int8", catalogue)


def test_a_variant_missing_for_another_reason_fails(store_and_catalogue):
    store, catalogue = store_and_catalogue
    with pytest.raises(pytest.fail.Exception, match="tiny.int8.mar: missing, and the build report shows no gate"):
        archived(store, "tiny", "int8", catalogue)  # no line: the build did not get to it
    (store / "tiny.onnx.mar").unlink()
    with pytest.raises(pytest.fail.Exception, match="tiny.onnx.mar: missing"):
        archived(store, "tiny", "onnx", catalogue)  # archived by the build, removed since
    (store / "build_report.json").unlink()
    (store / "tiny.mar").unlink()
    with pytest.raises(pytest.fail.Exception, match="tiny.mar: missing"):
        archived(store, "tiny", None, catalogue)  # no build at all
    with pytest.raises(pytest.fail.Exception, match="tiny has no variant 'fp64'"):
        archived(store, "tiny", "fp64", catalogue)
