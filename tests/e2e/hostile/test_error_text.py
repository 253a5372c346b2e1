"""Any error text of any characters reaches the client as a valid reply, and the model answers the
next request: a field name (or a v2 datatype) of any characters (non-ASCII, CR/LF, NUL, controls,
right-to-left marks) that the refusal names, on every route whose refusals echo what was sent. Over
REST the refusal is read byte for byte (tests/e2e/hostile/raw_http.py): a status line and headers
without control characters, a body of exactly the length announced."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import pytest

from tests.e2e.conftest import LM, MODELS
from tests.e2e.helpers import settings_of
from tests.e2e.hostile import answers
from tests.e2e.hostile.bodies import FIELD_NAMES, words_naming
from tests.e2e.hostile.conftest import EMBEDDER
from tests.e2e.hostile.contract import GRPC, REFUSE, Batches, Contract, Expect, Probe, Request, RunningPeak, Witness, attack
from tests.e2e.hostile.kserve_bodies import DATATYPES
from tests.e2e.hostile.mates import (
    JSON,
    PROMPTS,
    Alone,
    canary,
    grpc_mates,
    instances,
    kserve_mates,
    openai_lm_mates,
    openai_path,
    rest_mates,
)

pytestmark = pytest.mark.e2e

EXAMPLES = 2
JSON_MODELS = [m for m in MODELS if settings_of(m).family in ("tensor", "quantile_forecaster")]


@dataclass(frozen=True)
class Route:
    name: str
    model: str
    path: str
    body: Callable[[str], bytes]  # the valid request with the name put where its refusal will echo it
    mates: Callable[[Alone], list]
    generating: bool = False


def _with(doc: dict) -> Callable[[str], bytes]:
    return lambda name: json.dumps({**doc, name: 1}).encode()


def _lm_openai(endpoint: str) -> Route:
    asked = {"model": LM, "max_tokens": 2, "temperature": 0}
    asked.update({"messages": [{"role": "user", "content": PROMPTS[0]}]} if endpoint == "chat/completions"
                 else {"prompt": PROMPTS[0]})
    return Route(f"openai {endpoint}", LM, openai_path(LM, endpoint), _with(asked), lambda a: openai_lm_mates(a, LM), True)


def routes() -> list[Route]:
    out = [_lm_openai("completions"), _lm_openai("chat/completions"),
           Route("predictions causal LM", LM, f"/predictions/{LM}", _with({"prompt": PROMPTS[0], "max_new_tokens": 2}),
                 lambda a: rest_mates(a, LM, count=2), True),
           Route("openai embeddings", EMBEDDER, openai_path(EMBEDDER, "embeddings"),
                 _with({"model": EMBEDDER, "input": "hello"}), lambda a: rest_mates(a, EMBEDDER)),
           Route("v2 datatype", EMBEDDER, f"/v2/models/{EMBEDDER}/infer",
                 lambda name: json.dumps({"inputs": [{"name": "input-0", "shape": [1], "datatype": name,
                                                      "data": ["hello"]}]}).encode(),
                 lambda a: kserve_mates(a, EMBEDDER, "v2"))]
    for model in JSON_MODELS:
        out.append(Route(f"predictions {model}", model, f"/predictions/{model}", _with(instances(model)[0].value),
                         lambda a, m=model: rest_mates(a, m)))
    model = JSON_MODELS[0]  # the same refusal through KServe v1 and gRPC
    doc = instances(model)[0].value
    return out + [Route(f"v1 {model}", model, f"/v1/models/{model}:predict",
                        lambda name: json.dumps({"instances": [{**doc, name: 1}]}).encode(),
                        lambda a: kserve_mates(a, model, "v1")),
                  Route(f"gRPC {model}", model, f"{GRPC}Predictions/{model}", _with(doc), lambda a: grpc_mates(a, model))]


ROUTES = routes()
CASES = [pytest.param(r, id=r.name, marks=[pytest.mark.only_on("torchserve")] if r.path.startswith(GRPC) else [])
         for r in ROUTES]


@pytest.mark.parametrize("route", CASES)
def test_any_error_text_reaches_the_client(sender, alone, route):
    def probe(name: str) -> Probe:
        grpc_route = route.path.startswith(GRPC)
        request = Request(route.path, route.body(name), None if grpc_route else JSON, strict=not grpc_route)
        return Probe(request, Expect(REFUSE, None, words_naming(name)), answers.well_formed(None, answers.rest),
                     f"{route.name}: {name!r}")

    witness: Witness = RunningPeak(sender.served, route.model) if route.generating else Batches(sender.served, route.model, 3)
    held = Contract(sender, route.model, canary(route.model), cache(lambda: route.mates(alone)), witness)
    names = FIELD_NAMES.filter(lambda n: n not in DATATYPES)  # a datatype the v2 route knows is no error
    attack(held, names, probe, EXAMPLES, ["é", "a\r\nb", "\u65e5\u672c\x00\x07"])
