"""The torch.export-based variants on tiny models: AOTInductor's export step and its build errors (no
compile here: a compiled package is served and gated in tests/archives/test_aoti.py), and ONNX through
torch.export (dynamic batch and sequence, same answers as torch)."""

import json

import pytest
import torch
import yaml

from benchmarks.tune.errors import TuneError
from benchmarks.tune.variants import eligible
from build import export
from build.__main__ import main as build_main
from build.aoti_export import compile_package, export_program
from build.archive import BuildResult, VariantResult
from build.catalogue import parse_entry
from build.errors import CatalogueError, ExportError
from build.onnx_export import export_onnx
from build.shapes import dynamic_shapes
from handlers.aoti import load_aoti
from handlers.errors import ConfigError
from handlers.onnx_session import load_onnx
from tests.tiny import catalogue_entries

pytestmark = pytest.mark.unit

QUICK = ("--speed-seconds", "0.01")


class Branchy(torch.nn.Module):
    """Branches on a tensor's values: torch.export cannot follow that."""

    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


class FixedBatch(torch.nn.Module):
    """Reshapes to a constant batch of 2: the dynamic batch dimension cannot stay dynamic."""

    def forward(self, x):
        return x.reshape(2, -1).sum(dim=1)


def test_data_dependent_control_flow_names_the_entry_and_the_fix():
    with pytest.raises(ExportError) as err:
        export_program(Branchy(), (torch.randn(2, 3),), None, "model 'tiny' variant aoti")
    message = str(err.value)
    assert message.startswith("model 'tiny' variant aoti: torch.export failed (")
    assert "torch.cond" in message and "drop aoti from the entry's variants" in message


def test_a_model_that_fixes_the_batch_size_is_told_so():
    with pytest.raises(ExportError) as err:
        export_program(FixedBatch(), (torch.randn(2, 3),), None, "model 'tiny' variant aoti")
    assert "fixes the size of a dimension exported as dynamic" in str(err.value), err.value


def test_batch_is_dynamic_and_so_is_the_sequence_of_token_inputs_only():
    image, ids, mask, rows = (torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.zeros(2, 5, dtype=torch.long),
                              torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 4))
    shapes = dynamic_shapes((image, ids, mask, rows))
    assert [sorted(s) for s in shapes] == [[0], [0, 1], [0, 1], [0]]
    assert str(shapes[1][1]) == str(shapes[2][1])  # one sequence length shared by ids and mask


def test_an_aoti_archive_runs_serialised_on_the_cpu_and_keeps_the_entry_precision():
    raw = {k: v for k, v in catalogue_entries()["tiny_tensor"].items() if k != "serialisation"}
    entry = parse_entry("tiny", {**raw, "variants": ["eager", "aoti"]})
    section = export.handler_section(entry, entry.variants[1])
    assert section["runtime"]["graph"] == "aoti" and section["weights"] == "model.pt2"
    assert section["runtime"]["device"] == "cpu" and "source" not in section
    assert section["runtime"]["channels_last"] is False
    assert export.device_keys(section) == {"deviceType": "cpu"}


def test_the_package_is_compiled_frozen_and_free_of_the_builds_thread_count(tmp_path, monkeypatch):
    """Inductor freezes (folds batch norms, prepacks oneDNN weights) only with autograd off, and
    writes the compiling process's thread count into its loops unless told the count is dynamic."""
    seen = {}

    def compiled(program, package_path, inductor_configs):
        seen.update(grad=torch.is_grad_enabled(), configs=inductor_configs)
        return package_path

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compiled)
    compile_package(object(), tmp_path / "model.pt2", "model 'tiny' variant aoti")
    assert seen["grad"] is False, "compiled with autograd on: Inductor skips freezing"
    assert seen["configs"]["freezing"] is True and seen["configs"]["cpp.dynamic_threads"] is True


def test_a_cpu_package_refuses_a_gpu(tmp_path):
    with pytest.raises(ConfigError, match="compiled for the CPU cannot run on cuda:0"):
        load_aoti(tmp_path / "model.pt2", torch.device("cuda", 0))


def test_a_variant_that_does_not_export_is_reported_and_the_others_still_build(tiny_catalogue, tmp_path, capsys,
                                                                               monkeypatch):
    def refuse(model, example, target, dtype, where):
        export_program(Branchy(), (torch.randn(2, 3),), None, where)

    monkeypatch.setattr(export, "export_aoti", refuse)
    project = tiny_catalogue.parent
    entry = {k: v for k, v in catalogue_entries()["tiny_tensor"].items() if k != "serialisation"}
    entry["variants"] = ["eager", "aoti", "onnx"]
    catalogue = project / f"{tmp_path.name}.yaml"
    catalogue.write_text(yaml.safe_dump({"models": {"tiny": entry}}))
    store = tmp_path / "store"
    code = build_main(["--catalogue", str(catalogue), "--out", str(store), *QUICK])
    text = "".join(capsys.readouterr())
    assert code == 0, text
    assert (store / "tiny.mar").is_file() and (store / "tiny.onnx.mar").is_file()
    assert not (store / "tiny.aoti.mar").exists()
    assert "tiny aoti: not archived: model 'tiny' variant aoti: torch.export failed" in text
    report = json.loads((store / "build_report.json").read_text())["models"]["tiny"]
    assert [(line["variant"], line["archive"]) for line in report] == [
        ("eager", "tiny.mar"), ("aoti", None), ("onnx", "tiny.onnx.mar")]
    assert report[1]["gate"].startswith("FAILED: export: model 'tiny' variant aoti")


class TokenSum(torch.nn.Module):
    """A text-like model: token ids and a mask, one vector per row."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)

    def forward(self, ids, mask):
        return (self.embed(ids) * mask.unsqueeze(-1)).sum(dim=1)


def test_onnx_through_torch_export_keeps_batch_and_sequence_dynamic(tmp_path):
    model = TokenSum().eval()
    example = (torch.randint(0, 10, (2, 5)), torch.ones(2, 5, dtype=torch.long))
    path = export_onnx(model, example, tmp_path / "m.onnx")
    session = load_onnx(path, threads=1)
    for batch, length in ((1, 3), (4, 9)):
        ids, mask = torch.randint(0, 10, (batch, length)), torch.ones(batch, length, dtype=torch.long)
        assert torch.allclose(session(ids, mask), model(ids, mask), atol=1e-5)


def test_an_onnx_export_failure_names_the_fix(tmp_path):
    with pytest.raises(ExportError, match="ONNX export .torch.export-based. failed .* drop onnx and onnx-int8 from the entry"):
        export_onnx(Branchy(), (torch.randn(2, 3),), tmp_path / "m.onnx")


# -- the tuner's choice ------------------------------------------------------------------------
def built(pinned=None, **gates):
    lines = tuple(VariantResult(name, None if gate.startswith("FAILED") else f"m.{name}.mar", gate, 1.0, 1.0, {}, False)
                  for name, gate in gates.items())
    return BuildResult("m", "m.mar", False, variants=lines, pinned=pinned)


def test_every_passing_variant_is_compared_unless_the_catalogue_pins_one():
    result = built(torchscript="passed", aoti="passed", onnx="passed", int8="FAILED: min cosine 0.86")
    assert eligible(result, None) == ["torchscript", "aoti", "onnx"]
    assert eligible(built("aoti", torchscript="passed", aoti="passed"), None) == ["aoti"]
    assert eligible(built("aoti", torchscript="passed", aoti="passed"), ["torchscript"]) == ["torchscript"]
    with pytest.raises(TuneError, match="the catalogue's pinned variant aoti: not archived"):
        eligible(built("aoti", torchscript="passed", aoti="FAILED: export: no"), None)


def test_a_catalogue_pins_one_variant_at_most():
    raw = {k: v for k, v in catalogue_entries()["tiny_tensor"].items() if k != "serialisation"}
    entry = parse_entry("tiny", {**raw, "variants": ["eager", {"aoti": {"pin": True}}]})
    assert [v.pin for v in entry.variants] == [False, True]
    with pytest.raises(CatalogueError, match="'eager' and 'aoti' are both pinned"):
        parse_entry("tiny", {**raw, "variants": [{"eager": {"pin": True}}, {"aoti": {"pin": True}}]})
    with pytest.raises(CatalogueError, match=r"variants\[1\]\.aoti\.pin: true"):
        parse_entry("tiny", {**raw, "variants": ["eager", {"aoti": {"pin": "yes"}}]})
