"""The accuracy gate can fail, and its held-out sets are held out.

Each gate kind (embedding, classification, tensor) passes an exact copy of a tiny model and fails
the same model with perturbed weights, through the family's own decode and collate. Every catalogue
entry's held-out set is disjoint, by content, from its examples and its calibration set.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
import yaml
from PIL import Image

from build import gate
from build.catalogue import Catalogue
from build.errors import CatalogueError
from build.export import handler_section, make_family, parse_settings, reference_model
from build.held_out import key, separation
from serving.repo import CATALOGUE, REPO_ROOT
from tests.tiny import tiny_project

pytestmark = pytest.mark.unit

# tiny model -> the gate kind its family uses
KINDS = {"tiny_text": "embedding", "tiny_image": "classification", "tiny_forecast": "tensor"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return root, Catalogue.load(tiny_project(root))


class Perturbed(torch.nn.Module):
    """A variant gone wrong: the model's outputs, negated (every kind's measure sees it)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *inputs):
        return -self.model(*inputs)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_gate_kind_passes_a_copy_and_fails_a_perturbed_variant(tiny, tmp_path, name):
    root, catalogue = tiny
    entry = catalogue.entry(name)
    settings = parse_settings(entry, handler_section(entry, entry.default_variant))
    content = tmp_path / "content"
    content.mkdir()
    for extra in entry.extra_files:
        (content / extra.name).write_bytes(extra.source.resolve(root, "extra").read_bytes())
    stage = getattr(entry.model, "stage", None)
    if stage is not None:
        stage(root, content)
    family = make_family(entry, settings, content)
    assert family.gate_kind() == KINDS[name]
    spec = gate.GateSpec(min_cosine=0.999, top1_margin=0.0, atol=1e-4, rtol=1e-3)
    inputs = gate.gate_inputs(entry.examples, spec, root, name)
    assert inputs, "the tiny entry has examples to gate on"
    model = reference_model(entry, family, root)
    reference = gate.run_outputs(model, family, inputs)
    same = gate.judge(family.gate_kind(), spec, reference, gate.run_outputs(copy.deepcopy(model), family, inputs),
                      inputs)
    off = gate.judge(family.gate_kind(), spec, reference, gate.run_outputs(Perturbed(model), family, inputs),
                     inputs)
    assert same.passed, same.summary
    assert not off.passed and off.summary.startswith("FAILED"), off.summary


def test_every_catalogue_entry_holds_its_held_out_set_apart(capsys):
    catalogue = Catalogue.load(CATALOGUE)
    sizes = {}
    for name in catalogue.names:
        entry = catalogue.entry(name)
        found = separation(entry.examples, entry.gate.held_out, entry.gate.calibration, REPO_ROOT, name)
        assert found.apart, f"{name}: {found.problem()}"
        assert found.held_out >= 20, f"{name}: {found.held_out} held-out inputs: too few for a gate to mean much"
        sizes[name] = (found.examples, found.held_out, found.calibration)
    with capsys.disabled():
        print("\n  gate inputs (examples + held out, calibration kept apart): "
              + "; ".join(f"{n} {e} + {h}, {c}" for n, (e, h, c) in sizes.items()))


def png(pixels: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (pixels, pixels), (pixels, 0, 0)).save(out, format="PNG")
    return out.getvalue()


def test_a_held_out_input_that_is_also_an_example_fails_the_build(tmp_path):
    """The same photo as an example (re-encoded as JPEG on the way) and held out is one input."""
    (tmp_path / "photo.png").write_bytes(png(8))
    (tmp_path / "other.png").write_bytes(png(9))
    (tmp_path / "held.txt").write_text("a held-out sentence\nA cat is here.\na held-out sentence\n")
    raw = {"examples": [{"path": "photo.png", "jpeg_quality": 90}, {"json": {"text": "A cat is here."}}]}
    from build.examples import parse_examples
    from build.files import FileSource

    examples = parse_examples("examples", raw["examples"])
    found = separation(examples, [FileSource(None, None, "photo.png"), FileSource(None, None, "other.png"),
                                  FileSource(None, None, "held.txt")],
                       [FileSource(None, None, "other.png")], tmp_path, "entry")
    assert not found.apart
    assert found.shared_with_examples == ("photo.png", "held.txt:2")
    assert found.shared_with_calibration == ("other.png",) and found.repeated_inside_held_out == 1


def test_content_keys_see_through_the_request_form():
    import numpy as np

    scan = np.arange(16, dtype=np.float32).reshape(1, 4, 4)
    assert key(scan) == key({"inputs": scan.tolist()}) != key({"inputs": (scan + 1).tolist()})
    assert key(" A cat. ") == key({"text": "A cat."}) != key("A dog.")
    assert key({"history": [1, 2], "horizon": 1}) == key({"horizon": 1, "history": [1, 2]})


def test_the_build_refuses_an_entry_whose_held_out_set_repeats_an_example(tmp_path):
    root, _ = tmp_path, None
    catalogue_path = tiny_project(root)
    raw = yaml.safe_load(catalogue_path.read_text())
    raw["models"] = {"tiny_text": raw["models"]["tiny_text"]}
    sentence = raw["models"]["tiny_text"]["examples"][0]["json"]["text"]
    (root / "held.txt").write_text(f"{sentence}\nanother sentence entirely\n")
    raw["models"]["tiny_text"]["gate"] = {"held_out": [{"path": "held.txt"}]}
    raw["models"]["tiny_text"]["variants"] = ["eager", "torchscript"]
    raw["models"]["tiny_text"].pop("serialisation")
    catalogue_path.write_text(yaml.safe_dump(raw))
    from build.archive import build_entry

    with pytest.raises(CatalogueError, match="held.txt:1"):
        build_entry(Catalogue.load(catalogue_path), "tiny_text", root, root / "store", progress=lambda _: None)
    assert not (root / "store" / "tiny_text.mar").exists()
