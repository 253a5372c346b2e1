"""The trained tinylm's archive in-process: speculation accepts drafts where a trained model makes
them likely (prompt lookup on a repeated paragraph; its distilled draft model) and changes nothing.
That any drafter leaves greedy output unchanged, on random weights: tests/unit."""

from __future__ import annotations

import pytest

from handlers.generation.drafting import LookupDrafter, RecurrentDrafter
from handlers.generation.engine import Engine

from .conftest import make_handler

pytestmark = pytest.mark.archives

PROMPTS = ["The for statement is used to", "A class definition", "Names refer to objects."]


@pytest.fixture(scope="module")
def tinylm(archive_dirs):
    return make_handler(archive_dirs["tinylm"], "tinylm", batch_size=4)


def twin(engine: Engine, **kw) -> Engine:
    return Engine(engine.lm, engine.decode, engine.eos_id, engine.max_positions, **kw)


def lookup_twin(engine: Engine) -> Engine:
    return twin(engine, drafter=LookupDrafter())


def test_trained_model_lookup_accepts_drafts_on_a_repeated_paragraph_and_changes_nothing(tinylm):
    from pydoc_data.topics import topics

    handler, _ = tinylm
    engine, family = handler.generation.engine, handler.family
    paragraph = topics["if"][:400]
    accepted = []
    for prompt in (paragraph + "\n\nAgain:\n\n" + paragraph[:60], PROMPTS[0]):
        request = family.decode({"prompt": prompt, "max_new_tokens": 64, "ignore_eos": True}, "")
        spec = lookup_twin(engine).generate([("s", request)])["s"]
        assert spec.generated_ids == engine.generate([("s", request)])["s"].generated_ids
        accepted.append(spec.draft.accepted)
    assert accepted[0] >= 16  # the repeated paragraph is copied in drafts


def test_trained_model_with_its_draft_accepts_and_changes_nothing(archive_dirs):
    handler, _ = make_handler(archive_dirs["tinylm"], "tinylm", causal_lm={"speculation": "draft"})
    engine, family = handler.generation.engine, handler.family
    assert isinstance(engine.drafter, RecurrentDrafter)
    plain = twin(engine)
    for prompt in ("The for statement is used to", "A class definition"):
        request = family.decode({"prompt": prompt, "max_new_tokens": 64, "ignore_eos": True}, "")
        spec = engine.generate([("s", request)])["s"]
        assert spec.generated_ids == plain.generate([("s", request)])["s"].generated_ids
        assert spec.draft.accepted >= spec.draft.proposed // 3  # the distilled draft guesses well
