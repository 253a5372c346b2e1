"""The response cache on its own: keys, bounds, expiry, coalescing ."""

from __future__ import annotations

import json
import re
import time

import pytest

from handlers.errors import ConfigError
from handlers.response_cache import (
    ResponseCache,
    ResponseCacheSettings,
    coalesce,
    request_key,
)

pytestmark = pytest.mark.unit


def key(body, version="1.0", variant="torchscript", ctype="application/json"):
    return request_key("m", version, variant, body, ctype)


def test_requests_that_mean_the_same_share_a_key_and_others_do_not():
    assert key(b'{"a": 1, "b": [1, 2]}') == key(b'{"b":[1,2],"a":1}') == key({"a": 1, "b": [1, 2]})
    assert key(b'{"a": 1}') != key(b'{"a": 2}')
    assert key(b'{"a": 1}', version="1.1") != key(b'{"a": 1}')  # a new archive never meets the old answers
    assert key(b'{"a": 1}', variant="onnx") != key(b'{"a": 1}')
    assert key(b"\x89PNG", ctype="image/png") != key(b"\x89PNG", ctype="image/jpeg")


def test_the_byte_bound_holds_under_a_flood_of_distinct_large_answers():
    cache = ResponseCache(ResponseCacheSettings(max_mib=1, max_entries=10_000))
    for i in range(500):
        cache.put(key({"i": i}), bytes(10_000))
        assert cache.nbytes <= 2**20
    assert cache.take_counts().evictions > 0
    cache.put(key({"huge": 1}), bytes(2**21))  # larger than the bound: not kept
    assert cache.get(key({"huge": 1})) is None and cache.nbytes <= 2**20


def test_least_recently_used_goes_first_and_entries_are_bounded():
    cache = ResponseCache(ResponseCacheSettings(max_mib=1, max_entries=2))
    cache.put(b"a", b"1")
    cache.put(b"b", b"2")
    assert cache.get(b"a") == b"1"
    cache.put(b"c", b"3")
    assert cache.get(b"b") is None and cache.get(b"a") == b"1" and cache.get(b"c") == b"3"


def test_answers_expire_after_their_time_to_live():
    now = [0.0]
    cache = ResponseCache(ResponseCacheSettings(max_mib=1, ttl_s=5), clock=lambda: now[0])
    cache.put(b"k", b"answer")
    now[0] = 4.9
    assert cache.get(b"k") == b"answer"
    now[0] = 5.1
    assert cache.get(b"k") is None and cache.nbytes == 0


def test_identical_requests_in_a_batch_point_at_the_first():
    assert coalesce([b"x", b"y", b"x", None, b"y"]) == {0: 0, 1: 1, 2: 0, 4: 1}


def test_bad_settings_name_the_section():
    with pytest.raises(ConfigError, match="response_cache"):
        ResponseCacheSettings(max_entries=0)


# ---- in the handler (a tiny tensor model, a fake TorchServe context) --------------------------
@pytest.fixture
def tensor_cached(tiny_dirs):
    from tests.unit.conftest import make_handler

    handler, context = make_handler(tiny_dirs["tiny_tensor"], "tiny_tensor", batch_size=8,
                                    response_cache={"max_mib": 1})
    computed = []
    infer = handler.infer

    def counting(inputs):
        computed.append(int(inputs.shape[0]))
        return infer(inputs)

    handler.infer = counting
    return handler, context, computed


def scans():
    """Two different inputs of the tiny model's shape [1, 4, 4]."""
    import json

    import numpy as np

    one = np.arange(16, dtype=float).reshape(1, 4, 4)
    return json.dumps({"inputs": one.tolist()}).encode(), json.dumps({"inputs": (16 - one).tolist()}).encode()


def send(handler, context, bodies, headers=None):
    context.headers = {i: {"Content-Type": "application/json", **((headers or {}).get(i, {}))} for i in range(len(bodies))}
    context.statuses.clear()
    return handler.handle([{"body": b} for b in bodies], context)


def test_a_repeat_in_a_batch_is_computed_once_and_a_cached_answer_is_byte_identical(tensor_cached):
    handler, context, computed = tensor_cached
    scan, other = scans()
    first = send(handler, context, [scan, other, scan, b"{not json"])
    assert computed == [2]  # scan and other; the repeat is answered with the first's answer
    assert first[0] == first[2] and first[0] != first[1] and context.statuses[3][0] == 400
    again = send(handler, context, [scan, b"{not json"])
    assert computed == [2] and again[0] == first[0]  # from the cache: no model call
    assert context.statuses[1][0] == 400  # an error is never cached: checked again, refused again
    fresh = send(handler, context, [scan], headers={0: {"Cache-Control": "no-cache"}})
    assert computed == [2, 1] and fresh[0] == first[0]
    assert context.metrics.last("ResponseCacheHits") == 0 and context.metrics.last("ResponseCacheBytes") > 0


def test_a_new_archive_version_never_gets_the_old_answers(tensor_cached):
    handler, context, computed = tensor_cached
    scan, _ = scans()
    send(handler, context, [scan])
    handler.version = "2.0"
    send(handler, context, [scan])
    assert computed == [1, 1]


def test_a_body_the_cache_cannot_key_is_refused_alone(tensor_cached):
    """A form with several fields and JSON nested past Python's recursion limit (TorchServe forwards
    both as they came) are each refused for themselves; their batch-mates are answered."""
    handler, context, _ = tensor_cached
    scan, other = scans()
    deep = b"[" * 100_000 + b"]" * 100_000
    answers = handler.handle([{"body": scan}, {"a": b"1", "b": b"2"}, {"body": deep}, {"body": other}],
                             _with_headers(context, 4))
    assert {idx: status for idx, (status, _) in context.statuses.items()} == {1: 400, 2: 400}
    assert re.search("nest|depth", json.loads(answers[2])["message"])
    assert all("code" not in json.loads(answers[idx]) for idx in (0, 3)) and answers[0] != answers[3]


def test_a_repeat_is_answered_by_its_own_deadline_not_its_twins(tensor_cached):
    handler, context, computed = tensor_cached
    scan, _ = scans()
    long_ago = str(int(time.time() * 1000) - 30_000)
    context = _with_headers(context, 3, {0: {"X-Request-Timeout-Ms": "5", "X-Request-Start-Ms": long_ago}})
    answers = handler.handle([{"body": scan}] * 3, context)
    assert {idx: status for idx, (status, _) in context.statuses.items()} == {0: 504}
    assert answers[1] == answers[2] and "code" not in json.loads(answers[1]) and computed == [1]


def _with_headers(context, n, extra=None):
    context.headers = {i: {"Content-Type": "application/json", **((extra or {}).get(i, {}))} for i in range(n)}
    context.statuses.clear()
    return context
