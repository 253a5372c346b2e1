"""Reading a 200's answer on every route, and judging it: well formed for the model's family
(`Family.answer_problem`), and, for a batch-mate, the answer the same request gets alone
(`Family.disagreement`, the family's own tolerance).

A route's parser turns the reply into the family's answers (one per instance): /predictions' JSON
(a stream: its last NDJSON line), KServe v1's `predictions`, Open Inference Protocol v2's output
tensor (JSON or the binary extension), gRPC's bytes. OpenAI answers are summarised to their text,
finish reason and token count; embeddings to the family's {"embedding": [...]} each.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from handlers.families import family_class
from tests.e2e.helpers import settings_of
from tests.e2e.hostile.contract import Judge, Reply

Parse = Callable[[Reply], list]  # a 200's answers, or ValueError saying why they cannot be read
BINARY_HEADER = "inference-header-content-length"


def _strict(text: bytes | str) -> Any:
    """JSON as a strict parser reads it: NaN and Infinity are not JSON."""
    def refuse(token: str) -> Any:
        raise ValueError(f"{token} is not JSON")

    try:
        return json.loads(text, parse_constant=refuse)
    except RecursionError:
        raise ValueError("nested too deep") from None


def rest(reply: Reply) -> list:
    """/predictions and gRPC: one JSON answer; a stream (NDJSON) is judged by its last line."""
    lines = [line for line in reply.body.splitlines() if line.strip()]
    if not lines:
        raise ValueError("an empty answer")
    try:
        return [_strict(reply.body)]
    except ValueError:
        return [_strict(lines[-1])]


def v1(reply: Reply) -> list:
    answer = _strict(reply.body)
    if not isinstance(answer, dict) or not isinstance(answer.get("predictions"), list):
        raise ValueError(f'KServe v1: expected {{"predictions": [...]}}, got {str(answer)[:120]}')
    return answer["predictions"]


def _binary_outputs(reply: Reply) -> dict:
    """The binary extension: a JSON header of the given length, then each output's bytes in order."""
    size = int(reply.headers[BINARY_HEADER])
    header, tail = _strict(reply.body[:size]), reply.body[size:]
    at = 0
    for output in header.get("outputs", []):
        length = (output.get("parameters") or {}).get("binary_data_size")
        if length is None:
            continue
        raw, at = tail[at:at + length], at + length
        if output["datatype"] == "BYTES":
            items, i = [], 0
            while i < len(raw):
                (n,) = struct.unpack_from("<I", raw, i)
                items.append(raw[i + 4:i + 4 + n].decode("utf-8"))
                i += 4 + n
            output["data"] = items
        else:
            output["data"] = np.frombuffer(raw, dtype="<f4" if output["datatype"] == "FP32" else "<f8").tolist()
    return header


def v2(template: Any) -> Parse:
    """Open Inference Protocol v2: the output tensor back into /predictions answers, shaped like
    `template` (an answer of the model's: a vector answer {"key": [...]} travels as FP32 rows)."""

    def parse(reply: Reply) -> list:
        answer = _binary_outputs(reply) if BINARY_HEADER in reply.headers else _strict(reply.body)
        outputs = answer.get("outputs") if isinstance(answer, dict) else None
        if not isinstance(outputs, list) or len(outputs) != 1 or not isinstance(outputs[0], dict):
            raise ValueError(f"v2: expected one output tensor, got {str(answer)[:160]}")
        output = outputs[0]
        shape, data = output.get("shape"), output.get("data")
        if not isinstance(shape, list) or not isinstance(data, list) or math.prod(shape) != len(data):
            raise ValueError(f"v2: shape {shape} and {len(data) if isinstance(data, list) else data!r} values")
        if output.get("datatype") == "BYTES":
            return [_strict(item) for item in data]
        rows = np.asarray(data, dtype=np.float64).reshape(shape[0], -1).tolist()
        if isinstance(template, dict) and len(template) == 1:
            key = next(iter(template))
            return [{key: row} for row in rows]
        return rows

    return parse


def openai_text(max_tokens: Optional[int] = None) -> Parse:
    """Completions and chat, whole or Server-Sent Events: [{"text", "finish_reason", "tokens"}]."""

    def parse(reply: Reply) -> list:
        if reply.body.lstrip().startswith(b"data:"):
            summary = _events(reply.body)
        else:
            answer = _strict(reply.body)
            choice = (answer.get("choices") or [None])[0] if isinstance(answer, dict) else None
            if not isinstance(choice, dict):
                raise ValueError(f"expected choices, got {str(answer)[:160]}")
            text = choice.get("text", (choice.get("message") or {}).get("content"))
            summary = {"text": text, "finish_reason": choice.get("finish_reason"),
                       "tokens": (answer.get("usage") or {}).get("completion_tokens")}
        if not isinstance(summary["text"], str) or summary["finish_reason"] not in ("stop", "length"):
            raise ValueError(f"expected a text and a finish reason, got {summary}")
        if max_tokens is not None and summary["tokens"] is not None and summary["tokens"] > max_tokens:
            raise ValueError(f"{summary['tokens']} tokens for max_tokens {max_tokens}")
        return [summary]

    return parse


def _events(body: bytes) -> dict:
    lines = [line for line in body.decode("utf-8").split("\n") if line.strip()]
    if not lines or lines[-1].strip() != "data: [DONE]":
        raise ValueError(f"a stream that does not end with data: [DONE]: {body[-120:]!r}")
    text, finish, tokens = "", None, None
    for line in lines[:-1]:
        if not line.startswith("data: "):
            raise ValueError(f"not an event line: {line[:120]!r}")
        event = _strict(line[len("data: "):])
        for choice in event.get("choices") or []:
            text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            finish = choice.get("finish_reason") or finish
        tokens = (event.get("usage") or {}).get("completion_tokens", tokens)
    return {"text": text, "finish_reason": finish, "tokens": tokens}


def openai_embeddings(dimensions: int) -> Parse:
    def parse(reply: Reply) -> list:
        answer = _strict(reply.body)
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list) or not data or [d.get("index") for d in data] != list(range(len(data))):
            raise ValueError(f"expected data with indices 0..n-1, got {str(answer)[:160]}")
        out = []
        for item in data:
            vector = item.get("embedding")
            if isinstance(vector, str):
                vector = np.frombuffer(base64.b64decode(vector), dtype="<f4").tolist()
            if not isinstance(vector, list) or len(vector) != dimensions:
                raise ValueError(f"an embedding of {len(vector) if isinstance(vector, list) else vector!r} values")
            out.append({"embedding": vector})
        return out

    return parse


def _family_problem(model: str, answer: Any) -> Optional[str]:
    settings = settings_of(model)
    try:
        return family_class(settings.family).answer_problem(settings.family_settings, answer)
    except (TypeError, KeyError, AttributeError, ValueError, IndexError) as err:  # None where a number goes, say
        return f"malformed ({type(err).__name__}: {err}): {str(answer)[:160]}"


def well_formed(model: Optional[str], parse: Parse, count: Optional[int] = None) -> Judge:
    """Readable by the route's parser, `count` answers when known, each well formed for `model`'s
    family (None: the parser's checks only)."""

    def judge(reply: Reply) -> Optional[str]:
        try:
            answers = parse(reply)
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, struct.error) as err:
            return f"unreadable: {err}"[:300]
        if count is not None and len(answers) != count:
            return f"{len(answers)} answers for {count} instances"
        if model is not None:
            return next(filter(None, (_family_problem(model, a) for a in answers)), None)
        return None

    return judge


def same_as(model: Optional[str], parse: Parse, references: Sequence[Any]) -> Judge:
    """Well formed, and each answer within the family's tolerance of its reference (model None:
    equal as they are, the OpenAI summaries)."""
    shape = well_formed(model, parse, len(references))

    def judge(reply: Reply) -> Optional[str]:
        wrong = shape(reply)
        if wrong:
            return wrong
        for got, want in zip(parse(reply), references):
            if model is None:
                differs = None if got["text"] == want["text"] and got["finish_reason"] == want["finish_reason"] \
                    else f"{got} vs alone {want}"
            else:
                settings = settings_of(model)
                differs = family_class(settings.family).disagreement(settings.family_settings, got, want)
            if differs:
                return f"not the answer it gets alone: {differs}"
        return None

    return judge
