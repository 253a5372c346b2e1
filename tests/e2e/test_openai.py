"""OpenAI's own Python client, unchanged, against a real TorchServe: base_url
http://127.0.0.1:<port>/predictions/<model>/<version>/v1 and the inference key as api_key.

Chat and completions, whole and streamed (Server-Sent Events ending with [DONE], usage when asked),
greedy output identical streamed and whole and equal to the /predictions answer for the same prompt;
the models list; an unsupported field refused in OpenAI's error shape; a wrong key refused; and
embeddings from the text embedder, equal to its /predictions answers. Then a Llama-style folder of
one's own (tests/tiny.py), built with no settings but limits, answers OpenAI's chat with its own
template, start and end tokens."""

from __future__ import annotations

import numpy as np
import openai
import pytest

from benchmarks.load.generation import generate
from handlers.openai.chat_template import render
from serving.launcher import TorchServe
from serving.ts_config import ModelSettings
from tests.tiny import LLAMA_TEMPLATE, llama_archive, tiny_llama

pytestmark = pytest.mark.e2e

LM, EMBEDDER, VERSION = "tinylm", "minilm", "1.0"
MESSAGES = [{"role": "system", "content": "You answer about Python."},
            {"role": "user", "content": "What does the for statement do?"}]


@pytest.fixture(scope="module")
def lm_server(async_lm_server):
    """tinylm as built (the async mode), batchSize 1 (tests/e2e/conftest.py's shared server)."""
    return async_lm_server


@pytest.fixture(scope="module")
def client(lm_server):
    return openai.OpenAI(base_url=f"{lm_server.inference_url}/predictions/{LM}/{VERSION}/v1",
                         api_key=lm_server.tokens.inference, max_retries=0, timeout=60)


def predictions(server, prompt: str, tokens: int, model: str = LM) -> str:
    answer = generate(server.client, model, {"prompt": prompt, "max_new_tokens": tokens, "temperature": 0},
                      stream=False)
    assert answer.ok, answer.error
    return answer.text


def test_completion_whole_and_streamed_equal_the_predictions_answer(lm_server, client):
    prompt = "The for statement is used to"
    whole = client.completions.create(model=LM, prompt=prompt, max_tokens=24, temperature=0)
    chunks = list(client.completions.create(model=LM, prompt=prompt, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert whole.choices[0].text == streamed == predictions(lm_server, prompt, 24)
    assert whole.usage.completion_tokens == chunks[-1].usage.completion_tokens > 0
    assert whole.choices[0].finish_reason in ("stop", "length")


def test_chat_whole_and_streamed_equal_the_predictions_answer_of_the_rendered_prompt(lm_server, client):
    whole = client.chat.completions.create(model=LM, messages=MESSAGES, max_tokens=32, temperature=0)
    stream = client.chat.completions.create(model=LM, messages=MESSAGES, max_tokens=32, temperature=0, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert deltas[0].role == "assistant"
    streamed = "".join(d.content or "" for d in deltas)
    # tinylm's tokenizer has no chat template: the documented plain one
    expected = predictions(lm_server, render(MESSAGES, None), 32)
    assert whole.choices[0].message.content == streamed == expected
    assert whole.usage.prompt_tokens > 0 and whole.object == "chat.completion"


def test_seeded_sampling_repeats(client):
    asked = {"model": LM, "messages": MESSAGES, "max_tokens": 16, "temperature": 0.9, "seed": 7}
    first, second = client.chat.completions.create(**asked), client.chat.completions.create(**asked)
    assert first.choices[0].message.content == second.choices[0].message.content


def test_the_models_list_names_the_model(client):
    assert [m.id for m in client.models.list()] == [LM]


def test_an_unsupported_field_is_a_400_in_openais_shape(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=LM, messages=MESSAGES, n=2)
    assert err.value.status_code == 400 and err.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=LM, messages=MESSAGES, extra_body={"no_such_field": 1})
    assert "no_such_field" in err.value.body["message"]


def test_a_wrong_key_is_refused(lm_server):
    wrong = openai.OpenAI(base_url=f"{lm_server.inference_url}/predictions/{LM}/{VERSION}/v1", api_key="wrong",
                          max_retries=0, timeout=30)
    # TorchServe 0.12 answers a wrong key with 400 InvalidKeyException, before any handler runs.
    with pytest.raises(openai.APIStatusError) as err:
        wrong.chat.completions.create(model=LM, messages=MESSAGES, max_tokens=4)
    assert err.value.status_code in (400, 401)


@pytest.fixture(scope="module")
def embedder(server):
    """The shipped config.properties' server (tests/e2e/conftest.py), which serves the embedder."""
    return server


def test_embeddings_equal_the_predictions_answers(embedder):
    client = openai.OpenAI(base_url=f"{embedder.inference_url}/predictions/{EMBEDDER}/{VERSION}/v1",
                           api_key=embedder.tokens.inference, max_retries=0, timeout=60)
    texts = ["A man is eating food.", "The new movie is awesome."]
    got = client.embeddings.create(model=EMBEDDER, input=texts)  # the client asks for base64 and decodes it
    assert [d.index for d in got.data] == [0, 1] and got.usage.prompt_tokens > 0
    for text, item in zip(texts, got.data):
        plain = embedder.predict(EMBEDDER, {"text": text}).json()["embedding"]
        np.testing.assert_allclose(item.embedding, plain, rtol=1e-5, atol=1e-6)
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=EMBEDDER, input=[[1, 2, 3]])
    assert err.value.body["param"] == "input"


# ---- a Hugging Face folder of one's own -------------------------------------------------------------
@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """A tiny Llama folder (rotary positions, RMSNorm, grouped-query attention, its own BPE with
    <s> </s>, a chat template in tokenizer_config.json) built as a user's entry: the default mode."""
    root = tmp_path_factory.mktemp("llama-project")
    archive = llama_archive(tiny_llama(root / "brought" / "llama"), root,
                            {"max_prompt_tokens": 96, "max_new_tokens": 24, "default_max_new_tokens": 8})
    with TorchServe(archive.parent, models={"llama": ModelSettings(batch_size=1, max_batch_delay_ms=1)},
                    load=("llama",)) as ts:
        yield ts


def test_a_llama_folder_of_ones_own_answers_openais_chat_with_its_own_template(llama_server):
    client = openai.OpenAI(base_url=f"{llama_server.inference_url}/predictions/llama/{VERSION}/v1",
                           api_key=llama_server.tokens.inference, max_retries=0, timeout=60)
    asked = {"model": "llama", "messages": MESSAGES, "max_tokens": 16, "temperature": 0}
    whole = client.chat.completions.create(**asked)
    chunks = list(client.chat.completions.create(**asked, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    prompt = render(MESSAGES, LLAMA_TEMPLATE, "<s>", "</s>")  # the template of its tokenizer_config.json
    assert prompt.startswith("<s><|system|>") and prompt.endswith("<|assistant|>")
    assert whole.choices[0].message.content == streamed == predictions(llama_server, prompt, 16, "llama")
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens > len(MESSAGES)
    assert [m.id for m in client.models.list().data] == ["llama"]
