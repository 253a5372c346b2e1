"""docs/own-model.md's "A family of your own" example, run as written: it must stay a working family."""

import re

import numpy as np
import pytest
import torch

from handlers.errors import BadInput, ConfigError
from serving.repo import REPO_ROOT

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def family_module():
    page = (REPO_ROOT / "docs" / "own-model.md").read_text(encoding="utf-8")
    section = page[page.index("## A family of your own"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.splitlines()) <= 50, "the README promises a family in under 50 lines"
    namespace: dict = {}
    exec(compile(code, "docs/own-model.md", "exec"), namespace)  # noqa: S102 - our own docs, on purpose
    return namespace


class Dot(torch.nn.Module):
    def forward(self, a, b):
        return (a * b).sum(dim=1, keepdim=True)


def test_readme_family_serves_a_batch(family_module):
    PairScorer, PairSettings = family_module["PairScorer"], family_module["PairSettings"]
    family = PairScorer(PairSettings(size=3), REPO_ROOT)
    items = [family.decode({"a": [1, 2, 3], "b": [1, 1, 1]}, "application/json"),
             family.decode({"a": [0, 0, 1], "b": [5, 5, 5]}, "application/json")]
    inputs = family.collate(items)
    assert family.postprocess(Dot()(*inputs), inputs) == [{"score": 6.0}, {"score": 5.0}]
    assert [t.shape for t in family.example_batch(4)] == [(4, 3), (4, 3)]
    with pytest.raises(BadInput, match="3 numbers each"):
        family.decode({"a": [1, 2], "b": [1, 2]}, "application/json")
    with pytest.raises(ConfigError, match="pair.size"):
        PairSettings(size=0)
    assert np.asarray(items[0][0]).dtype == np.float32


PAIR_MODEL = '''
import torch


class Dot(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1))

    def forward(self, a, b):
        return self.scale * (a * b).sum(dim=1, keepdim=True)
'''


def test_the_example_family_goes_through_build_handler_and_tools_with_only_its_registration(
        family_module, tmp_path, monkeypatch):
    """Adding a family touches handlers/families/ (here: one entry in FAMILIES) and the catalogue,
    nothing else: the build packs and gates an entry of it, the handler serves it with per-request
    errors, and the tools find its cases, examples and answer checks on the class."""
    import json

    import yaml

    from benchmarks.reliability.corpus import family_cases
    from build.archive import build_entry
    from build.catalogue import Catalogue
    from handlers.families import FAMILIES
    from handlers.handler import Handler
    from serving.fake_context import FakeContext, extract

    monkeypatch.setitem(FAMILIES, "pair", family_module["PairScorer"])
    (tmp_path / "pair_code").mkdir()
    (tmp_path / "pair_code" / "models.py").write_text(PAIR_MODEL)
    namespace: dict = {}
    exec(compile(PAIR_MODEL, "pair_models.py", "exec"), namespace)  # noqa: S102 - the model above
    torch.save(namespace["Dot"]().state_dict(), tmp_path / "dot.pt")
    entry = {"version": "1.0", "family": "pair",
             "model": {"python": "pair_code/models.py", "class": "Dot", "weights": {"path": "dot.pt"}},
             "serialisation": "state_dict",
             "settings": {"runtime": {"precision": "fp32", "warmup": False}, "pair": {"size": 3}},
             "examples": [{"json": {"a": [1, 2, 3], "b": [1, 1, 1]}}], "slo_ms": 50}
    (tmp_path / "catalogue.yaml").write_text(yaml.safe_dump({"models": {"scorer": entry}}))
    catalogue = Catalogue.load(tmp_path / "catalogue.yaml")
    archive = build_entry(catalogue, "scorer", tmp_path, tmp_path / "store", progress=lambda _: None).archive
    model_dir = extract(archive, tmp_path / "scorer")

    context = FakeContext(model_dir, "scorer", batch_size=4)
    handler = Handler()
    handler.initialize(context)
    context.headers = {i: {"Content-Type": "application/json"} for i in range(3)}
    bodies = [{"a": [1, 2, 3], "b": [1, 1, 1]}, {"a": [1, 2], "b": [1, 2]}, {"a": [0, 0, 1], "b": [5, 5, 5]}]
    # TorchServe hands an application/json body over parsed (ts/protocol/otf_message_handler.py).
    answers = [json.loads(a) for a in handler.handle([{"body": b} for b in bodies], context)]
    assert answers[0] == {"score": 6.0} and answers[2] == {"score": 5.0}
    assert context.statuses[1][0] == 400 and "3 numbers each" in answers[1]["message"]

    settings = handler.family.settings
    cases = family_cases("pair", settings)
    assert cases and any(not case.valid for case in cases)
    assert FAMILIES["pair"].answer_problem(settings, answers[0]) is None
    assert FAMILIES["pair"].disagreement(settings, answers[0], {"score": 6.0000001}) is None
    assert FAMILIES["pair"].disagreement(settings, answers[0], answers[2]) is not None
