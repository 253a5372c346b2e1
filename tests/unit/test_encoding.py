"""Answers leave the handler as JSON bytes with their content type, whichever encoder is at hand."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from handlers import encoding, runtime
from tests.tiny import TEXT_WIDTH
from tests.unit.conftest import make_handler

pytestmark = pytest.mark.unit

ANSWER = {"embedding": [0.1, -2.5e-08, 3.0], "label": "caf\u00e9", "top": {"a": 0.5}}


def test_orjson_and_the_fallback_encode_the_same_values(monkeypatch):
    encoding._encoder.cache_clear()
    fast = encoding.json_bytes(ANSWER)
    monkeypatch.setitem(sys.modules, "orjson", None)  # import fails: the standard library's encoder
    encoding._encoder.cache_clear()
    try:
        slow = encoding.json_bytes(ANSWER)
    finally:
        encoding._encoder.cache_clear()
    assert isinstance(fast, bytes) and isinstance(slow, bytes)
    assert json.loads(fast) == json.loads(slow) == ANSWER
    assert b"\n" not in fast + slow  # compact, unlike TorchServe's indent=2


def test_handler_answers_are_bytes_with_a_json_content_type(tiny_dirs):
    handler, context = make_handler(tiny_dirs["tiny_text"], "tiny_text")
    answers = handler.handle([{"body": {"text": "A man is eating food."}}, {"body": {"nope": 1}}], context)
    assert all(isinstance(a, bytes) for a in answers)
    assert context.content_types == {0: encoding.JSON, 1: encoding.JSON}
    assert len(json.loads(answers[0])["embedding"]) == TEXT_WIDTH
    assert json.loads(answers[1])["code"] == context.statuses[1][0] == 400


def test_the_per_batch_notice_is_dropped_and_other_lines_kept(caplog):
    runtime.drop_per_batch_log_line()
    root = logging.getLogger()
    try:
        with caplog.at_level(logging.INFO):
            caplog.handler.addFilter(runtime._PerBatchNotice())
            logging.info("Backend received inference at: %d", 1)
            logging.info("[METRICS]HandlerItems.Count:1")
        assert [r.getMessage() for r in caplog.records] == ["[METRICS]HandlerItems.Count:1"]
    finally:
        for h in root.handlers:
            h.filters = [f for f in h.filters if not isinstance(f, runtime._PerBatchNotice)]
