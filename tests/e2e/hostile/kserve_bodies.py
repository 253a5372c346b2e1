"""KServe v1 and Open Inference Protocol v2 requests a hostile client sends, as hypothesis strategies.

Each draws a `Body` (tests/e2e/hostile/bodies.py) whose `instances` names the examples it carries when it is otherwise valid: a 200
to it must hold their answers (the ones they get alone at /predictions). The binary-tensor extension
(`Inference-Header-Content-Length`, tritonclient's way) is either served, with those answers, or
refused by name; a length header that lies is refused.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Optional

import numpy as np
from hypothesis import strategies as st

from tests.e2e.hostile.bodies import FIELD_NAMES, HOSTILE_VALUES, JSON, JSON_VALUES, Body
from tests.e2e.hostile.contract import ANSWER, EITHER, REFUSE, Expect
from tests.e2e.hostile.mates import Instance, instances

# OIP v2's tensor datatypes (what a valid request may name).
DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BYTES", "BF16")
MAX_INSTANCES = 64  # handlers/kserve.py: more in one request is a 413
BINARY_HEADER = "Inference-Header-Content-Length"
BINARY_WORDS = ("binary", BINARY_HEADER.lower())


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


def _picked(draw, model: str, most: int = 3) -> tuple[list[Instance], tuple[int, ...]]:
    every = instances(model)
    chosen = tuple(draw(st.lists(st.integers(0, len(every) - 1), min_size=1, max_size=most)))
    return [every[i] for i in chosen], chosen


CONTENT_TYPES = st.sampled_from([JSON, JSON, JSON, None, "text/plain", "application/json; charset=utf-8"])


@st.composite
def v1(draw, model: str) -> Body:
    chosen, indices = _picked(draw, model)
    how = draw(st.sampled_from(["valid", "hostile instance", "hostile instance", "not a list", "empty",
                                "too many", "extra field", "both protocols"]))
    ctype = draw(CONTENT_TYPES)
    values = [i.value for i in chosen]
    if how == "valid":
        return Body("v1 of examples", _dumps({"instances": values}), ctype, Expect(ANSWER), indices)
    if how == "hostile instance":
        at, value = draw(st.integers(0, len(values))), draw(HOSTILE_VALUES)
        return Body(f"v1 instance {value!r}"[:100], _dumps({"instances": [*values[:at], value, *values[at:]]}),
                        ctype, Expect(EITHER))
    if how == "not a list":
        value = draw(HOSTILE_VALUES.filter(lambda v: not isinstance(v, list)))
        return Body(f"v1 instances := {value!r}"[:100], _dumps({"instances": value}), ctype,
                        Expect(REFUSE, None, ("instances",)))
    if how == "empty":
        return Body("v1 without instances", _dumps({"instances": []}), ctype, Expect(REFUSE, None, ("instances",)))
    if how == "too many":
        count = draw(st.integers(MAX_INSTANCES + 1, 4 * MAX_INSTANCES))
        return Body(f"v1 of {count} instances", _dumps({"instances": values[:1] * count}), ctype, Expect(REFUSE))
    if how == "extra field":
        name = draw(FIELD_NAMES)
        return Body(f"v1 with {name!r}", _dumps({"instances": values, name: draw(JSON_VALUES)}), ctype,
                        Expect(EITHER))
    return Body("v1 and v2 at once", _dumps({"instances": values, "inputs": values}), ctype, Expect(REFUSE))


def _tensor(chosen: list[Instance]) -> dict:
    return {"name": "input-0", "shape": [len(chosen)], "datatype": "BYTES", "data": [i.v2_string for i in chosen]}


def _bad_shape(shape: Any) -> bool:
    return (not isinstance(shape, list) or not shape
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in shape))


@st.composite
def v2(draw, model: str) -> Body:
    chosen, indices = _picked(draw, model)
    tensor, ctype = _tensor(chosen), draw(CONTENT_TYPES)
    how = draw(st.sampled_from(["valid", "datatype", "datatype", "shape", "data", "name", "id", "parameters",
                                "outputs", "inputs", "extra field"]))
    if how == "valid":
        request_id = draw(st.none() | st.text(max_size=16))
        payload = {"inputs": [tensor]} if request_id is None else {"id": request_id, "inputs": [tensor]}
        return Body("v2 of examples", _dumps(payload), ctype, Expect(ANSWER), indices)
    if how == "datatype":
        datatype = draw(st.sampled_from(DATATYPES) | st.text(max_size=10) | HOSTILE_VALUES)
        outcome = EITHER if datatype in DATATYPES else REFUSE
        words = ("datatype",) if outcome == REFUSE else ()
        return Body(f"v2 datatype {datatype!r}"[:100], _dumps({"inputs": [{**tensor, "datatype": datatype}]}),
                        ctype, Expect(outcome, None, words))
    if how == "shape":
        shape = draw(st.lists(st.integers(-2, 2**40) | HOSTILE_VALUES, max_size=6) | HOSTILE_VALUES)
        outcome = REFUSE if _bad_shape(shape) else EITHER
        return Body(f"v2 shape {shape!r}"[:100], _dumps({"inputs": [{**tensor, "shape": shape}]}), ctype,
                        Expect(outcome))
    if how in ("data", "name"):
        value = draw(HOSTILE_VALUES)
        outcome = REFUSE if how == "name" and not isinstance(value, str) else EITHER
        return Body(f"v2 {how} {value!r}"[:100], _dumps({"inputs": [{**tensor, how: value}]}), ctype,
                        Expect(outcome))
    if how == "id":
        value = draw(HOSTILE_VALUES)
        outcome = EITHER if value is None or isinstance(value, str) else REFUSE
        return Body(f"v2 id {value!r}"[:100], _dumps({"id": value, "inputs": [tensor]}), ctype, Expect(outcome))
    if how == "parameters":
        value = draw(HOSTILE_VALUES)
        outcome = EITHER if isinstance(value, dict) else REFUSE
        return Body(f"v2 parameters {value!r}"[:100], _dumps({"parameters": value, "inputs": [tensor]}), ctype,
                        Expect(outcome))
    if how == "outputs":
        value = draw(st.lists(st.fixed_dictionaries({"name": st.sampled_from(["output-0", "other"])},
                                                    optional={"parameters": st.dictionaries(
                                                        st.sampled_from(["binary_data", "classification"]),
                                                        HOSTILE_VALUES, max_size=2)}), max_size=2) | HOSTILE_VALUES)
        return Body(f"v2 outputs {value!r}"[:100], _dumps({"inputs": [tensor], "outputs": value}), ctype,
                        Expect(EITHER))
    if how == "inputs":
        value = draw(st.sampled_from([[], [tensor, tensor]]) | HOSTILE_VALUES.filter(lambda v: not isinstance(v, list)))
        return Body(f"v2 inputs {value!r}"[:100], _dumps({"inputs": value}), ctype, Expect(REFUSE, None, ("inputs",)))
    name = draw(FIELD_NAMES)
    return Body(f"v2 with {name!r}", _dumps({"inputs": [{**tensor, name: draw(JSON_VALUES)}]}), ctype,
                    Expect(EITHER))


def _bytes_element(raw: bytes) -> bytes:
    return struct.pack("<I", len(raw)) + raw


@st.composite
def v2_binary(draw, model: str, tensor_shape: Optional[tuple] = None) -> Body:
    """The binary-tensor extension: the input's bytes after the JSON header, whose length a header
    gives; outputs asked for in binary or JSON. Served (the examples' answers) or refused by name."""
    chosen, indices = _picked(draw, model)
    if tensor_shape is not None and draw(st.booleans()):  # a tensor model: FP32 values, as tritonclient sends arrays
        arrays = [np.asarray(i.value["inputs"], dtype="<f4") for i in chosen]
        blob = b"".join(a.tobytes() for a in arrays)
        tensor = {"name": "input-0", "shape": [len(chosen), *tensor_shape], "datatype": "FP32"}
    else:
        blob = b"".join(_bytes_element(i.raw) for i in chosen)
        tensor = {"name": "input-0", "shape": [len(chosen)], "datatype": "BYTES"}
    tensor["parameters"] = {"binary_data_size": len(blob)}
    header: dict = {"inputs": [tensor]}
    if draw(st.booleans()):
        header["outputs"] = [{"name": "output-0", "parameters": {"binary_data": draw(st.booleans())}}]
    head = _dumps(header)
    lie = draw(st.sampled_from([None, None, None, "-1", "abc", "0", str(len(head) + 3), str(len(head) + len(blob) + 9),
                                "1e3", ""]))
    value = str(len(head)) if lie is None else lie
    ctype = draw(st.sampled_from(["application/octet-stream", JSON, None]))
    if lie is None:
        return Body("v2 binary extension", head + blob, ctype, Expect(EITHER, None, BINARY_WORDS), indices,
                        ((BINARY_HEADER, value),))
    return Body(f"v2 binary extension, header {value!r}", head + blob, ctype, Expect(REFUSE), (),
                    ((BINARY_HEADER, value),))
