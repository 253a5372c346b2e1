"""The good requests hostile ones travel with: each model's catalogue examples on every route, with
the answer each gets alone (sent once, remembered) as the reference its batch-mate copy must match.

A KServe instance is an example in the form its family reads without a content type
(serving/grpc_forms.py): text, base64 bytes, or the JSON body's object.
"""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from serving.grpc_forms import grpc_body
from tests.e2e.helpers import examples_of, settings_of
from tests.e2e.hostile import answers
from tests.e2e.hostile.contract import ANSWER, GRPC, Expect, Mate, Reply, Request, Sender, problems

JSON = "application/json"
PROMPTS = ("The for statement is used to", "A class definition", "Names refer to objects.")
LM_TOKENS = 8  # a good generation: short, so that a group stays quick


class Alone:
    """The reply each good request gets when it is sent alone: once, then remembered."""

    def __init__(self, sender: Sender) -> None:
        self.sender = sender
        self._replies: dict[Request, Reply] = {}

    def reply(self, request: Request) -> Reply:
        if request not in self._replies:
            reply = self.sender.send(request)
            wrong = problems(reply, Expect(ANSWER), lambda _: None)
            assert not wrong, f"a good request alone, the reference: {request!r}: {wrong}"
            self._replies[request] = reply
        return self._replies[request]

    def answers(self, request: Request, parse: answers.Parse) -> list:
        return parse(self.reply(request))


def canary(model: str, served: str | None = None) -> Request:
    """A good request to see whether the model answers at all (no reference: it may not)."""
    if family_of(model) == "causal_lm":
        return Request(f"/predictions/{served or model}", lm_body(PROMPTS[0], 1), JSON)
    body, ctype = examples(model, 1)[0]
    return Request(f"/predictions/{served or model}", body, ctype)


def family_of(model: str) -> str:
    return settings_of(model).family


def examples(model: str, count: int) -> list[tuple[bytes, str]]:
    found = [(r.body, r.content_type) for _, r in examples_of(model)]
    return list(itertools.islice(itertools.cycle(found), count))


def rest_mate(alone: Alone, model: str, path: str, body: bytes, content_type: str | None,
              reference_path: str | None = None, headers: tuple = ()) -> Mate:
    """A /predictions request judged against its answer alone (on `reference_path`, default `path`)."""
    request = Request(path, body, content_type, headers)
    reference = alone.answers(Request(reference_path or path, body, content_type), answers.rest)
    return Mate(request, answers.same_as(model, answers.rest, reference))


def rest_mates(alone: Alone, model: str, served: str | None = None, count: int = 3) -> list[Mate]:
    if family_of(model) == "causal_lm":
        return [lm_mate(alone, model, prompt) for prompt in PROMPTS[:count]]
    return [rest_mate(alone, model, f"/predictions/{served or model}", body, ctype) for body, ctype in examples(model, count)]


def lm_body(prompt: str, tokens: int = LM_TOKENS) -> bytes:
    return json.dumps({"prompt": prompt, "max_new_tokens": tokens, "temperature": 0}).encode()


def lm_mate(alone: Alone, model: str, prompt: str) -> Mate:
    return rest_mate(alone, model, f"/predictions/{model}", lm_body(prompt), JSON)


def cached_mates(alone: Alone, model: str, served: str) -> Callable[[], Sequence[Mate]]:
    """For a model with the response cache on: one request that bypasses the cache (no-cache), one the
    cache answers (a repeat), one it has never seen (computed, then stored); references from `model`
    served without the cache."""
    body_of = [json.loads(body) for body, _ in examples(model, 3)]
    counter = itertools.count()

    def make() -> Sequence[Mate]:
        fresh = {**body_of[2], "text": f"{body_of[2]['text']} (request {next(counter)})"}
        path = f"/predictions/{served}"
        return [rest_mate(alone, model, path, json.dumps(body_of[0]).encode(), JSON, f"/predictions/{model}",
                          (("Cache-Control", "no-cache"),)),
                rest_mate(alone, model, path, json.dumps(body_of[1]).encode(), JSON, f"/predictions/{model}"),
                rest_mate(alone, model, path, json.dumps(fresh).encode(), JSON, f"/predictions/{model}")]

    return make


# ---- KServe --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Instance:
    value: Any  # a v1 instance: text, {"b64": ...} or the JSON object
    v2_string: str  # the same as one BYTES element of a JSON request
    raw: bytes  # the same as one BYTES element of the binary extension (as its family reads it type-less)
    rest: tuple[bytes, str]  # the /predictions request it stands for


@cache
def instances(model: str) -> tuple[Instance, ...]:
    family, out = family_of(model), []
    for body, ctype in examples(model, len(examples_of(model))):
        typeless = grpc_body(family, body, ctype)
        kind = _input_kind(model)
        if kind == "bytes":
            encoded = base64.b64encode(typeless).decode()
            out.append(Instance({"b64": encoded}, encoded, typeless, (body, ctype)))
        elif kind == "text":
            out.append(Instance(typeless.decode(), typeless.decode(), typeless, (body, ctype)))
        else:
            out.append(Instance(json.loads(typeless), typeless.decode(), typeless, (body, ctype)))
    return tuple(out)


def _input_kind(model: str) -> str:
    from handlers.families import family_class

    return family_class(family_of(model)).input_kind


def references(alone: Alone, model: str, chosen: Sequence[Instance]) -> list:
    return [alone.answers(Request(f"/predictions/{model}", *i.rest), answers.rest)[0] for i in chosen]


def v1_body(chosen: Sequence[Instance]) -> bytes:
    return json.dumps({"instances": [i.value for i in chosen]}).encode()


def v2_body(chosen: Sequence[Instance], **extra: Any) -> bytes:
    tensor = {"name": "input-0", "shape": [len(chosen)], "datatype": "BYTES", "data": [i.v2_string for i in chosen]}
    return json.dumps({"inputs": [tensor], **extra}).encode()


def kserve_mates(alone: Alone, model: str, protocol: str) -> list[Mate]:
    """Two /predictions requests and one in `protocol` ("v1" or "v2"), each of one instance."""
    chosen = instances(model)[:1]
    refs = references(alone, model, chosen)
    if protocol == "v1":
        own = Mate(Request(f"/v1/models/{model}:predict", v1_body(chosen), JSON), answers.same_as(model, answers.v1, refs))
    else:
        own = Mate(Request(f"/v2/models/{model}/infer", v2_body(chosen), JSON),
                   answers.same_as(model, answers.v2(refs[0]), refs))
    return [*rest_mates(alone, model, count=2), own]


# ---- gRPC and OpenAI ---------------------------------------------------------------------------------
def grpc_mates(alone: Alone, model: str) -> list[Mate]:
    """Two REST requests and one gRPC Predictions (the example in its type-less form)."""
    body, ctype = examples(model, 1)[0]
    reference = alone.answers(Request(f"/predictions/{model}", body, ctype), answers.rest)
    own = Mate(Request(f"{GRPC}Predictions/{model}", grpc_body(family_of(model), body, ctype)),
               answers.same_as(model, answers.rest, reference))
    return [*rest_mates(alone, model, count=2), own]


def openai_path(model: str, endpoint: str) -> str:
    return f"/predictions/{model}/1.0/v1/{endpoint}"


def openai_lm_mates(alone: Alone, model: str) -> list[Mate]:
    """A completion, a chat and a /predictions generation, greedy and short."""
    completion = json.dumps({"model": model, "prompt": PROMPTS[0], "max_tokens": LM_TOKENS, "temperature": 0}).encode()
    chat = json.dumps({"model": model, "messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": LM_TOKENS,
                       "temperature": 0}).encode()
    out = []
    for endpoint, body in (("completions", completion), ("chat/completions", chat)):
        request = Request(openai_path(model, endpoint), body, JSON)
        out.append(Mate(request, answers.same_as(None, answers.openai_text(), alone.answers(request, answers.openai_text()))))
    return [*out, lm_mate(alone, model, PROMPTS[2])]


def embedding_mates(alone: Alone, model: str, dimensions: int) -> list[Mate]:
    """Two /predictions requests and one OpenAI embeddings request of one text."""
    (instance,) = instances(model)[:1]
    refs = references(alone, model, [instance])
    body = json.dumps({"model": model, "input": instance.v2_string}).encode()
    own = Mate(Request(openai_path(model, "embeddings"), body, JSON),
               answers.same_as(model, answers.openai_embeddings(dimensions), refs))
    return [*rest_mates(alone, model, count=2), own]
