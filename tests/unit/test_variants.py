"""Numeric variants: catalogue parsing, the accuracy gate, ONNX Runtime sessions, the build's handling
of a variant the gate rejects, and what the tuner and config.properties make of variants."""

import copy
import json

import numpy as np
import pytest
import torch
import yaml

from benchmarks.tune.config_writer import Update, rewrite
from benchmarks.tune.errors import TuneError
from benchmarks.tune.variants import choose, eligible
from build import export
from build.__main__ import main as build_main
from build.archive import BuildResult, VariantResult
from build.catalogue import parse_entry
from build.errors import CatalogueError
from build.gate import GateInput, GateSpec, judge
from build.onnx_export import export_onnx, quantize_int8
from handlers.onnx_session import load_onnx
from serving.errors import ConfigError as ServingConfigError
from serving.repo import CATALOGUE, REPO_ROOT
from serving.ts_config import startup_archives
from tests.tiny import catalogue_entries

pytestmark = pytest.mark.unit

DIGITS = yaml.safe_load(CATALOGUE.read_text())["models"]["digits"]
# The report's speed of each variant is timed for 1.5 s per batch size by default: not under test here.
QUICK = ("--speed-seconds", "0.01")


def digits_entry(**changes):
    """The shipped digits entry (its paths are the repository's: a catalogue in tmp links models/)."""
    entry = copy.deepcopy(DIGITS)
    entry.update(changes)
    return entry


# -- the catalogue ------------------------------------------------------------------------------
@pytest.mark.parametrize("changes, message", [
    ({"variants": ["torchscript", "tensorrt"]}, "unknown variant 'tensorrt'"),
    ({"variants": ["onnx", "onnx"]}, "'onnx' is listed twice"),
    ({"variants": ["onnx"], "serialisation": "torchscript"}, "drop serialisation"),
    ({"variants": [{"onnx-int8": {"keep_fp32": "layer.0"}}]}, "keep_fp32: a list"),
    ({"variants": [{"onnx": {"keep_fp32": []}}]}, "unknown key 'keep_fp32'"),
    ({"variants": []}, "a non-empty list"),
    ({"gate": {"min_cosine": 1.5}}, "gate.min_cosine"),
    ({"gate": {"held_out": "a.txt"}}, "gate.held_out"),
    ({"gate": {"tolerance": 0.1}}, "unknown key 'tolerance'"),
])
def test_bad_variants_and_gates_are_refused_by_name(changes, message):
    with pytest.raises(CatalogueError, match=message):
        parse_entry("digits", digits_entry(**changes))


def test_variants_name_their_archives_and_the_first_is_the_default():
    entry = parse_entry("digits", digits_entry(variants=["eager", "onnx", {"onnx-int8": {"keep_fp32": ["n"]}}]))
    assert [v.archive_name("digits") for v in entry.variants] == ["digits.mar", "digits.onnx.mar",
                                                                  "digits.onnx-int8.mar"]
    assert entry.default_variant.name == "eager" and entry.variants[2].keep_fp32 == ("n",)
    section = export.handler_section(entry, entry.variants[1])
    assert section["runtime"]["graph"] == "onnx" and section["weights"] == "model.onnx" and "source" not in section
    assert section["variant"] == "onnx"
    # Without `variants`, the serialisation names the one variant, as before.
    assert [v.name for v in parse_entry("digits", digits_entry(serialisation="torchscript")).variants] == ["torchscript"]


@pytest.mark.parametrize("native", [True, False], ids=["native-bf16", "converted-bf16"])
def test_a_torchscript_variant_records_the_precision_it_is_traced_at(monkeypatch, native):
    from handlers import runtime

    monkeypatch.setattr(runtime, "cpu_supports", lambda dtype: native)
    entry = parse_entry("digits", digits_entry(variants=["torchscript", "eager"],
                                               settings={"runtime": {"precision": "bf16"}}))
    traced, eager = (export.handler_section(entry, v)["runtime"]["precision"] for v in entry.variants)
    assert traced == ("bf16" if native else "fp32")
    assert eager == "bf16"  # an eager archive resolves it in the worker, where it runs


# -- the gate's judgement -----------------------------------------------------------------------
def inputs(n):
    return [GateInput(f"in{i}", None, "") for i in range(n)]


def test_embedding_gate_names_the_worst_input():
    reference = torch.nn.functional.normalize(torch.randn(5, 8), dim=1)
    candidate = reference.clone()
    candidate[3] = torch.nn.functional.normalize(reference[3] + 0.3 * torch.randn(8), dim=0)
    verdict = judge("embedding", GateSpec(min_cosine=0.99), reference, candidate, inputs(5))
    assert not verdict.passed and verdict.worst_input == "in3" and "in3" in verdict.summary
    assert judge("embedding", GateSpec(), reference, reference + 1e-6, inputs(5)).passed


def test_classification_gate_allows_the_runner_up_only_on_close_calls():
    # fp32: input 0 clear (class 0 leads by far), input 1 a close call between classes 1 and 2.
    reference = torch.tensor([[5.0, 0.0, 0.0], [0.0, 2.0, 1.98]])
    swapped = torch.tensor([[5.0, 0.0, 0.0], [0.0, 1.9, 2.0]])
    assert judge("classification", GateSpec(top1_margin=0.05), reference, swapped, inputs(2)).passed
    wrong = torch.tensor([[0.0, 5.0, 0.0], [0.0, 2.0, 1.98]])
    verdict = judge("classification", GateSpec(top1_margin=0.05), reference, wrong, inputs(2))
    assert not verdict.passed and verdict.worst_input.startswith("in0")
    third = torch.tensor([[5.0, 0.0, 0.0], [3.0, 2.0, 1.98]])  # not even fp32's top-2
    assert not judge("classification", GateSpec(), reference, third, inputs(2)).passed


def test_tensor_gate_uses_the_entry_tolerance():
    reference = torch.ones(3, 4)
    near = reference + 0.005
    assert judge("tensor", GateSpec(atol=0.001, rtol=0.01), reference, near, inputs(3)).passed
    far = reference.clone()
    far[2, 1] += 0.5
    verdict = judge("tensor", GateSpec(atol=0.001, rtol=0.01), reference, far, inputs(3))
    assert not verdict.passed and verdict.worst_input == "in2"


# -- the build ----------------------------------------------------------------------------------
def perturbed(model):
    """A deliberately broken 'int8' variant: the weights perturbed instead of quantised."""
    broken = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in broken.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * parameter.abs().mean() * 3)
    return broken


def test_a_broken_variant_is_not_archived_and_the_build_says_where_it_failed(tiny_catalogue, tmp_path, capsys,
                                                                              monkeypatch):
    """On the tiny tensor model (tests/tiny.py), with held-out inputs of its shape."""
    monkeypatch.setattr(export, "torch_int8", perturbed)
    # This test's files beside the tiny models' (a catalogue's paths are relative to its folder).
    project, mine = tiny_catalogue.parent, tiny_catalogue.parent / tmp_path.name
    mine.mkdir()
    np.save(mine / "scans.npy", np.random.default_rng(0).uniform(0, 16, (40, 1, 4, 4)).astype(np.float32))
    entry = {k: v for k, v in catalogue_entries()["tiny_tensor"].items() if k != "serialisation"}
    entry.update(variants=["eager", "onnx", "int8"], gate={"held_out": [{"path": f"{tmp_path.name}/scans.npy"}]})
    catalogue = project / f"{tmp_path.name}.yaml"
    catalogue.write_text(yaml.safe_dump({"models": {"tiny": entry}}))
    store = tmp_path / "store"
    code = build_main(["--catalogue", str(catalogue), "--out", str(store), *QUICK])
    out = capsys.readouterr()
    text = out.out + out.err
    assert code == 0, text
    assert (store / "tiny.mar").is_file() and (store / "tiny.onnx.mar").is_file()
    assert not (store / "tiny.int8.mar").exists()
    assert "tiny int8: gate FAILED: top-1 agreement" in text and "worst scans.npy[" in text
    report = json.loads((store / "build_report.json").read_text())["models"]["tiny"]
    assert [(line["variant"], line["archive"]) for line in report] == [
        ("eager", "tiny.mar"), ("onnx", "tiny.onnx.mar"), ("int8", None)]
    assert report[2]["gate"].startswith("FAILED") and report[1]["gate"].startswith("passed")
    assert all(line["items_per_s"]["1"] > 0 for line in report)

    # The default variant failing its gate fails the entry: nothing serves a model that broke.
    entry["variants"] = ["int8", "eager"]
    catalogue.write_text(yaml.safe_dump({"models": {"tiny": entry}}))
    code = build_main(["--catalogue", str(catalogue), "--out", str(tmp_path / "store2"), *QUICK])
    text = "".join(capsys.readouterr())
    assert code == 1 and "the default variant 'int8' fails the accuracy gate" in text and "scans.npy[" in text


# -- ONNX Runtime -------------------------------------------------------------------------------
def test_onnx_session_runs_on_the_given_threads_and_matches_torch(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    path = export_onnx(model, (torch.randn(2, 16),), tmp_path / "m.onnx")
    session = load_onnx(path, threads=1)
    assert session.intra_op_threads == 1 and load_onnx(path, threads=2).intra_op_threads == 2
    batch = torch.randn(5, 16)  # another batch size than exported with: the batch dimension is dynamic
    with torch.no_grad():
        assert torch.allclose(session(batch), model(batch), atol=1e-5)
    quantized = load_onnx(quantize_int8(path, tmp_path / "q.onnx"), threads=1)(batch)
    assert quantized.shape == (5, 4) and not torch.equal(quantized, session(batch))


class ResidualNorm(torch.nn.Module):
    """A transformer block's tail: dense, bias, residual, LayerNorm (what SkipLayerNormFusion fuses)."""

    def __init__(self):
        super().__init__()
        self.dense, self.norm = torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(self.dense(x) + x)


def test_the_cpu_session_leaves_add_and_layernorm_unfused(tmp_path, monkeypatch):
    import onnx
    import onnxruntime as ort

    from handlers import onnx_session

    path = export_onnx(ResidualNorm().eval(), (torch.randn(2, 8, 16),), tmp_path / "m.onnx")

    def optimised_ops(disabled):
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / "optimised.onnx")
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
        return {node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node}

    assert "SkipLayerNormalization" in optimised_ops(None)  # the graph has what the rewrite fuses
    assert "SkipLayerNormalization" not in optimised_ops(list(onnx_session.CPU_DISABLED_OPTIMIZERS))
    seen = []
    real = ort.InferenceSession
    monkeypatch.setattr(ort, "InferenceSession", lambda *a, **k: seen.append(k) or real(*a, **k))
    load_onnx(path, threads=1)
    assert seen[-1]["disabled_optimizers"] == list(onnx_session.CPU_DISABLED_OPTIMIZERS)


def test_keep_fp32_names_must_exist(tmp_path):
    from build.errors import ExportError

    path = export_onnx(torch.nn.Linear(4, 2).eval(), (torch.randn(2, 4),), tmp_path / "m.onnx")
    with pytest.raises(ExportError, match="no node 'nope'"):
        quantize_int8(path, tmp_path / "q.onnx", keep_fp32=["nope"])


# -- config.properties and the tuner ------------------------------------------------------------
def test_the_chosen_variant_is_what_load_models_and_marname_name():
    from serving import properties
    from serving.ts_config import ModelSettings

    shipped = (REPO_ROOT / "config.properties").read_text()
    text = rewrite(shipped, [Update("minilm", ModelSettings(batch_size=4, max_batch_delay_ms=2),
                                     archive="minilm.onnx-int8.mar")])
    props = properties.parse(text)
    models = json.loads(props["models"])
    assert models["minilm"]["1.0"]["marName"] == "minilm.onnx-int8.mar"
    assert "minilm=minilm.onnx-int8.mar" in props["load_models"].split(",")
    assert "efficientnet_lite0=efficientnet_lite0.mar" in props["load_models"].split(",")


def test_load_models_all_refuses_two_archives_of_one_model(tmp_path):
    import zipfile

    for file in ("minilm.mar", "minilm.onnx.mar", "digits.mar"):
        name = file.split(".")[0]
        with zipfile.ZipFile(tmp_path / file, "w") as mar:
            mar.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": name}}))
    with pytest.raises(ServingConfigError, match="'minilm' from 2 archives"):
        startup_archives("all", tmp_path)
    assert startup_archives("minilm=minilm.onnx.mar,digits.mar", tmp_path) == {"minilm": "minilm.onnx.mar",
                                                                               "digits": "digits.mar"}


def built(*lines):
    return BuildResult("m", REPO_ROOT / "m.mar", False, variants=tuple(
        VariantResult(name, None if gate.startswith("FAILED") else REPO_ROOT / f"m.{name}.mar", gate, None, 1.0,
                      {}, False) for name, gate in lines))


def test_only_variants_that_passed_the_gate_are_tuned():
    result = built(("torchscript", "passed"), ("onnx-int8", "passed"), ("int8", "FAILED: min cosine 0.88"))
    assert eligible(result, None) == ["torchscript", "onnx-int8"]
    with pytest.raises(TuneError, match="--variant int8: not archived.*0.88"):
        eligible(result, ["int8"])
    with pytest.raises(TuneError, match="no such variant"):
        eligible(result, ["onnx"])


def test_the_tuner_keeps_the_default_unless_another_variant_is_clearly_faster():
    from benchmarks.tune.space import preset

    space = preset("tiny", 2, [1], [1, 4], [1])
    result = built(("torchscript", "passed"), ("onnx-int8", "passed"))

    def fit(ms_per_item):
        return {"points": [{"threads": 2, "batch_size": b, "service_ms": 2.0 + ms_per_item * b} for b in (1, 2, 4)]}

    quiet = lambda _: None  # noqa: E731
    faster = choose({"torchscript": fit(4.0), "onnx-int8": fit(2.0)}, result, space, 50.0, "torchscript", quiet)
    assert faster["variant"] == "onnx-int8"
    assert set(faster["variants"]) == {"torchscript", "onnx-int8"}
    assert faster["variants"]["onnx-int8"]["predicted"]["rate_rps"] > faster["variants"]["torchscript"]["predicted"]["rate_rps"]
    level = choose({"torchscript": fit(4.0), "onnx-int8": fit(3.9)}, result, space, 50.0, "torchscript", quiet)
    assert level["variant"] == "torchscript"
