"""KServe v1 and Open Inference Protocol v2 requests through the real handler, on tiny models of the
text, image and tensor families (tests/tiny.py).

Every family answers v1 and v2 requests with exactly the answers /predictions gives for the same
inputs: a batch mixing a /predictions request, a v1 request of 3 instances and a v2 request of 2 is
compared with a /predictions-only batch of the same 6 items in the same order (the same collated
tensors, so the same numbers, bit for bit). Each malformed envelope, and each instance its family
refuses, is answered alone (400/413/500 naming the field) while its batch-mates are answered.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from PIL import Image

from handlers import kserve
from handlers.kserve import Envelope
from handlers.limits import MAX_INSTANCES
from tests.tiny import TEXT_WIDTH

from .conftest import encode, make_handler

pytestmark = pytest.mark.unit

# The headers a worker sees (TorchServe 0.12, InferenceRequestHandler): /predictions adds `explain`
# AND `url_path`, the KServe routes `explain` only.
PREDICTIONS = {"explain": "False", "url_path": "", "Content-Type": "application/json"}
KSERVE = {"explain": "False", "Content-Type": "application/json"}
SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome.",
             "A woman is playing the violin.", "TorchServe batches requests.", "Revenue grows faster than costs."]


@dataclass(frozen=True)
class Req:
    body: Any  # as the worker hands it over: dict for application/json, else bytes or str
    headers: dict[str, str]


@dataclass(frozen=True)
class Answer:
    status: int
    raw: bytes
    content_type: str = ""
    headers: Any = None  # the response headers the handler set

    @property
    def json(self):
        return json.loads(self.raw)


def run(handler, context, batch: list[Req]) -> list[Answer]:
    context.headers = {i: r.headers for i, r in enumerate(batch)}
    context.statuses, context.content_types, context.response_headers = {}, {}, {}
    raw = handler.handle([{"body": r.body} for r in batch], context)
    answers = [Answer(context.statuses.get(i, (200, ""))[0], raw[i], context.content_types.get(i, ""),
                      context.get_response_headers(i)) for i in range(len(batch))]
    context.headers, context.statuses = {}, {}
    return answers


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def v1(instances) -> Req:
    return Req({"instances": instances}, KSERVE)


def v2(datatype: str, shape, data, **extra) -> Req:
    return Req({"inputs": [{"name": "input-0", "shape": shape, "datatype": datatype, "data": data}], **extra}, KSERVE)


# ---- one family's inputs in the three protocols --------------------------------------------------
@dataclass(frozen=True)
class Forms:
    model: str
    inputs: list[Any]
    plain: Callable[[Any], Req]  # one input as a /predictions request
    instance: Callable[[int, Any], Any]  # one input as the i-th v1 instance
    tensor: Callable[[list[Any]], Req]  # inputs as one v2 request


def _scans() -> list[np.ndarray]:
    """Inputs of the tiny tensor model ([1, 4, 4], 0..16): whole numbers, so every v2 datatype holds them."""
    rng = np.random.default_rng(5)
    scans = [rng.integers(0, 17, (1, 4, 4)).astype(np.float32) for _ in range(4)]
    return scans + [np.clip(scans[0] + 1, 0, 16), np.clip(scans[1] * 0.5, 0, 16)]


def _images(photos) -> list[bytes]:
    """JPEGs of several sizes and a PNG."""
    cat, coffee = (Image.open(io.BytesIO(photos[k])).convert("RGB") for k in ("cat", "coffee"))
    jpegs = [encode(image.resize(size), "JPEG", quality=90) for image in (cat, coffee) for size in ((64, 48), (40, 40))]
    return jpegs + [encode(coffee, "JPEG", quality=90), photos["cat"]]


def forms_of(model: str, photos) -> Forms:
    if model == "tiny_text":
        return Forms(model, SENTENCES, lambda s: Req({"text": s}, PREDICTIONS),
                     lambda i, s: s if i % 2 else {"text": s},  # v1 takes plain strings and JSON objects
                     lambda ss: v2("BYTES", [len(ss)], ss))
    if model == "tiny_image":
        images = _images(photos)
        return Forms(model, images, lambda data: Req(data, {**PREDICTIONS, "Content-Type": "image/jpeg"}),
                     lambda i, data: {"data" if i % 2 else "b64": b64(data)},  # both conventions
                     lambda datas: v2("BYTES", [len(datas)], [b64(d) for d in datas]))
    scans = _scans()
    return Forms(model, scans, lambda a: Req({"inputs": a.tolist()}, PREDICTIONS),
                 lambda i, a: {"data": a.reshape(-1).tolist(), "shape": list(a.shape)} if i % 2
                 else {"inputs": a.tolist()},
                 lambda arrays: v2("FP32", [len(arrays), 1, 4, 4], np.stack(arrays).tolist()))


MODELS = ["tiny_text", "tiny_image", "tiny_tensor"]


@pytest.fixture(scope="module")
def handlers_(tiny_dirs):
    return {model: make_handler(tiny_dirs[model], model) for model in MODELS}


@pytest.mark.parametrize("model", MODELS)
def test_mixed_batch_each_in_its_protocol(handlers_, photos, model):
    """/predictions + v1 (3 instances) + v2 (2) in one batch: each answered in its own format, with
    the answers a /predictions-only batch of the same six items gives, byte for byte."""
    handler, context = handlers_[model]
    forms = forms_of(model, photos)
    reference = run(handler, context, [forms.plain(x) for x in forms.inputs])
    assert [a.status for a in reference] == [200] * 6
    expected = [a.json for a in reference]

    items_before = len(context.metrics.calls)
    mixed = run(handler, context, [forms.plain(forms.inputs[0]),
                                   v1([forms.instance(i, x) for i, x in enumerate(forms.inputs[1:4])]),
                                   forms.tensor(forms.inputs[4:6])])
    assert [a.status for a in mixed] == [200, 200, 200], [a.raw[:300] for a in mixed]
    assert mixed[0].raw == reference[0].raw  # /predictions: untouched
    assert mixed[1].json == {"predictions": expected[1:4]}
    answer = mixed[2].json
    assert answer["model_name"] == model and isinstance(answer["id"], str) and answer["id"]
    (output,) = answer["outputs"]
    assert output["name"] == "output-0"
    if model == "tiny_text":  # embeddings: one FP32 [n, d] tensor
        assert output["datatype"] == "FP32" and output["shape"] == [2, TEXT_WIDTH]
        assert output["data"] == expected[4]["embedding"] + expected[5]["embedding"]
    else:  # class probabilities: one JSON string per instance, exactly the /predictions answer
        assert output["datatype"] == "BYTES" and output["shape"] == [2]
        assert [s.encode() for s in output["data"]] == [reference[4].raw, reference[5].raw]
    # All six instances went through one forward pass.
    batch_sizes = [c for c in context.metrics.calls[items_before:] if "BatchSize" in c[3]]
    assert {c[3]["BatchSize"] for c in batch_sizes} == {"6"}, batch_sizes


def test_v2_numeric_forms_and_datatypes(handlers_):
    """Flat or nested data, FP32/FP64/INT32/UINT8: the same answers as /predictions."""
    handler, context = handlers_["tiny_tensor"]
    scans = _scans()[:2]
    expected = [a.json for a in run(handler, context, [Req({"inputs": s.tolist()}, PREDICTIONS) for s in scans])]
    flat = np.stack(scans).reshape(-1)
    batch = [v2("FP32", [2, 1, 4, 4], flat.tolist()), v2("FP64", [2, 1, 4, 4], np.stack(scans).tolist()),
             v2("INT32", [2, 1, 4, 4], flat.astype(int).tolist()), v2("UINT8", [2, 1, 4, 4], flat.astype(int).tolist())]
    for answer in run(handler, context, batch):
        assert answer.status == 200, answer.raw
        assert [json.loads(s) for s in answer.json["outputs"][0]["data"]] == expected


def test_v2_id_echoed_or_generated(handlers_):
    handler, context = handlers_["tiny_text"]
    given, generated, again = run(handler, context, [v2("BYTES", [1], ["hi"], id="req-7"), v2("BYTES", [1], ["hi"]),
                                                     v2("BYTES", [1], ["hi"])])
    assert given.json["id"] == "req-7"
    assert generated.json["id"] and generated.json["id"] != again.json["id"]


def test_detection_needs_the_route_and_an_envelope(handlers_):
    """From /predictions (`url_path` set) or with no `explain` header: a /predictions body, whatever
    its keys. From a KServe route but with no instances/inputs: still /predictions. Header names are
    case-insensitive; a body TorchServe did not parse (no JSON content type) is read here."""
    handler, context = handlers_["tiny_text"]
    envelope = json.dumps({"instances": ["A man is eating food."]}).encode()
    predictions, no_header, plain_on_kserve, upper, unparsed = run(handler, context, [
        Req({"instances": ["A man is eating food."]}, PREDICTIONS),
        Req({"instances": ["A man is eating food."]}, {"Content-Type": "application/json"}),
        Req({"text": "A man is eating food."}, KSERVE),
        Req({"instances": ["A man is eating food."]}, {"EXPLAIN": "False", "content-type": "application/json"}),
        Req(envelope, {"explain": "False"}),
    ])
    for answer in (predictions, no_header):
        assert answer.status == 400 and '"text" field' in answer.json["message"]
        assert "error" not in answer.json  # a /predictions rejection keeps today's body
    assert plain_on_kserve.status == 200 and list(plain_on_kserve.json) == ["embedding"]
    for answer in (upper, unparsed):
        assert answer.status == 200 and answer.json["predictions"][0] == plain_on_kserve.json


def test_tensor_predictions_form_is_not_an_envelope(handlers_):
    """The tensor family's own /predictions form {"inputs": <nested list>} with the headers
    /predictions really carries (`explain` too): answered as /predictions, not as a v2 request."""
    handler, context = handlers_["tiny_tensor"]
    body = {"inputs": _scans()[3].tolist()}
    (answer,) = run(handler, context, [Req(body, PREDICTIONS)])
    (plain,) = run(handler, context, [Req(body, {"Content-Type": "application/json"})])  # no KServe route
    assert answer.status == plain.status == 200 and answer.raw == plain.raw, answer.raw
    assert "outputs" not in answer.json and "predictions" not in answer.json


def test_instance_limit(handlers_):
    handler, context = handlers_["tiny_text"]
    at_limit, over_v1, over_v2 = run(handler, context, [
        v1(["word"] * MAX_INSTANCES), v1(["word"] * (MAX_INSTANCES + 1)),
        v2("BYTES", [MAX_INSTANCES + 1], ["word"] * (MAX_INSTANCES + 1))])
    assert at_limit.status == 200 and len(at_limit.json["predictions"]) == MAX_INSTANCES
    for answer, field in ((over_v1, "instances:"), (over_v2, "inputs[0].shape[0]:")):
        assert answer.status == 413 and field in answer.json["message"]
        assert f"limit of {MAX_INSTANCES}" in answer.json["message"]


# ---- errors: each answered alone, the batch-mates answered ---------------------------------------
TEXT_OK = v2("BYTES", [1], ["fine"])
BAD = {
    "tiny_text": [
        (v1([]), 400, "instances: a non-empty list"),
        (v1("A man"), 400, "instances: a non-empty list"),
        (Req({"inputs": []}, KSERVE), 400, "inputs: a non-empty list"),
        (Req({"inputs": TEXT_OK.body["inputs"] * 2}, KSERVE), 400, "inputs: exactly one input tensor, got 2"),
        (Req({"instances": ["a"], "inputs": []}, KSERVE), 400, "either"),
        (v2("BYTES", [3], ["a", "b"]), 400, "inputs[0].shape: [3] declares 3 strings, data holds 2"),
        (v2("BYTES", [2, 2], ["a", "b", "c", "d"]), 400, "inputs[0].shape: [2, 2]"),
        (v2("STRING", [1], ["a"]), 400, "inputs[0].datatype: 'STRING' is not one of"),
        (v2("FP32", [1, 2], [1.0, 2.0]), 400, "inputs[0].datatype: FP32: this model takes BYTES"),
        (Req({"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES"}]}, KSERVE), 400, "inputs[0].data: missing"),
        (v2("BYTES", [2], ["a", 3]), 400, "inputs[0].data[1]: a string"),
        (v2("BYTES", [1], ["a"], id=7), 400, "id: a string"),
        (v1([{"text": "fine"}, {"txt": "x"}]), 400, 'instances[1]: JSON body has no "text" field'),
        (v1(["fine", "   "]), 400, "instances[1]: text is empty"),
        (v1([{"text": "x" * (1024 * 1024 + 1)}]), 413, "over the limit of 1048576"),
        (v2("BYTES", [2], ["fine", ""]), 400, "instances[1]: text is empty"),
    ],
    "tiny_image": [
        (v1([{"b64": "not base64!"}]), 400, "instances[0].b64: not valid base64"),
        (v1([{"data": 12}]), 400, "instances[0].data: a base64 string"),
        (v1(["aGVsbG8="]), 400, 'instances[0]: this model takes binary input: send {"b64"'),
        (v2("BYTES", [2], ["aGVsbG8=", "%%%"]), 400, "inputs[0].data[1]: not valid base64"),
        (v1([{"b64": b64(b"not an image at all")}]), 400, "instances[0]: cannot read the image"),
        (v2("UINT8", [1, 4], [1, 2, 3, 4]), 400, "inputs[0].datatype: UINT8: this model takes BYTES"),
    ],
    "tiny_tensor": [
        (v2("FP32", [2, 1, 4, 4], [0.0] * 16), 400, "inputs[0].shape: [2, 1, 4, 4] holds 32 values, data has 16"),
        (v2("FP32", [1, 1, 2, 2], [0.0] * 4), 400, "instances[0]: shape: got [1, 2, 2], the model takes [1, 4, 4]"),
        (v2("INT32", [1, 1, 4, 4], [0.5] * 16), 400, "inputs[0].data: fractional values for INT32"),
        (v2("UINT8", [1, 1, 4, 4], [-1] * 16), 400, "inputs[0].data: values outside UINT8's range"),
        (v2("FP32", [1, 1, 4, 4], [[0.0] * 4] * 3 + [[0.0] * 3]), 400, "inputs[0].data: ragged nesting"),
        (v2("FP32", [2, 1, 4, 4], [0.0] * 16 + [17.0] * 16), 400, "instances[1]: values: 17.0 is above max 16"),
        (v1([{"inputs": [[[0.0] * 4] * 4]}, [1, 2]]), 400, "instances[1]: expected a JSON object"),
    ],
}
CASES = [(model, i) for model, cases in BAD.items() for i in range(len(cases))]


@pytest.mark.parametrize("model, index", CASES, ids=[f"{m}-{i}" for m, i in CASES])
def test_bad_request_answered_alone(handlers_, photos, model, index):
    handler, context = handlers_[model]
    forms = forms_of(model, photos)
    bad, status, words = BAD[model][index]
    answers = run(handler, context, [forms.plain(forms.inputs[0]), bad,
                                     v1([forms.instance(i, x) for i, x in enumerate(forms.inputs[1:3])]),
                                     forms.tensor(forms.inputs[3:4])])
    refused = answers[1]
    assert refused.status == status and refused.json["code"] == status, refused.raw
    assert words in refused.json["message"], refused.json
    assert refused.json["error"] == refused.json["message"]  # where KServe clients read it
    assert [a.status for a in answers] == [200, status, 200, 200], [a.raw[:200] for a in answers]
    assert len(answers[2].json["predictions"]) == 2 and len(answers[3].json["outputs"]) == 1


def test_faults_of_ours_stay_500_alone(handlers_, monkeypatch):
    """A decoding crash on one instance, and a crash wrapping one answer: that request's 500 each."""
    handler, context = handlers_["tiny_text"]
    decode = handler.family.decode

    def crashing(body, content_type):
        if body == "boom":
            raise RuntimeError("a bug of ours")
        return decode(body, content_type)

    monkeypatch.setattr(handler.family, "decode", crashing)
    ok, crashed, also_ok = run(handler, context, [Req({"text": "fine"}, PREDICTIONS), v1(["fine", "boom"]), v1(["fine"])])
    assert (ok.status, crashed.status, also_ok.status) == (200, 500, 200)
    assert crashed.json["message"].startswith("instances[1]: unexpected error decoding")

    wrap = kserve.wrap
    monkeypatch.setattr(kserve, "wrap", lambda envelope, *a: 1 / 0 if envelope.protocol == "v2" else wrap(envelope, *a))
    ok, v1_ok, broken = run(handler, context, [Req({"text": "fine"}, PREDICTIONS), v1(["fine"]), TEXT_OK])
    assert (ok.status, v1_ok.status, broken.status) == (200, 200, 500)
    assert "wrapping the answer" in broken.json["message"]


def test_wrap_chooses_fp32_only_for_equal_length_vectors():
    v2_envelope = Envelope("v2", (), "id-1")
    same = kserve.wrap(v2_envelope, [{"embedding": [1.0, 2.0]}, {"embedding": [3.0, 4.0]}], "m")
    assert same["outputs"][0] == {"name": "output-0", "shape": [2, 2], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}
    assert kserve.wrap(v2_envelope, [[1, 2, 3]], "m")["outputs"][0]["shape"] == [1, 3]
    for answers in ([{"embedding": [1.0]}, {"embedding": [1.0, 2.0]}], [{"a": 0.5, "b": 0.5}], [{"x": [True]}],
                    [{"class": "7"}], [[]]):
        output = kserve.wrap(v2_envelope, answers, "m")["outputs"][0]
        assert output["datatype"] == "BYTES" and output["shape"] == [len(answers)], answers
        assert [json.loads(s) for s in output["data"]] == answers
    assert kserve.wrap(Envelope("v1", ()), [{"a": 1}], "m") == {"predictions": [{"a": 1}]}
