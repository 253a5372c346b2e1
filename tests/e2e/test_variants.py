"""Every non-default variant's archive served by a real TorchServe, under the model's own name:
its answers to the catalogue examples over HTTP stay within the entry's accuracy gate against the
fp32 eager model (computed here, in-process, as the build's gate does), its worker passed its
self-check on this machine at load, and an ONNX Runtime worker's session runs on the worker's
thread budget (the worker reads it back from its session); a TorchScript graph serves through the
same worker. A variant this host's gate rejected is skipped with the gate's figure (tests/archived.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from build import export, gate
from build.archive import stage_files
from build.catalogue import Catalogue
from serving.launcher import TorchServe
from serving.repo import CATALOGUE, REPO_ROOT
from tests.archived import archived
from tests.e2e.helpers import examples_of

pytestmark = pytest.mark.e2e

# One server per group: one archive per model name in a server.
GROUPS = [{"minilm": "onnx-int8", "efficientnet_lite0": "onnx"}, {"minilm": "onnx", "efficientnet_lite0": "torchscript"}]


@pytest.fixture(scope="module", params=GROUPS, ids=lambda g: "+".join(f"{m}.{v}" for m, v in g.items()))
def served(request, model_store, root_config):
    group = request.param
    archives = {m: archived(model_store, m, name).name for m, name in group.items()}
    with TorchServe(model_store, base_config=root_config.path, load=tuple(group), archives=archives,
                    wait_for=tuple(group)) as ts:
        yield ts, group


def reference_answers(model: str, tmp_path):
    """fp32 eager outputs on the catalogue examples, and the family that reads them."""
    entry = Catalogue.load(CATALOGUE).entry(model)
    settings = export.served_settings(entry)
    content = stage_files(tmp_path / model, {e.name: e.source.resolve(REPO_ROOT, e.name) for e in entry.extra_files})
    stage_source = getattr(entry.model, "stage", None)
    if stage_source is not None:
        stage_source(REPO_ROOT, content)
    family = export.make_family(entry, settings, content)
    inputs = gate.gate_inputs(entry.examples, gate.GateSpec(), REPO_ROOT, model)
    outputs = gate.run_outputs(export.reference_model(entry, family, REPO_ROOT), family, inputs)
    return entry, family, outputs


def test_each_variant_answers_within_its_gate(served, tmp_path):
    ts, group = served
    for model, variant in group.items():
        entry, family, reference = reference_answers(model, tmp_path)
        answers = []
        for example, request in examples_of(model):
            resp = ts.predict(model, request.body, request.content_type)
            assert resp.status_code == 200, f"{model} {variant} {example.name}: {resp.status_code} {resp.text[:200]}"
            answers.append(resp.json())
        if family.gate_kind() == "embedding":
            got = np.array([a["embedding"] for a in answers])
            want = reference.numpy()
            cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
            assert cosine.min() >= entry.gate.min_cosine, (model, variant, cosine.min())
        else:  # served top-1 against fp32's: equal where fp32 is sure, within its top-2 where it is not
            expected = family.postprocess(reference, None)
            for example, answer, fp32 in zip(entry.examples, answers, expected):
                (first, p1), (second, p2) = list(fp32.items())[:2]
                top1 = next(iter(answer))
                allowed = {first} if p1 - p2 >= entry.gate.top1_margin else {first, second}
                assert top1 in allowed, (model, variant, example.name, top1, fp32)


def test_an_onnx_worker_runs_its_session_on_the_worker_thread_budget(served):
    ts, group = served
    log = ts.log_text("model_log.log")
    for model, variant in ((m, v) for m, v in group.items() if v.startswith("onnx")):
        ready = re.findall(rf"{re.escape(model)} ready in .* variant={re.escape(variant)} .*?threads=(\d+) .*"
                           r"onnxruntime_intra_op_threads=(\d+)", log)
        assert ready, f"no ready line for {model} {variant} with its session's threads:\n{log[-2000:]}"
        for budget, session in ready:
            assert session == budget, (model, variant, budget, session)


def test_each_variant_passed_its_self_check_on_this_machine(served):
    """The worker ran the variant on its packed held-out inputs at load (handlers/self_check.py) and
    measured it within the gate's bound, in well under a second."""
    ts, group = served
    log = ts.log_text("model_log.log")
    for model, variant in group.items():
        passed = re.findall(rf"{re.escape(model)} {re.escape(variant)}: self-check passed on this machine in "
                            r"([\d.]+) ms: (.*?) on (\d+) held-out", log)
        assert passed, f"no self-check line for {model} {variant}:\n{log[-2000:]}"
        for ms, _, inputs in passed:
            assert float(ms) < 1000 and int(inputs) >= 1, (model, variant, ms, inputs)
