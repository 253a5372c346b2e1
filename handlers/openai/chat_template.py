"""Chat messages -> the prompt text, rendered the way transformers' `apply_chat_template(messages,
tokenize=False, add_generation_prompt=True)` renders it: the tokenizer's own Jinja2 template (from
tokenizer_config.json) in a sandboxed, immutable environment with trim_blocks and lstrip_blocks, the
loopcontrols extension, transformers' `tojson` (no HTML escaping), `raise_exception`,
`strftime_now`, a `namespace` refusing underscore names, a bare `dict`, and `{% generation %}` blocks rendered as
their contents. The template sees `messages`, `add_generation_prompt=True`, `tools=None`,
`documents=None`, `bos_token` and `eos_token`.

Without a template, a plain one (no special tokens):

    system: You are terse.
    user: Hi
    assistant:

A template's `raise_exception(...)` (say, roles that do not alternate) is the request's fault: a
400 naming `messages`. Any other failure inside the template is ours: a 500.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Optional

from handlers.errors import ConfigError, ServerFault
from handlers.openai.errors import OpenAIError

Message = Mapping[str, Any]  # {"role": ..., "content": str, optionally "name": ...}


def plain(messages: Sequence[Message]) -> str:
    """The template used when the model has none."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def _raise_exception(message: Any) -> None:
    # Jinja lets an exception raised by a global through unchanged: no need to recognise it later.
    raise OpenAIError(f"the model's chat template refused these messages: {message}"[:500], param="messages")


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=1)
def _environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` marks assistant text for training masks: render the body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """A namespace that cannot hold underscore names, the way to CPython internals."""

        def __init__(*args, **kwargs):  # Jinja's own signature trick: `namespace(self=...)` still works
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"chat templates cannot set {name!r} on a namespace")

    class Dict:
        """`dict(...)` and `dict.fromkeys(...)`, without the class itself in the template's hands."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = Namespace
    env.globals["dict"] = Dict()
    return env


@functools.lru_cache(maxsize=8)
def compile_template(template: str):
    """The compiled template; ConfigError when it is not valid Jinja (call it at load time to fail early)."""
    import jinja2

    try:
        return _environment().from_string(template)
    except jinja2.TemplateSyntaxError as err:
        raise ConfigError(f"chat template: {err.message} (line {err.lineno})") from None


def render(messages: Sequence[Message], template: Optional[str], bos_token: str = "", eos_token: str = "") -> str:
    """The prompt for `messages`, ending where the assistant's answer starts."""
    if template is None:
        return plain(messages)
    import jinja2

    compiled = compile_template(template)
    try:
        return compiled.render(messages=[dict(m) for m in messages], add_generation_prompt=True, tools=None,
                               documents=None, bos_token=bos_token, eos_token=eos_token)
    except jinja2.TemplateError as err:
        raise ServerFault(f"the model's chat template failed: {type(err).__name__}: {err}"[:500]) from None
