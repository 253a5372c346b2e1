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
