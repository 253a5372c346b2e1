"""The Open Inference Protocol's binary tensor data extension, as NVIDIA's tritonclient speaks it.

A request body is a JSON header whose byte length is the `Inference-Header-Content-Length` request
header, followed by the raw bytes of each input that says `parameters.binary_data_size`, in the
order of `inputs`. Raw bytes are little-endian and row-major: a numeric tensor is its values in
their datatype's size (BOOL one byte, 0 or 1), a BYTES tensor is each element as a 4-byte unsigned
length followed by that many bytes. An answer is sent the same way when the request asks for it
(`parameters.binary_data` on a requested output, or `binary_data_output` on the request): its JSON
header, then each binary output's bytes, with the header's length in the response header of the
same name and the content type `application/octet-stream`.

Every size is checked against the body, the shape and the datatype before anything is allocated;
each inconsistency is a 400 naming the field. Parts of the protocol this server does not offer
(shared memory, classification, sequences, priorities, timeouts, BF16) are refused by name.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any, Optional

import numpy as np

from handlers.errors import BadInput

HEADER = "Inference-Header-Content-Length"
BINARY = "application/octet-stream"
_LENGTH = struct.Struct("<I")

# Parameters of other Open Inference Protocol / Triton extensions, refused by name (a request that
# relies on one must not get an answer computed without it).
_REFUSED_REQUEST = {
    "sequence_id": "sequences (the sequence extension) are not supported",
    "sequence_start": "sequences (the sequence extension) are not supported",
    "sequence_end": "sequences (the sequence extension) are not supported",
    "priority": "request priorities are not supported",
    "timeout": "per-request timeouts are not supported (the server's own deadlines apply)",
}
_REFUSED_TENSOR = {
    "shared_memory_region": "the shared-memory extension is not supported",
    "shared_memory_byte_size": "the shared-memory extension is not supported",
    "shared_memory_offset": "the shared-memory extension is not supported",
    "class_count": "the classification extension is not supported",
}


def split(body: Any, declared: str) -> tuple[dict, memoryview]:
    """The JSON header and the bytes after it, from a body whose first `declared` bytes are the header."""
    if isinstance(body, str):  # TorchServe decoded a text/* body: its UTF-8 bytes are the ones sent
        body = body.encode("utf-8")
    if isinstance(body, dict):  # TorchServe parsed an application/json body whole: no bytes follow
        return body, memoryview(b"")
    if not isinstance(body, (bytes, bytearray)):
        raise BadInput(f"{HEADER}: the body is {type(body).__name__}, not a JSON header followed by tensor bytes")
    text = declared.strip()
    if not text.isdigit() or not text.isascii():
        raise BadInput(f"{HEADER}: {declared[:40]!r} is not a byte count")
    length = int(text)
    if not 0 < length <= len(body):
        raise BadInput(f"{HEADER}: {length} bytes of JSON header, the body has {len(body)}")
    view = memoryview(body)
    try:
        header = json.loads(bytes(view[:length]).decode("utf-8"))
    except (ValueError, RecursionError) as err:  # not UTF-8, not JSON, or nested past Python's limit
        raise BadInput(f"{HEADER}: the first {length} bytes are not a JSON object ({err})"[:300]) from None
    if not isinstance(header, dict):
        raise BadInput(f"{HEADER}: the first {length} bytes are JSON but not an object")
    return header, view[length:]


def check_request_parameters(parameters: dict) -> bool:
    """Whether the request asks for binary outputs (`binary_data_output`); refuses what is not offered."""
    for key, why in _REFUSED_REQUEST.items():
        if key in parameters:
            raise BadInput(f"parameters.{key}: {why}")
    return _flag(parameters, "binary_data_output", "parameters.binary_data_output")


def check_tensor_parameters(parameters: Any, where: str) -> dict:
    """A tensor's `parameters` object, refusing the extensions this server does not offer."""
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise BadInput(f"{where}.parameters: a JSON object, got {type(parameters).__name__}")
    for key, why in _REFUSED_TENSOR.items():
        if key in parameters:
            raise BadInput(f"{where}.parameters.{key}: {why}")
    return parameters


def binary_size(parameters: dict, where: str) -> Optional[int]:
    """The tensor's `binary_data_size`, or None when its data is in the JSON."""
    size = parameters.get("binary_data_size")
    if size is None:
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise BadInput(f"{where}.parameters.binary_data_size: a non-negative integer, got {size!r}"[:200])
    return size


def wants_binary(output: Any, where: str, default: bool) -> bool:
    """Whether one requested output is to be sent as binary data."""
    parameters = check_tensor_parameters(output.get("parameters"), where)
    return _flag(parameters, "binary_data", f"{where}.parameters.binary_data", default)


def _flag(parameters: dict, key: str, where: str, default: bool = False) -> bool:
    value = parameters.get(key, default)
    if not isinstance(value, bool):
        raise BadInput(f"{where}: true or false, got {value!r}"[:200])
    return value


def numbers(raw: memoryview, shape: list[int], dtype: np.dtype, datatype: str, where: str) -> np.ndarray:
    """A numeric tensor's raw bytes as an array of `shape` (a view on the body: nothing is copied)."""
    expected = math.prod(shape) * dtype.itemsize
    if len(raw) != expected:
        raise BadInput(f"{where}.parameters.binary_data_size: {len(raw)} bytes, shape {shape} of {datatype} "
                       f"takes {expected}"[:300])
    array = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(shape)
    if dtype.kind == "b" and array.size and np.frombuffer(raw, dtype=np.uint8).max() > 1:
        raise BadInput(f"{where}: BOOL takes bytes 0 and 1 only")
    return array


def strings(raw: memoryview, count: int, where: str) -> list[bytes]:
    """A BYTES tensor's elements: each a 4-byte little-endian length and that many bytes."""
    out, at = [], 0
    while at < len(raw):
        if len(out) == count:
            raise BadInput(f"{where}.parameters.binary_data_size: {len(raw) - at} bytes left after the "
                           f"{count} elements the shape declares")
        if at + _LENGTH.size > len(raw):
            raise BadInput(f"{where}: element {len(out)}: {len(raw) - at} bytes left, a 4-byte length expected")
        (length,) = _LENGTH.unpack_from(raw, at)
        at += _LENGTH.size
        if length > len(raw) - at:
            raise BadInput(f"{where}: element {len(out)} declares {length} bytes, {len(raw) - at} are left")
        out.append(bytes(raw[at:at + length]))
        at += length
    if len(out) != count:
        raise BadInput(f"{where}: the shape declares {count} elements, the binary data holds {len(out)}")
    return out


def serialized_strings(items: list[bytes]) -> bytes:
    """A BYTES tensor as binary data."""
    return b"".join(_LENGTH.pack(len(item)) + item for item in items)


def response(header: bytes, tensors: list[bytes]) -> tuple[bytes, dict[str, str]]:
    """The body of an answer with binary outputs, and the response header that gives its JSON's length."""
    return header + b"".join(tensors), {HEADER: str(len(header))}
