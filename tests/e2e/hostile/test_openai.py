"""Hostile OpenAI requests: completions and chat to the causal LM (its async mode; on Ray Serve also
at its plain /v1), embeddings to the text embedder. Valid generations of 1 to 6 tokens, stop strings
reached at the first tokens, streamed or whole, must be answered, and greedily: a prefix of the
greedy answer alone; unknown fields of any name are refused by name; odd values and random bodies
never cost a fault, a batch-mate or the worker."""

from __future__ import annotations

import json
from functools import cache

import pytest

from tests.e2e.conftest import LM
from tests.e2e.hostile import answers, openai_bodies
from tests.e2e.hostile.bodies import Body
from tests.e2e.hostile.conftest import EMBEDDER
from tests.e2e.hostile.contract import ANSWER, Batches, Contract, Judge, Probe, Request, RunningPeak, attack
from tests.e2e.hostile.mates import (
    JSON,
    LM_TOKENS,
    PROMPTS,
    Alone,
    canary,
    embedding_mates,
    instances,
    openai_lm_mates,
    openai_path,
    references,
)

pytestmark = pytest.mark.e2e

EXAMPLES = 12
ENDPOINTS = ["completions", "chat/completions"]


def greedy(alone: Alone, endpoint: str) -> dict[str, str]:
    """Each prompt's answer at temperature 0, LM_TOKENS long, on this endpoint, alone."""
    out = {}
    for prompt in PROMPTS:
        asked = {"model": LM, "max_tokens": LM_TOKENS, "temperature": 0}
        asked.update({"messages": [{"role": "user", "content": prompt}]} if endpoint == "chat/completions"
                     else {"prompt": prompt})
        request = Request(openai_path(LM, endpoint), json.dumps(asked).encode(), JSON)
        out[prompt] = alone.answers(request, answers.openai_text())[0]["text"]
    return out


def generation_judge(body: Body, texts: dict[str, str]) -> Judge:
    """Well formed; a valid greedy request's text begins the greedy answer (its stop and length cut it)."""
    if body.expect.outcome != ANSWER:
        return answers.well_formed(None, answers.openai_text())
    asked = json.loads(body.data)
    prompt = asked.get("prompt") or asked["messages"][0]["content"]
    parse = answers.openai_text(asked["max_tokens"])
    shape = answers.well_formed(None, parse, 1)

    def judge(reply) -> str | None:
        wrong = shape(reply)
        if wrong:
            return wrong
        text = parse(reply)[0]["text"]
        return None if texts[prompt].startswith(text) else f"{text!r} does not begin the greedy answer {texts[prompt]!r}"

    return judge


def attack_generation(sender, alone, endpoint: str, path: str, examples: int) -> None:
    texts = cache(lambda: greedy(alone, endpoint))  # asked once the contract has seen the model answer

    def probe(body: Body) -> Probe:
        return Probe(Request(path, body.data, body.content_type), body.expect, generation_judge(body, texts()),
                     body.label)

    held = Contract(sender, LM, canary(LM), cache(lambda: openai_lm_mates(alone, LM)), RunningPeak(sender.served, LM))
    attack(held, openai_bodies.generation(LM, endpoint == "chat/completions", texts), probe, examples)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_openai_generation(sender, alone, endpoint):
    attack_generation(sender, alone, endpoint, openai_path(LM, endpoint), EXAMPLES)


@pytest.mark.only_on("ray")
@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_openai_generation_at_a_plain_v1(sender, alone, endpoint):
    """Ray Serve serves OpenAI's routes at a plain /v1 too, the model named in the body (TorchServe
    cannot): the same contract there, its batch-mates on /predictions."""
    attack_generation(sender, alone, endpoint, f"/v1/{endpoint}", EXAMPLES // 2)


def test_openai_embeddings(sender, alone):
    every = instances(EMBEDDER)
    dimensions = cache(lambda: len(references(alone, EMBEDDER, every[:1])[0]["embedding"]))

    def probe(body: Body) -> Probe:
        parse = answers.openai_embeddings(dimensions())
        if body.instances:
            judge = answers.same_as(EMBEDDER, parse, references(alone, EMBEDDER, [every[i] for i in body.instances]))
        else:
            judge = answers.well_formed(EMBEDDER, parse)
        return Probe(Request(openai_path(EMBEDDER, "embeddings"), body.data, body.content_type), body.expect, judge,
                     body.label)

    held = Contract(sender, EMBEDDER, canary(EMBEDDER), cache(lambda: embedding_mates(alone, EMBEDDER, dimensions())),
                    Batches(sender.served, EMBEDDER, 3))
    attack(held, openai_bodies.embeddings(EMBEDDER, [i.v2_string for i in every]), probe, EXAMPLES)
