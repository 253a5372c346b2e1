"""KServe v1 and Open Inference Protocol (KServe v2) requests, each answered in its own protocol.

TorchServe 0.12 routes `POST /v1/models/<m>:predict` and `POST /v2/models/<m>/infer` to the worker
like `/predictions/<m>`, adding the request header `explain: False` (InferenceRequestHandler.
handleKFV1Predictions / handleKFV2Predictions). Its own `kservev2` envelope reads only the first
request of a batch (pytorch/serve #2158), so we do not use TorchServe's envelopes: the request loop
asks about every request of a batch, and a KServe request becomes the per-instance bodies
its family already decodes (one item each in the batch's single forward pass); `wrap` puts the
family's answers back into the request's protocol. Nothing here names a family: what a family takes
is its declared `input_kind` (handlers/families/base.py).

A request is KServe when it came through a KServe route AND its body is a JSON object with
`instances` (v1) or `inputs` (v2); a JSON object without them is a /predictions request, answered
exactly as before, and a body that is no JSON object at all is refused there (never read as some
family's text or bytes). An `Inference-Header-Content-Length` header marks the Open Inference
Protocol's binary tensor extension (handlers/binary_tensors.py): the JSON header is read from the
body's first bytes, binary tensors from the rest, and binary outputs are sent when asked for.

The route is decided at the door (handlers/request.py); handlers/protocols/kserve.py reads the
body and headers of a request on a KServe route and hands its JSON object here. The envelopes' fields
are checked against their models (handlers/kserve_envelopes.py); the instances are read here.
"""

from __future__ import annotations

import base64
import binascii
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Optional

import numpy as np

from handlers import binary_tensors
from handlers.encoding import JSON, json_bytes
from handlers.errors import BadInput, HandlerError
from handlers.kserve_envelopes import v1_request, v2_input, v2_request
from handlers.limits import check_instances

TEXT = "text/plain"
BINARY = "application/octet-stream"
# OIP v2 tensor datatypes a JSON request can carry as numbers (BF16 has no JSON form).
NUMERIC = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}
DATATYPES = ("BYTES", *NUMERIC)
OUTPUT = "output-0"  # the one output tensor of every answer


@dataclass(frozen=True)
class Envelope:
    """One KServe request, unwrapped: what its instances are and how to answer it."""

    protocol: str  # "v1" or "v2" (or "openai": handlers/openai/envelope.py)
    bodies: tuple[tuple[Any, str], ...]  # per instance: (body, content type), as a family's decode takes them
    request_id: Optional[str] = None  # v2's "id", echoed in the answer
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))  # what its answer needs too


def unwrap_payload(payload: dict, input_kind: str, tail: Optional[memoryview] = None) -> Optional[Envelope]:
    """The request's instances from its JSON object (`tail`: the bytes after a binary-tensor request's
    JSON header), or None for an object with neither "instances" nor "inputs" (a /predictions body).
    Raises BadInput naming the field when the envelope itself is malformed."""
    if "instances" in payload and "inputs" in payload:
        raise BadInput('send either "instances" (KServe v1) or "inputs" (Open Inference Protocol v2), not both')
    if "instances" in payload:
        return _v1(v1_request(payload).instances, input_kind)
    if "inputs" in payload:
        return _v2(payload, input_kind, tail)
    return None


# ---- KServe v1 ------------------------------------------------------------------------------
def _v1(instances: list, input_kind: str) -> Envelope:
    check_instances(len(instances), "instances")
    return Envelope("v1", tuple(_v1_instance(inst, f"instances[{i}]", input_kind) for i, inst in enumerate(instances)))


def _v1_instance(instance: Any, where: str, input_kind: str) -> tuple[Any, str]:
    if input_kind == "bytes":
        # The KServe / TF-serving convention for binary data is {"b64": ...}; TorchServe's kserve
        # examples send {"data": ...}.
        if isinstance(instance, dict) and len(instance) == 1 and set(instance) <= {"b64", "data"}:
            key = next(iter(instance))
            return _b64(instance[key], f"{where}.{key}"), BINARY
        raise BadInput(f'{where}: this model takes binary input: send {{"b64": "<base64>"}}')
    if isinstance(instance, str):
        return instance, TEXT
    return instance, JSON  # what /predictions would have been given for an application/json body


def _b64(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise BadInput(f"{where}: a base64 string, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as err:
        raise BadInput(f"{where}: not valid base64 ({err})"[:200]) from None


# ---- Open Inference Protocol v2 ---------------------------------------------------------------
def _v2(payload: dict, input_kind: str, tail: Optional[memoryview] = None) -> Envelope:
    """`tail`: the bytes after the JSON header of a binary-tensor request (None: a JSON body)."""
    request = v2_request(payload)
    binary_default = binary_tensors.check_request_parameters(request.parameters)
    tensor = _one_object(request.inputs, "inputs", "input tensor", "name, shape, datatype and data")
    shape = v2_input(tensor).shape
    if shape[0] < 1:
        raise BadInput(f"inputs[0].shape: {shape}: the first dimension counts the instances, at least 1")
    check_instances(shape[0], "inputs[0].shape[0]")
    datatype = tensor["datatype"]
    if datatype not in DATATYPES:
        raise BadInput(f"inputs[0].datatype: {datatype!r} is not one of {list(DATATYPES)}"[:300])
    raw = _binary_data(tensor, tail)
    if raw is not None:
        bodies = _v2_binary(raw, shape, datatype, input_kind)
    elif "data" not in tensor:
        raise BadInput("inputs[0].data: missing")
    elif not isinstance(tensor["data"], list):
        raise BadInput(f"inputs[0].data: a list, got {type(tensor['data']).__name__}")
    elif datatype == "BYTES":
        bodies = _v2_bytes(tensor["data"], shape, input_kind)
    else:
        bodies = _v2_numbers(tensor["data"], shape, datatype, input_kind)
    binary_output = _binary_output(request.outputs, binary_default)
    return Envelope("v2", bodies, request.id, MappingProxyType({"binary_output": binary_output}))


def _binary_data(tensor: dict, tail: Optional[memoryview]) -> Optional[memoryview]:
    """The input's raw bytes when it is sent as binary data (its JSON has no "data")."""
    size = binary_tensors.binary_size(binary_tensors.check_tensor_parameters(tensor.get("parameters"), "inputs[0]"),
                                      "inputs[0]")
    if size is None:
        if tail is not None and len(tail):
            raise BadInput(f"{binary_tensors.HEADER}: {len(tail)} bytes follow the JSON header, but no input "
                           "declares parameters.binary_data_size")
        return None
    if tail is None:
        raise BadInput(f"inputs[0].parameters.binary_data_size: binary data needs the {binary_tensors.HEADER} "
                       "request header (the length of the JSON header that precedes it)")
    if "data" in tensor:
        raise BadInput('inputs[0]: both "data" and parameters.binary_data_size: send the values one way')
    if size != len(tail):
        raise BadInput(f"inputs[0].parameters.binary_data_size: {size}, but {len(tail)} bytes follow the JSON header")
    return tail


def _binary_output(outputs: Any, default: bool) -> bool:
    """Whether the answer goes out as binary data. Its one output is "output-0"; a request may name it."""
    if outputs is None or outputs == []:
        return default
    if not isinstance(outputs, list):
        raise BadInput(f"outputs: a list of requested outputs, got {type(outputs).__name__}")
    output = _one_object(outputs, "outputs", f'requested output ("{OUTPUT}")', "a name")
    if output.get("name") != OUTPUT:
        raise BadInput(f'outputs[0].name: {output.get("name")!r}: this model\'s only output is "{OUTPUT}"'[:200])
    return binary_tensors.wants_binary(output, "outputs[0]", default)


def _one_object(items: list, field: str, what: str, holding: str) -> dict:
    """The list's one element, an object."""
    if len(items) != 1:
        raise BadInput(f"{field}: exactly one {what}, got {len(items)}")
    if not isinstance(items[0], dict):
        raise BadInput(f"{field}[0]: an object with {holding}, got {type(items[0]).__name__}")
    return items[0]


def _v2_binary(raw: memoryview, shape: list[int], datatype: str, input_kind: str) -> tuple[tuple[Any, str], ...]:
    """Binary data: BYTES as one element per instance, numbers as n instances of shape[1:]."""
    if datatype != "BYTES":
        if input_kind != "tensor":
            raise BadInput(f"inputs[0].datatype: {datatype}: this model takes BYTES (one string per instance)")
        array = binary_tensors.numbers(raw, shape, np.dtype(NUMERIC[datatype]), datatype, "inputs[0]")
        return _instances(array.reshape(shape[0], -1), shape)
    if math.prod(shape) != shape[0]:
        raise BadInput(f"inputs[0].shape: {shape}: BYTES takes one string per instance, shape [n]")
    bodies = []
    for i, value in enumerate(binary_tensors.strings(raw, shape[0], "inputs[0]")):
        if input_kind == "bytes":
            bodies.append((value, BINARY))
        elif input_kind == "text":
            try:
                bodies.append((value.decode("utf-8"), TEXT))
            except UnicodeDecodeError:
                raise BadInput(f"inputs[0]: element {i} is not UTF-8 text") from None
        else:  # a family that reads JSON: each element is one instance's JSON body
            bodies.append((value, JSON))
    return tuple(bodies)


def _flat(data: list, depth: int = 0) -> list[Any]:
    if depth > 32:
        raise BadInput("inputs[0].data: nested deeper than 32 levels")
    out: list[Any] = []
    for value in data:
        out.extend(_flat(value, depth + 1) if isinstance(value, list) else (value,))
    return out


def _v2_bytes(data: list, shape: list[int], input_kind: str) -> tuple[tuple[Any, str], ...]:
    """BYTES: one string per instance (shape [n], or [n, 1, ...])."""
    strings = _flat(data)
    if math.prod(shape) != shape[0]:
        raise BadInput(f"inputs[0].shape: {shape}: BYTES takes one string per instance, shape [n]")
    if len(strings) != shape[0]:
        raise BadInput(f"inputs[0].shape: {shape} declares {shape[0]} strings, data holds {len(strings)}")
    bodies = []
    for i, value in enumerate(strings):
        if not isinstance(value, str):
            raise BadInput(f"inputs[0].data[{i}]: a string, got {type(value).__name__}")
        if input_kind == "bytes":
            bodies.append((_b64(value, f"inputs[0].data[{i}]"), BINARY))
        elif input_kind == "text":
            bodies.append((value, TEXT))
        else:  # a family that reads JSON: each string is one instance's JSON body
            bodies.append((value.encode("utf-8", "surrogatepass"), JSON))
    return tuple(bodies)


def _v2_numbers(data: list, shape: list[int], datatype: str, input_kind: str) -> tuple[tuple[Any, str], ...]:
    """Numbers: n instances of shape[1:], flat or nested, handed on in the tensor JSON form
    {"data": [flat], "shape": [...]} that a family of input_kind "tensor" reads (base.py)."""
    if input_kind != "tensor":
        raise BadInput(f"inputs[0].datatype: {datatype}: this model takes BYTES (one string per instance)")
    try:
        array = np.array(data)
    except ValueError:  # rows of different lengths or depths
        raise BadInput("inputs[0].data: ragged nesting (rows of different lengths or depths)") from None
    if array.dtype == object or not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise BadInput(f"inputs[0].data: holds something that is not a number ({datatype})")
    if array.size != math.prod(shape):
        raise BadInput(f"inputs[0].shape: {shape} holds {math.prod(shape)} values, data has {array.size}")
    return _instances(_as_datatype(array.reshape(shape[0], -1), datatype), shape)


def _instances(rows: np.ndarray, shape: list[int]) -> tuple[tuple[Any, str], ...]:
    """n rows, each one instance in the tensor JSON form {"data": [flat], "shape": shape[1:]}."""
    item_shape = list(shape[1:])
    return tuple(({"data": row, "shape": item_shape}, JSON) for row in rows.tolist())


def _as_datatype(array: np.ndarray, datatype: str) -> np.ndarray:
    """The values as the declared datatype, refusing what the datatype cannot hold."""
    wanted = np.dtype(NUMERIC[datatype])
    if wanted.kind == "f":
        if array.dtype == np.bool_:
            raise BadInput(f"inputs[0].data: true/false values for {datatype}")
        return array.astype(wanted)
    if wanted.kind == "b":
        if array.dtype != np.bool_ and not np.isin(array, (0, 1)).all():
            raise BadInput("inputs[0].data: BOOL takes true/false or 0/1 only")
        return array.astype(wanted)
    if array.dtype.kind == "f" and not (np.isfinite(array).all() and np.array_equal(array, np.round(array))):
        raise BadInput(f"inputs[0].data: fractional values for {datatype}")
    info = np.iinfo(wanted)
    if array.size and (array.min() < info.min or array.max() > info.max):
        raise BadInput(f"inputs[0].data: values outside {datatype}'s range [{info.min}, {info.max}]")
    return array.astype(wanted)


# ---- answers ----------------------------------------------------------------------------------
def instance_error(err: HandlerError, index: int) -> HandlerError:
    """The family's rejection of one instance, for the whole request: same status, the instance named."""
    return type(err)(f"instances[{index}]: {err.message}")


def wrap(envelope: Envelope, answers: list[Any], model_name: str) -> dict:
    """The family's answers (one per instance, each what /predictions returns) in the request's protocol."""
    if envelope.protocol == "v1":
        return {"predictions": answers}
    vectors = [_vector(answer) for answer in answers]
    if all(v is not None for v in vectors) and len({len(v) for v in vectors}) == 1:
        output = {"name": OUTPUT, "shape": [len(vectors), len(vectors[0])], "datatype": "FP32",
                  "data": [x for v in vectors for x in v]}
    else:
        output = {"name": OUTPUT, "shape": [len(answers)], "datatype": "BYTES",
                  "data": [json_bytes(answer).decode("utf-8") for answer in answers]}
    return {"model_name": model_name, "id": envelope.request_id or str(uuid.uuid4()), "outputs": [output]}


def encoded(envelope: Envelope, answers: list[Any], model_name: str) -> tuple[bytes, str, dict[str, str]]:
    """The answer's body, content type and response headers: JSON, or with binary outputs when asked."""
    answer = wrap(envelope, answers, model_name)
    if not envelope.extra.get("binary_output"):
        return json_bytes(answer), JSON, {}
    tensors = []
    for output in answer["outputs"]:
        data = output.pop("data")
        if output["datatype"] == "FP32":
            tensors.append(np.asarray(data, dtype="<f4").tobytes())
        else:
            tensors.append(binary_tensors.serialized_strings([s.encode("utf-8") for s in data]))
        output["parameters"] = {"binary_data_size": len(tensors[-1])}
    body, headers = binary_tensors.response(json_bytes(answer), tensors)
    return body, binary_tensors.BINARY, headers


def _vector(answer: Any) -> Optional[list]:
    """The numbers of an answer that is one flat vector ([x, ...] or {"embedding": [x, ...]}), else None."""
    if isinstance(answer, dict) and len(answer) == 1:
        answer = next(iter(answer.values()))
    if not isinstance(answer, list) or not answer:
        return None
    if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in answer):
        return answer
    return None
