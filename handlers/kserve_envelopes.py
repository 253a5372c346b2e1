"""KServe v1 and Open Inference Protocol v2 request envelopes as pydantic models: what a request's
JSON object must hold before its instances are read (handlers/kserve.py). Both protocols let a
request carry fields of its own (`parameters`, extensions), so unknown fields are left alone
(extra="allow"); the types are strict (`true` is no integer).

A fault is refused as KServe's clients read it: a 400 naming the field, what it must be and what
came (`inputs[0].shape: a non-empty list of non-negative integers, got [-1]`), worded here from
pydantic's report (handlers/schemas.py); with several, the first in the envelope's order (a missing
field of a tensor before any other).
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from handlers import schemas
from handlers.errors import BadInput

OPEN = ConfigDict(extra="allow", strict=True, frozen=True)
INPUT = "inputs[0]"  # the one input tensor a request holds


class V1Request(BaseModel):
    """KServe v1: {"instances": [...]}."""

    model_config = OPEN

    instances: Annotated[list[Any], Field(min_length=1)]


class V2Request(BaseModel):
    """Open Inference Protocol v2: {"id"?, "parameters"?, "inputs": [...], "outputs"?}."""

    model_config = OPEN

    id: Optional[str] = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    inputs: Annotated[list[Any], Field(min_length=1)]
    outputs: Any = None


class V2Input(BaseModel):
    """One input tensor's description; its data (JSON or binary) is read by handlers/kserve.py."""

    model_config = OPEN

    name: str
    shape: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    datatype: Any  # checked against the datatypes the model takes, with their list in the message


def v1_request(payload: dict) -> V1Request:
    return schemas.validated(V1Request, payload, _envelope_refusal)


def v2_request(payload: dict) -> V2Request:
    return schemas.validated(V2Request, payload, _envelope_refusal)


def v2_input(tensor: dict) -> V2Input:
    return schemas.validated(V2Input, tensor, _input_refusal)


def _got(value: Any) -> str:
    return "an empty list" if isinstance(value, list) else type(value).__name__


def _envelope_refusal(errors: list[dict], payload: Any) -> BadInput:
    first = errors[0]  # pydantic reports them in the fields' order
    field, value = first["loc"][0], first["input"]
    if field == "instances":
        return BadInput(f"instances: a non-empty list of instances, got {_got(value)}")
    if field == "inputs":
        return BadInput(f"inputs: a non-empty list of input tensors, got {_got(value)}")
    if field == "id":
        return BadInput(f"id: a string, got {type(value).__name__}")
    return BadInput("parameters: a JSON object")


def _input_refusal(errors: list[dict], tensor: Any) -> BadInput:
    first = min(errors, key=lambda e: e["type"] != "missing")  # stable: the fields' order otherwise
    field = first["loc"][0]
    if first["type"] == "missing":
        return BadInput(f"{INPUT}.{field}: missing")
    if field == "name":
        return BadInput(f"{INPUT}.name: a string, got {type(first['input']).__name__}")
    return BadInput(f"{INPUT}.shape: a non-empty list of non-negative integers, got {tensor['shape']!r}"[:200])
