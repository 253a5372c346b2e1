"""How answers leave the handler: every status through one sanitising place, and each gRPC answer
marked as its request's last (TorchServe 0.12's frontend fails the worker's whole batch otherwise)."""

import re
from pathlib import Path

import pytest

from handlers.engines.torchserve import TorchServe
from handlers.errors import BadInput
from handlers.protocols import Reply
from serving.fake_context import FakeContext

pytestmark = pytest.mark.unit

HANDLERS = Path(__file__).resolve().parents[2] / "handlers"


def test_no_module_writes_a_status_but_the_one_that_sanitises_it():
    writers = [str(path.relative_to(HANDLERS)) for path in HANDLERS.rglob("*.py")
               if re.search(r"\.set_response_status\(", path.read_text())]
    # engines/batch_context.py forwards a status to the request's own context, as given to it.
    assert sorted(writers) == ["engines/batch_context.py", "engines/torchserve.py"]


def context_with(headers: dict[int, dict]) -> FakeContext:
    context = FakeContext.__new__(FakeContext)
    context.headers, context.statuses, context.response_headers = headers, {}, {}
    return context


def test_a_status_phrase_is_one_printable_line_whatever_the_message():
    context = context_with({0: {}})
    err = BadInput("unknown field '\u00e9\r\nX-Injected: 1'")
    TorchServe.write(context, 0, Reply(b"", "", status=err.status, message=err.message))
    code, phrase = context.statuses[0]
    assert code == 400 and all(32 <= ord(c) < 127 for c in phrase)


def test_grpc_answers_are_marked_last_and_rest_answers_are_left_alone():
    rest = {"explain": "False", "url_path": "", "Content-Type": "application/json"}
    context = context_with({0: {}, 1: rest, 2: {}})
    context.set_response_header(2, "ts_stream_next", "true")  # a stream's intermediate answer keeps its own
    TorchServe.reply(context, TorchServe.requests([None] * 3, context, None), [None] * 3)
    assert context.get_response_headers(0) == {"ts_stream_next": "false"}
    assert context.get_response_headers(1) == {}
    assert context.get_response_headers(2) == {"ts_stream_next": "true"}
