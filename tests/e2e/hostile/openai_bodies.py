"""OpenAI requests a hostile client sends (completions, chat, embeddings), as hypothesis strategies.

A valid generation request is drawn with odd lengths (max_tokens 1 to 6: every admitted request is
answered at any length), stop strings cut from the greedy answer itself (so that they are reached
at the first, second, third token...), streamed or whole; then perhaps spoiled: a field OpenAI does
not have (any name: non-ASCII, CR/LF, NUL...), which must be refused by name; a field given an odd
value; or a random body.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from tests.e2e.hostile.bodies import FIELD_NAMES, HOSTILE_VALUES, JSON, JSON_VALUES, Body, words_naming
from tests.e2e.hostile.contract import ANSWER, EITHER, REFUSE, Expect
from tests.e2e.hostile.mates import PROMPTS

MAX_TOKENS = st.integers(1, 6)


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


@st.composite
def stop_strings(draw, greedy: str) -> Any:
    """None, or stop strings cut from the greedy answer (reached after a token or two), or others."""
    how = draw(st.sampled_from(["none", "none", "cut", "cut", "other"]))
    if how == "none" or not greedy:
        return None
    if how == "other":
        return draw(st.lists(st.text(max_size=4), min_size=1, max_size=4) | st.text(min_size=1, max_size=4))
    start = draw(st.integers(0, max(0, min(len(greedy), 24) - 1)))
    cut = greedy[start:start + draw(st.integers(1, 4))]
    return cut if draw(st.booleans()) else [cut]


@st.composite
def generation(draw, model: str, chat: bool, greedy: Callable[[], dict[str, str]]) -> Body:
    """`greedy()`: each prompt's answer at temperature 0 (where stop strings are cut from)."""
    prompt = draw(st.sampled_from(PROMPTS))
    max_tokens = draw(MAX_TOKENS)
    body: dict = {"model": model, "max_tokens": max_tokens, "temperature": 0}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    stop = draw(stop_strings(greedy().get(prompt, "")))
    if stop is not None:
        body["stop"] = stop
    stream = draw(st.sampled_from([None, False, True]))
    if stream is not None:
        body["stream"] = stream
        if stream and draw(st.booleans()):
            body["stream_options"] = {"include_usage": True}
    label = f"{'chat' if chat else 'completion'} max_tokens={max_tokens} stop={stop!r} stream={stream}"
    how = draw(st.sampled_from(["valid", "valid", "valid", "unknown field", "odd value", "random body"]))
    if how == "valid":
        return Body(label, _dumps(body), JSON, Expect(ANSWER))
    return _spoiled(draw, label, body, how, sorted(body))


def _spoiled(draw, label: str, body: dict, how: str, fields: list[str]) -> Body:
    """`body` with a field OpenAI does not have (refused by name), one of `fields` given an odd value,
    or a random body instead."""
    if how == "unknown field":
        name = draw(FIELD_NAMES)
        return Body(f"{label}, unknown field {name!r}", _dumps({**body, name: draw(JSON_VALUES)}), JSON,
                    Expect(REFUSE, 400, words_naming(name)))
    if how == "odd value":
        field = draw(st.sampled_from(fields))
        value = draw(HOSTILE_VALUES)
        return Body(f"{label}, {field} := {value!r}"[:160], _dumps({**body, field: value}), JSON, Expect(EITHER))
    return Body("random body", _dumps(draw(JSON_VALUES)), draw(st.sampled_from([JSON, None, "text/plain"])),
                Expect(EITHER))


@st.composite
def embeddings(draw, model: str, texts: list[str]) -> Body:
    """Inputs from the examples (a 200 must hold their answers: `texts` order) or random text."""
    chosen = draw(st.lists(st.integers(0, len(texts) - 1), min_size=1, max_size=4))
    body: dict = {"model": model, "input": [texts[i] for i in chosen]}
    fmt = draw(st.sampled_from([None, "float", "base64"]))
    if fmt is not None:
        body["encoding_format"] = fmt
    how = draw(st.sampled_from(["valid", "valid", "random text", "unknown field", "odd value", "too many",
                                "token arrays", "random body"]))
    if how == "valid":
        return Body(f"embeddings of examples {chosen}", _dumps(body), JSON, Expect(ANSWER), tuple(chosen))
    if how == "random text":
        value = draw(st.text(max_size=40) | st.lists(st.text(max_size=20), min_size=1, max_size=4))
        return Body(f"embeddings of {value!r}"[:120], _dumps({**body, "input": value}), JSON, Expect(EITHER))
    if how == "too many":
        count = draw(st.integers(65, 300))
        return Body(f"embeddings of {count} texts", _dumps({**body, "input": [texts[0]] * count}), JSON,
                    Expect(REFUSE, None, ("input",)))
    if how == "token arrays":
        return Body("embeddings of token arrays", _dumps({**body, "input": [[1, 2, 3]]}), JSON,
                    Expect(REFUSE, None, ("input",)))
    return _spoiled(draw, "embeddings", body, how, ["input", "encoding_format", "dimensions", "model", "user"])
