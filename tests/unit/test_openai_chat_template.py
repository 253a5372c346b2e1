"""Chat messages -> prompt text (handlers/openai/chat_template.py) as transformers'
apply_chat_template(..., tokenize=False, add_generation_prompt=True) renders it: real templates'
shapes (Zephyr, Llama 2 and 3, ChatML with a namespace, tojson, {% generation %}, loop controls),
compared with transformers itself on a tiny tokenizer built here, and Zephyr's by hand."""

from __future__ import annotations

from datetime import datetime

import pytest

from handlers.errors import ServerFault
from handlers.openai.chat_template import plain, render
from handlers.openai.errors import OpenAIError

pytestmark = pytest.mark.unit

ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
          "{% endif %}")

LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
          "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
          "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
          "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
          "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
          "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
          "{% endfor %}")

CHATML = """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(users=0) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}{%- set ns.users = ns.users + 1 %}{%- endif %}
    {%- if not (message.role == 'system' and loop.first) %}
        {{- '<|im_start|>' + message.role + ('' if message.name is not defined else ' ' + message.name) }}
        {{- '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{{- '<!-- ' + ns.users | string + ' user turns: ' + (messages | map(attribute='role') | list | tojson) + ' -->' }}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}"""

TOJSON = "{% for m in messages %}{{ m | tojson }}\n{{ m.content | tojson(indent=2) }}\n{% endfor %}"

GENERATION = ("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{{ eos_token }}"
              "{% endgeneration %}{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}"
              "{% if add_generation_prompt %}assistant: {% endif %}")

LOOP_CONTROLS = ("{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
                 "{% set d = dict(r=m.role) %}{{ d.r }}={{ m.content }};{% if loop.index > 3 %}{% break %}{% endif %}"
                 "{% endfor %}{{ '>' if add_generation_prompt }}")

# Indented block tags without "-": lstrip_blocks removes the indentation.
INDENTED = """{% for message in messages %}
    {% if message['role'] == 'user' %}
<start_of_turn>user
{{ message['content'] }}<end_of_turn>
    {% else %}
<start_of_turn>model
{{ message['content'] }}<end_of_turn>
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
<start_of_turn>model
{% endif %}"""

TEMPLATES = {"indented": INDENTED, "zephyr": ZEPHYR, "llama3": LLAMA3, "llama2": LLAMA2, "chatml": CHATML,
             "tojson": TOJSON, "generation": GENERATION, "loop_controls": LOOP_CONTROLS}

CONVERSATIONS = {
    "one turn": [{"role": "user", "content": "Hi"}],
    "system": [{"role": "system", "content": "You are a friendly chatbot."}, {"role": "user", "content": "Hi"}],
    "turns": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "  2+2? "},
              {"role": "assistant", "content": "4"}, {"role": "user", "content": "<b>&</b> and é 🌍\n\"q\""}],
    "named": [{"role": "user", "content": "Hi", "name": "ann"}],
}


@pytest.fixture(scope="module")
def tokenizer():
    """A tiny fast tokenizer with <s> and </s>, built here: only its chat-template rendering is used."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def transformers_render(tokenizer, messages, template):
    return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("template", TEMPLATES)
def test_rendering_equals_transformers_apply_chat_template(tokenizer, template, conversation):
    messages = CONVERSATIONS[conversation]
    ours = render(messages, TEMPLATES[template], bos_token="<s>", eos_token="</s>")
    assert ours == transformers_render(tokenizer, messages, TEMPLATES[template])


def test_zephyr_by_hand():
    assert render(CONVERSATIONS["system"], ZEPHYR, "<s>", "</s>") == (
        "<|system|>\nYou are a friendly chatbot.</s>\n<|user|>\nHi</s>\n<|assistant|>\n")


def test_indented_by_hand():
    assert render(CONVERSATIONS["one turn"], INDENTED) == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_llama3_by_hand():
    assert render(CONVERSATIONS["system"], LLAMA3, "<|begin_of_text|>", "<|eot_id|>") == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a friendly chatbot.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


def test_a_template_refusal_is_the_requests_400_where_transformers_raises(tokenizer):
    import jinja2

    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(jinja2.TemplateError, match="must alternate"):
        transformers_render(tokenizer, messages, LLAMA2)
    with pytest.raises(OpenAIError, match="must alternate") as caught:
        render(messages, LLAMA2, "<s>", "</s>")
    assert caught.value.status == 400 and caught.value.param == "messages"


def test_without_a_template_the_plain_one():
    messages = CONVERSATIONS["turns"]
    assert render(messages, None) == plain(messages) == (
        "system: Be terse.\nuser:   2+2? \nassistant: 4\nuser: <b>&</b> and é 🌍\n\"q\"\nassistant:")


def test_strftime_now_is_todays_date():
    assert render(CONVERSATIONS["one turn"], "{{ strftime_now('%Y') }}") in {str(datetime.now().year),
                                                                             str(datetime.now().year - 1)}


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% set ns = namespace(_hidden=1) %}{{ ns }}",
    "{% set ns = namespace(a=1) %}{% set ns._x = 2 %}{{ ns }}",
    "{{ messages.append(1) }}",  # the environment is immutable
])
def test_the_sandbox_holds(template):
    with pytest.raises(ServerFault):
        render(CONVERSATIONS["one turn"], template)
