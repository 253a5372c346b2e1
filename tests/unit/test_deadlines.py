"""Per-request deadlines through the fake context, on the tiny models of every request/response family:
an expired request gets its 504 without being computed and its batch-mates are answered exactly as
alone, in a smaller forward pass; malformed deadline headers get a 400 naming the header; the
catalogue's runtime.deadline_ms applies when a request sends no budget; the counters say what happened."""

from __future__ import annotations

import time

import pytest

from build.catalogue import Catalogue
from build.examples import worker_input
from handlers.deadlines import MAX_TIMEOUT_MS, START_HEADER, TIMEOUT_HEADER, ServiceTime
from handlers.errors import ConfigError
from handlers.families import family_class
from handlers.settings import RuntimeSettings, parse_section
from handlers.stage_metrics import DEADLINE_EXPIRED_METRIC, DEADLINE_LATE_METRIC
from serving.fake_context import FakeMetrics
from tests.references import decoded

from .conftest import make_handler

pytestmark = pytest.mark.unit

FAMILIES = ("tiny_tensor", "tiny_text", "tiny_forecast", "tiny_image")


class CountingModel:
    """The handler's model, recording the batch size of every forward pass."""

    def __init__(self, model):
        self.model = model
        self.batch_sizes: list[int] = []

    def __call__(self, *tensors):
        self.batch_sizes.append(int(tensors[0].shape[0]))
        return self.model(*tensors)


def now_ms() -> int:
    return int(time.time() * 1000)


def expired_headers() -> dict[str, str]:
    """Sent ten seconds ago with a 50 ms budget."""
    return {TIMEOUT_HEADER: "50", START_HEADER: str(now_ms() - 10_000)}


@pytest.fixture(scope="module")
def handlers_by_name(tiny_dirs):
    return {name: make_handler(tiny_dirs[name], name) for name in FAMILIES}


@pytest.fixture(scope="module")
def examples(tiny_catalogue):
    """Each tiny model's catalogue examples as a worker receives them: (body, content type)."""
    catalogue = Catalogue.load(tiny_catalogue)
    out = {}
    for name in FAMILIES:
        requests = [e.request(tiny_catalogue.parent) for e in catalogue.entry(name).examples]
        out[name] = [(worker_input(r.body, r.content_type), r.content_type) for r in requests]
    return out


def run(handler, context, requests, headers=None, service=None):
    """One batch; `headers[i]`: request i's extra headers; `service`: the worker's recent batch times
    (default: none yet, so that only passed deadlines count). Returns the decoded answers."""
    handler.service_time = service or ServiceTime()
    context.metrics, context.statuses = FakeMetrics(), {}
    context.headers = {i: {"Content-Type": ctype, **(headers or {}).get(i, {})} for i, (_, ctype) in enumerate(requests)}
    return decoded(handler.handle([{"body": body} for body, _ in requests], context))


def counter(context, name: str, **labels) -> float:
    return sum(value for kind, metric, value, dims in context.metrics.calls
               if metric == name and kind == "counter" and all(dims.get(k) == v for k, v in labels.items()))


@pytest.mark.parametrize("name", FAMILIES)
def test_expired_request_gets_504_and_its_batch_mates_run_as_alone(name, handlers_by_name, examples, monkeypatch):
    handler, context = handlers_by_name[name]
    first, second = examples[name][0], examples[name][1 % len(examples[name])]
    alone = [run(handler, context, [request])[0] for request in (first, second)]
    counting = CountingModel(handler.model)
    monkeypatch.setattr(handler, "model", counting)

    answers = run(handler, context, [first, second, first], headers={1: expired_headers()})

    assert set(context.statuses) == {1}
    status, phrase = context.statuses[1]
    assert status == 504 and "deadline exceeded" in phrase and "not computed" in phrase
    assert answers[1]["code"] == 504 and answers[1]["type"] == "DeadlineExceeded"
    family = family_class(handler.settings.family)
    for got, want in ((answers[0], alone[0]), (answers[2], alone[0])):
        assert family.disagreement(handler.settings.family_settings, got, want) is None
    assert counting.batch_sizes == [2]  # one forward pass, without the expired request
    assert counter(context, DEADLINE_EXPIRED_METRIC, Stage="before_decode", ModelName=name) == 1


def test_a_budget_used_up_by_decoding_expires_before_the_model_runs(handlers_by_name, examples, monkeypatch):
    """Counted from the worker's receipt of the batch: a slow decode of the batch leaves it no time."""
    handler, context = handlers_by_name["tiny_tensor"]
    decode = handler.family.decode

    def slow_decode(body, content_type):
        time.sleep(0.2)
        return decode(body, content_type)

    monkeypatch.setattr(handler.family, "decode", slow_decode)
    counting = CountingModel(handler.model)
    monkeypatch.setattr(handler, "model", counting)
    request = examples["tiny_tensor"][0]

    answers = run(handler, context, [request, request], headers={0: {TIMEOUT_HEADER: "50"}})

    assert context.statuses[0][0] == 504 and "before the model ran" in context.statuses[0][1]
    assert "receipt of its batch" in answers[0]["message"]
    assert 1 not in context.statuses and counting.batch_sizes == [1]
    assert counter(context, DEADLINE_EXPIRED_METRIC, Stage="before_inference") == 1


def test_a_batch_of_expired_requests_never_reaches_the_model(handlers_by_name, examples, monkeypatch):
    handler, context = handlers_by_name["tiny_text"]
    counting = CountingModel(handler.model)
    monkeypatch.setattr(handler, "model", counting)
    requests = examples["tiny_text"][:2]

    run(handler, context, requests, headers={0: expired_headers(), 1: expired_headers()})

    assert [context.statuses[i][0] for i in (0, 1)] == [504, 504]
    assert counting.batch_sizes == []
    assert counter(context, DEADLINE_EXPIRED_METRIC) == 2


def test_an_answer_computed_past_its_deadline_is_sent_and_counted_late(handlers_by_name, examples, monkeypatch):
    handler, context = handlers_by_name["tiny_tensor"]
    model = handler.model

    def slow_model(*tensors):
        time.sleep(0.2)
        return model(*tensors)

    monkeypatch.setattr(handler, "model", slow_model)
    run(handler, context, examples["tiny_tensor"][:1], headers={0: {TIMEOUT_HEADER: "100"}})

    assert not context.statuses
    assert counter(context, DEADLINE_LATE_METRIC) == 1 and counter(context, DEADLINE_EXPIRED_METRIC) == 0


@pytest.mark.parametrize("name, value", [
    (TIMEOUT_HEADER, "abc"), (TIMEOUT_HEADER, "-5"), (TIMEOUT_HEADER, "1.5"), (TIMEOUT_HEADER, "1e3"),
    (TIMEOUT_HEADER, ""), (TIMEOUT_HEADER, "0"), (TIMEOUT_HEADER, str(MAX_TIMEOUT_MS + 1)),
    (TIMEOUT_HEADER, "9" * 40), (START_HEADER, "1700000000"), (START_HEADER, "soon"),
    (START_HEADER, "+1"), (START_HEADER, "in ten minutes"),
])
def test_malformed_deadline_headers_get_400_naming_the_header(name, value, handlers_by_name, examples):
    handler, context = handlers_by_name["tiny_tensor"]
    request = examples["tiny_tensor"][0]
    answers = run(handler, context, [request, request], headers={0: {TIMEOUT_HEADER: "1000", name: value}})
    status, phrase = context.statuses[0]
    assert status == 400 and phrase.startswith(name), phrase
    assert answers[0]["type"] == "BadInput" and 1 not in context.statuses


def test_a_start_stamp_far_ahead_of_the_worker_clock_is_refused(handlers_by_name, examples):
    handler, context = handlers_by_name["tiny_tensor"]
    request = examples["tiny_tensor"][0]
    run(handler, context, [request], headers={0: {TIMEOUT_HEADER: "1000", START_HEADER: str(now_ms() + 600_000)}})
    assert context.statuses[0][0] == 400 and START_HEADER in context.statuses[0][1]


def test_header_names_match_in_any_case(handlers_by_name, examples):
    handler, context = handlers_by_name["tiny_tensor"]
    request = examples["tiny_tensor"][0]
    late = {"x-request-timeout-ms": "50", "X-REQUEST-START-MS": str(now_ms() - 10_000)}
    run(handler, context, [request, request], headers={0: late, 1: {"x-request-timeout-ms": "bad"}})
    assert context.statuses[0][0] == 504 and context.statuses[1][0] == 400


def test_the_catalogue_default_applies_when_a_request_sends_no_budget(tiny_dirs, examples):
    handler, context = make_handler(tiny_dirs["tiny_tensor"], "tiny_tensor", runtime={"deadline_ms": 50})
    request = examples["tiny_tensor"][0]
    second_ago = {START_HEADER: str(now_ms() - 1000)}
    answers = run(handler, context, [request, request, request],
                  headers={0: second_ago, 1: {**second_ago, TIMEOUT_HEADER: "5000"}})
    assert context.statuses[0][0] == 504 and "runtime.deadline_ms" in answers[0]["message"]
    assert 1 not in context.statuses  # the request's own budget replaces the default
    assert 2 not in context.statuses  # 50 ms from the worker's receipt: computed in time


@pytest.mark.parametrize("value", [-1, MAX_TIMEOUT_MS + 1, True, 1.5])
def test_deadline_setting_out_of_range_is_an_error_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"runtime\.deadline_ms"):
        parse_section(RuntimeSettings, {"deadline_ms": value}, "handler.runtime")


def test_no_deadline_by_default():
    assert RuntimeSettings().deadline_ms == 0


def test_a_request_left_less_than_a_batch_takes_is_not_computed(handlers_by_name, examples, monkeypatch):
    """Under overload a request picked up just before its deadline would be answered late anyway."""
    handler, context = handlers_by_name["tiny_tensor"]
    counting = CountingModel(handler.model)
    monkeypatch.setattr(handler, "model", counting)
    request = examples["tiny_tensor"][0]
    slow = ServiceTime(before_decode_s=0.5, before_inference_s=0.4)

    answers = run(handler, context, [request, request], headers={0: {TIMEOUT_HEADER: "200"}, 1: {TIMEOUT_HEADER: "5000"}},
                  service=slow)

    assert context.statuses[0][0] == 504 and "less than the 500 ms" in answers[0]["message"]
    assert 1 not in context.statuses and counting.batch_sizes == [1]


def test_service_time_follows_the_computed_batches():
    service = ServiceTime()
    service.update({"preprocess": 10.0, "inference": 30.0, "postprocess": 10.0})
    assert (service.before_decode_s, service.before_inference_s) == pytest.approx((0.05, 0.04))
    service.update({"preprocess": 10.0, "inference": 80.0, "postprocess": 10.0})
    assert (service.before_decode_s, service.before_inference_s) == pytest.approx((0.06, 0.05))


def test_a_batch_updates_the_service_time(handlers_by_name, examples):
    handler, context = handlers_by_name["tiny_tensor"]
    run(handler, context, examples["tiny_tensor"][:1])
    assert handler.service_time.before_decode_s > handler.service_time.before_inference_s > 0
