"""Any Hugging Face causal LM folder serves with no token settings: a tiny Llama (rotary positions,
RMSNorm, grouped-query attention, its own byte-level BPE with <s> </s> <unk>, a chat template)
gives the family its end and start tokens and template from its own files, a catalogue setting
overrides them, every end token of a list stops a sequence, the start token is there once, and a
folder naming no end token is refused with the setting to give. Then the real build archives it and
the handler serves it: the KV cache equals recomputation, streamed equals whole.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from handlers.errors import ConfigError
from handlers.families.causal_lm import CausalLM, CausalLMSettings
from tests.tiny import LLAMA_TEMPLATE, llama_archive, tiny_llama
from tests.unit.generation_helpers import run_continuous

pytestmark = pytest.mark.unit

BOS, EOS, UNK = 0, 1, 2  # <s> </s> <unk>: the tokenizer's first tokens
DROP = object()
SMALL_FILES = ("tokenizer.json", "config.json", "generation_config.json", "tokenizer_config.json")
PROMPTS = ["The for statement", "A cat sleeps on the warm windowsill.", "A man"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("llama") / "llama")


def changed(source: Path, into: Path, files: dict = None) -> Path:
    """The folder's tokenizer and JSON files (no weights) copied into `into`, then `files` applied:
    {name: None} deletes a file, {name: {key: value}} sets keys of a JSON file (DROP removes one,
    the file is made if missing), {name: "text"} writes a file."""
    into.mkdir(parents=True, exist_ok=True)
    for name in SMALL_FILES:
        shutil.copy2(source / name, into / name)
    for name, change in (files or {}).items():
        path = into / name
        if change is None:
            path.unlink()
        elif isinstance(change, str):
            path.write_text(change)
        else:
            data = json.loads(path.read_text()) if path.is_file() else {}
            data.update(change)
            path.write_text(json.dumps({k: v for k, v in data.items() if v is not DROP}))
    return into


LIMITS = {"max_prompt_tokens": 48, "max_new_tokens": 24, "default_max_new_tokens": 8}  # within 128 positions


def family(folder: Path, **settings) -> CausalLM:
    return CausalLM(CausalLMSettings(**{**LIMITS, **settings}), folder)


# ---- what the model's files say ------------------------------------------------------------------
def test_end_start_and_template_come_from_the_model_files(llama):
    lm = family(llama)
    assert (lm.eos_ids, lm.eos_id, lm.eos_token) == ((EOS,), EOS, "</s>")
    assert (lm.bos_id, lm.bos_token, lm.add_bos) == (BOS, "<s>", True)
    assert lm.chat_template == LLAMA_TEMPLATE


@pytest.mark.parametrize("files, eos_ids, eos_token", [
    ({"generation_config.json": {"eos_token_id": [EOS, UNK]}}, (EOS, UNK), "</s>"),  # an id list, over the rest
    ({"generation_config.json": None, "tokenizer_config.json": {"eos_token": "<unk>"}}, (UNK,), "<unk>"),
    ({"generation_config.json": None, "tokenizer_config.json": {"eos_token": DROP},
      "special_tokens_map.json": {"eos_token": {"content": "<unk>", "special": True}}}, (UNK,), "<unk>"),
    ({"generation_config.json": None, "tokenizer_config.json": {"eos_token": DROP}}, (EOS,), "</s>"),  # config.json
], ids=["generation_config", "tokenizer_config", "special_tokens_map", "config"])
def test_each_file_in_its_turn(llama, tmp_path, files, eos_ids, eos_token):
    lm = family(changed(llama, tmp_path, files))
    assert (lm.eos_ids, lm.eos_token) == (eos_ids, eos_token)


def test_catalogue_settings_override_the_model_files(llama, tmp_path):
    assert family(llama, eos_token="<unk>").eos_ids == (UNK,)
    several = family(llama, eos_tokens=("<unk>", "</s>"))
    assert (several.eos_ids, several.eos_id, several.eos_token) == ((UNK, EOS), UNK, "<unk>")
    plain = family(llama, add_bos=False, bos_token="<unk>")
    assert (plain.add_bos, plain.bos_id, plain.encode("A man")[:1]) == (False, UNK, family(llama).encode("A man")[1:2])
    inline = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert family(llama, chat_template=inline).chat_template == inline
    folder = changed(llama, tmp_path, {"mine.jinja": inline + "!"})
    assert family(folder, chat_template="mine.jinja").chat_template == inline + "!"


def test_the_chat_template_file_wins_and_named_templates_give_the_default(llama, tmp_path):
    jinja = changed(llama, tmp_path / "a", {"chat_template.jinja": "{{ bos_token }}jinja"})
    assert family(jinja).chat_template == "{{ bos_token }}jinja"
    named = [{"name": "tool_use", "template": "{{ 1 }}"}, {"name": "default", "template": "{{ 2 }}"}]
    assert family(changed(llama, tmp_path / "b", {"tokenizer_config.json": {"chat_template": named}})).chat_template \
        == "{{ 2 }}"
    none = changed(llama, tmp_path / "c", {"tokenizer_config.json": {"chat_template": DROP}})
    assert family(none).chat_template is None


@pytest.mark.parametrize("files, settings, words", [
    ({"generation_config.json": None, "tokenizer_config.json": {"eos_token": DROP},
      "config.json": {"eos_token_id": None}}, {}, "causal_lm.eos_token"),
    ({}, {"eos_token": "<|endoftext|>"}, "causal_lm.eos_token: '<|endoftext|>' is not in tokenizer.json"),
    ({"generation_config.json": {"eos_token_id": [EOS, 5000]}}, {}, "5000 is not a token id"),
    ({"tokenizer_config.json": {"bos_token": DROP}, "generation_config.json": {"bos_token_id": None},
      "config.json": {"bos_token_id": None}}, {}, "causal_lm.bos_token"),
    ({"tokenizer_config.json": {"chat_template": [{"name": "rag", "template": "x"}]}}, {}, "causal_lm.chat_template"),
    ({"tokenizer_config.json": {"chat_template": "{% for m in messages %}"}}, {}, "not a Jinja2 template"),
    ({}, {"chat_template": "missing.jinja"}, "neither a file in the archive"),
], ids=["no end token", "eos not in the tokenizer", "eos id out of the vocabulary", "add_bos without a start token",
        "named templates without default", "template syntax", "template file missing"])
def test_what_cannot_be_read_is_refused_naming_the_key(llama, tmp_path, files, settings, words):
    with pytest.raises(ConfigError) as caught:
        family(changed(llama, tmp_path, files), **settings)
    assert words in caught.value.message


def test_settings_that_contradict_themselves_are_refused():
    with pytest.raises(ConfigError, match="eos_token and causal_lm.eos_tokens"):
        CausalLMSettings(eos_token="</s>", eos_tokens=("</s>",))
    with pytest.raises(ConfigError, match="eos_tokens"):
        CausalLMSettings(eos_tokens=())


# ---- the start token, once -----------------------------------------------------------------------
def render(lm: CausalLM, messages) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    return ImmutableSandboxedEnvironment().from_string(lm.chat_template).render(
        messages=messages, bos_token=lm.bos_token, eos_token=lm.eos_token, add_generation_prompt=True)


def test_the_start_token_is_prepended_once(llama):
    lm = family(llama)
    plain = lm.tokenizer.encode("A man", add_special_tokens=False).ids
    assert lm.encode("A man") == [BOS, *plain]
    assert lm.encode("<s>A man") == [BOS, *plain]  # already there (a rendered template): not twice
    chat = lm.encode(render(lm, [{"role": "user", "content": "A man"}]))
    assert chat[0] == BOS and chat.count(BOS) == 1
    assert list(lm.decode({"prompt": "A man"}, "").prompt_ids) == [BOS, *plain]


def with_post_processor(folder: Path) -> None:
    """tokenizer.json's post-processor puts <s> first, as Llama-3's does."""
    from tokenizers import Tokenizer, processors

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    tokenizer.save(str(folder / "tokenizer.json"))


@pytest.mark.parametrize("add_bos_token, expected", [(DROP, True), (False, False), (True, True)])
def test_a_tokenizer_that_adds_the_start_token_itself_gets_it_once(llama, tmp_path, add_bos_token, expected):
    folder = changed(llama, tmp_path, {"tokenizer_config.json": {"add_bos_token": add_bos_token}})
    with_post_processor(folder)
    lm = family(folder)
    plain = lm.tokenizer.encode("A man", add_special_tokens=False).ids
    assert lm.add_bos is expected
    assert lm.encode("A man") == ([BOS] if expected else []) + plain


def test_no_start_token_unless_the_model_asks_for_one(llama, tmp_path):
    lm = family(changed(llama, tmp_path, {"tokenizer_config.json": {"add_bos_token": DROP}}))
    assert (lm.add_bos, lm.bos_id) == (False, BOS)
    assert BOS not in lm.encode("A man")


# ---- generation ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama_lm(llama):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(llama)).eval()


def engine_for(lm: CausalLM, model):
    from handlers.generation.engine import Engine

    return Engine(model, lm.decode_text, lm.eos_ids, lm.check_model(model))


def test_any_end_token_of_a_list_stops_generation(llama, llama_lm, tmp_path):
    lm = family(llama)
    request = lm.decode({"prompt": PROMPTS[0], "max_new_tokens": 12, "ignore_eos": True}, "")
    free = engine_for(lm, llama_lm).generate([("a", request)])["a"].generated_ids
    at = next(i for i in range(2, len(free)) if free[i] not in free[:i] and free[i] != EOS)
    listed = family(changed(llama, tmp_path, {"generation_config.json": {"eos_token_id": [EOS, free[at]]}}))
    assert listed.eos_ids == (EOS, free[at])
    ask = listed.decode({"prompt": PROMPTS[0], "max_new_tokens": 12}, "")
    stopped = engine_for(listed, llama_lm).generate([("a", ask)])["a"]
    assert stopped.generated_ids == free[:at + 1] and stopped.finish == "stop"
    assert stopped.text.text == lm.decode_text(free[:at])


# ---- built, archived and served --------------------------------------------------------------------
CHAT_JINJA = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def served(llama, tmp_path_factory):
    """The real build on a one-entry catalogue (no token settings), the archive extracted, the handler
    initialised in-process, in the step mode (driven call by call here; tests/e2e/test_openai.py
    serves the folder in the default mode through TorchServe)."""
    from handlers.handler import Handler
    from serving.fake_context import FakeContext, extract

    archive = llama_archive(llama, tmp_path_factory.mktemp("project"), {**LIMITS, "mode": "step"}, CHAT_JINJA)
    folder = extract(archive, tmp_path_factory.mktemp("extracted"))
    context = FakeContext(folder, "llama", batch_size=4)
    handler = Handler()
    handler.initialize(context)
    return folder, handler, context


def test_the_archive_carries_the_model_files_beside_its_tokenizer(served):
    folder, handler, _ = served
    for name in ("tokenizer.json", "config.json", "generation_config.json", "tokenizer_config.json",
                 "chat_template.jinja"):
        assert (folder / name).is_file(), name
    config = yaml.safe_load((folder / "model-config.yaml").read_text())
    token_settings = {"eos_token", "eos_tokens", "bos_token", "add_bos", "chat_template"}
    assert not token_settings & set(config["handler"]["causal_lm"])
    lm = handler.family
    assert (lm.eos_ids, lm.bos_id, lm.add_bos, lm.bos_token, lm.eos_token) == ((EOS,), BOS, True, "<s>", "</s>")
    assert lm.chat_template == CHAT_JINJA  # chat_template.jinja over tokenizer_config.json's
    assert handler.generation.engine.eos_ids == (EOS,)


def test_served_greedy_with_the_cache_equals_recomputation(served):
    _, handler, _ = served
    engine, lm = handler.generation.engine, handler.family
    requests = [lm.decode({"prompt": p, "max_new_tokens": 20}, "") for p in PROMPTS]
    together = engine.generate([(str(i), r) for i, r in enumerate(requests)])  # left-padded, grouped-query
    for i, request in enumerate(requests):
        assert request.prompt_ids[0] == BOS and request.prompt_ids.count(BOS) == 1
        alone = engine.generate_without_cache(request)
        assert together[str(i)].generated_ids == alone.generated_ids
        assert together[str(i)].text.text == alone.text.text


def test_served_streamed_equals_whole(served):
    _, handler, context = served
    body = {"prompt": PROMPTS[1], "max_new_tokens": 16}
    whole, _ = run_continuous(handler, context, {0: [("w", body)]})
    answer = json.loads(whole["w"][-1])
    streamed, _ = run_continuous(handler, context, {0: [("s", {**body, "stream": True})]})
    lines = [json.loads(line) for chunk in streamed["s"] for line in chunk.decode().splitlines()]
    assert len(lines) > 1 and "".join(line["text"] for line in lines) == answer["text"]
    assert lines[-1]["finish_reason"] == answer["finish_reason"]
    assert answer["prompt_tokens"] == len(handler.family.encode(PROMPTS[1]))
    assert handler.generation.engine.running == [] and handler.generation.live == {}
