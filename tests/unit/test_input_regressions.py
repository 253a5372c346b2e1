"""Handler bugs the bad-input corpus found, each pinned by a test (text_embedder.text_from_body)."""

import pytest

from handlers.errors import BadInput, PayloadTooLarge
from handlers.families.text_embedder import TextSettings, text_from_body
from tests.references import decoded
from tests.tiny import TEXT_WIDTH

from .conftest import make_handler

pytestmark = pytest.mark.unit

SETTINGS = TextSettings()


@pytest.fixture(scope="module")
def served(tiny_dirs):
    return make_handler(tiny_dirs["tiny_text"], "tiny_text")


def test_lone_surrogate_fails_alone_not_its_batch(served):
    """Was: the tokenizer raised TypeError in collate, failing every request of the batch with a 500."""
    handler, context = served
    context.statuses.clear()
    answers = decoded(handler.handle([{"body": {"text": "fine"}}, {"body": {"text": "bad \ud800 half"}},
                              {"body": "also fine"}], context))
    assert set(context.statuses) == {1} and context.statuses[1][0] == 400
    assert "surrogate" in answers[1]["message"]
    assert len(answers[0]["embedding"]) == TEXT_WIDTH and len(answers[2]["embedding"]) == TEXT_WIDTH
    context.statuses.clear()


def test_only_control_characters_is_refused():
    """Was: 200 with the embedding of an empty sequence."""
    for text in ("\x00\x01\x02", "\x1b\x07", "\t\x00\n\x7f\x9f"):
        with pytest.raises(BadInput, match="no visible characters"):
            text_from_body(text, "text/plain", SETTINGS)
    assert text_from_body("ok\x00\x07", "text/plain", SETTINGS) == "ok\x00\x07"


def test_integer_over_python_digit_limit_is_malformed_json():
    """Was: ValueError fell through to the catch-all 'the request could not be read' (and a traceback)."""
    with pytest.raises(BadInput, match="malformed JSON: Exceeds the limit"):
        text_from_body(b'{"text": ' + b"9" * 5000 + b"}", "application/json", SETTINGS)


@pytest.mark.parametrize("body, ctype", [("a" * (1024 * 1024 + 1), "text/plain"),
                                         ({"text": "b" * (1024 * 1024 + 1)}, "application/json"),
                                         ("\u00e9" * (512 * 1024 + 1), "text/plain"),
                                         # was: 200, only the text measured
                                         ({"text": "short", "pad": "d" * (1024 * 1024)}, "application/json"),
                                         ({"text": "short", "pad": ["e" * 1023] * 1025}, "application/json")])
def test_size_limit_applies_to_bodies_torchserve_decoded(body, ctype):
    """Was: TorchServe decodes text/* and JSON bodies before the handler, so the byte limit never ran."""
    with pytest.raises(PayloadTooLarge, match="over the limit of 1048576"):
        text_from_body(body, ctype, SETTINGS)
    assert text_from_body("c" * 1024 * 1024, "text/plain", SETTINGS)  # at the limit: accepted
