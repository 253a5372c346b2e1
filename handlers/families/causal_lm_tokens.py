"""A causal LM's end and start tokens and its chat template, as its own files say (read once, when
the family is made), unless the catalogue's settings.causal_lm says otherwise.

The files sit beside the archive's tokenizer.json (the build stages them there: MODEL_FILES).
Precedence, per value, first found wins:

    end tokens:   eos_token / eos_tokens setting > generation_config.json eos_token_id (an id or a
                  list) > tokenizer_config.json eos_token > special_tokens_map.json eos_token >
                  config.json eos_token_id; none: a ConfigError naming causal_lm.eos_token
    start token:  bos_token setting > generation_config.json bos_token_id > tokenizer_config.json >
                  special_tokens_map.json > config.json > the token the tokenizer's post-processor
                  puts first
    prepend it:   add_bos setting > tokenizer_config.json add_bos_token > whether tokenizer.json's
                  post-processor puts a token first > no
    template:     chat_template setting (a file in the archive, or the template itself) >
                  chat_template.jinja > tokenizer_config.json chat_template (a string, or a list of
                  named templates: the one named "default")

The family encodes prompts without the tokenizer's special tokens and prepends the start token
itself, so it is never there twice (nor is an end token appended to a prompt).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from handlers.errors import ConfigError

# What the family reads beside tokenizer.json: the build stages those the model's folder has.
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
               "chat_template.jinja")


@dataclass(frozen=True)
class SpecialTokens:
    eos_ids: tuple[int, ...]  # any of them ends a sequence; the first pads batches
    eos_token: str  # for a chat template: the end token's text
    bos_id: Optional[int]
    bos_token: Optional[str]
    add_bos: bool  # prepend bos_id to every prompt that does not start with it
    chat_template: Optional[str]  # Jinja2 source


def read_special_tokens(settings: Any, folder: Path, model_dir: Path, tokenizer) -> SpecialTokens:
    """`settings`: CausalLMSettings; `folder`: where the tokenizer file and the model's files are;
    `model_dir`: the archive's folder (a chat_template setting names a file there)."""
    files = _ModelFiles(folder, tokenizer, settings.tokenizer)
    eos_ids, eos_text = _eos(settings, files)
    bos_id, bos_text, post_bos = _bos(settings, files)
    add_bos = settings.add_bos
    if add_bos is None:
        flag = files.value("tokenizer_config.json", "add_bos_token")
        if flag is not None and not isinstance(flag, bool):
            raise ConfigError(f"{files.where('tokenizer_config.json')} add_bos_token: expected true or false, got "
                              f"{flag!r}: set causal_lm.add_bos")
        add_bos = flag if flag is not None else post_bos is not None
    if add_bos and bos_id is None:
        raise ConfigError("causal_lm.bos_token: prompts start with a start token (add_bos) but none is in the "
                          "model's files: set causal_lm.bos_token, or causal_lm.add_bos: false")
    return SpecialTokens(eos_ids, eos_text, bos_id, bos_text, add_bos, _template(settings, files, model_dir))


class _ModelFiles:
    """The JSON files beside the tokenizer, read once each (a missing file reads as {})."""

    def __init__(self, folder: Path, tokenizer, tokenizer_name: str) -> None:
        self.folder, self.tokenizer, self.tokenizer_name = folder, tokenizer, tokenizer_name
        self._read: dict = {}

    def where(self, name: str) -> str:
        return f"the model's {name}"

    def json(self, name: str) -> Mapping[str, Any]:
        if name not in self._read:
            path = self.folder / name
            try:
                data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
            except (OSError, ValueError) as err:
                raise ConfigError(f"{self.where(name)} does not read as JSON: {err}") from None
            if not isinstance(data, Mapping):
                raise ConfigError(f"{self.where(name)}: expected a JSON object")
            self._read[name] = data
        return self._read[name]

    def value(self, name: str, key: str) -> Any:
        return self.json(name).get(key)

    def ids(self, name: str, key: str, fix: str) -> tuple[int, ...]:
        """An id or a list of ids (empty when absent), each a token of the tokenizer."""
        raw = self.value(name, key)
        found = [] if raw is None else raw if isinstance(raw, list) else [raw]
        for token in found:
            if isinstance(token, bool) or not isinstance(token, int) or self.tokenizer.id_to_token(token) is None:
                raise ConfigError(f"{self.where(name)} {key}: {token!r} is not a token id of {self.tokenizer_name}: "
                                  f"set {fix}")
        return tuple(dict.fromkeys(found))

    def token(self, name: str, key: str) -> Optional[str]:
        """A token's text: a string, or an added-token object {"content": ...}; None when absent."""
        raw = self.value(name, key)
        if isinstance(raw, Mapping):
            raw = raw.get("content")
        return raw if isinstance(raw, str) and raw else None

    def id_of(self, text: str, where: str, fix: str) -> int:
        found = self.tokenizer.token_to_id(text)
        if found is None:
            raise ConfigError(f"{where}: {text!r} is not in {self.tokenizer_name}" + (f": set {fix}" if fix else ""))
        return int(found)


TOKEN_FILES = ("tokenizer_config.json", "special_tokens_map.json")


def _eos(settings: Any, files: _ModelFiles) -> tuple[tuple[int, ...], str]:
    if settings.eos_token is not None or settings.eos_tokens is not None:
        key = "eos_token" if settings.eos_token is not None else "eos_tokens"
        texts = (settings.eos_token,) if settings.eos_token is not None else settings.eos_tokens
        ids = tuple(dict.fromkeys(files.id_of(text, f"causal_lm.{key}", "") for text in texts))
        return ids, texts[0]
    fix = "causal_lm.eos_token (or eos_tokens)"
    named = next(((name, text) for name in TOKEN_FILES for text in [files.token(name, "eos_token")] if text), None)
    ids = files.ids("generation_config.json", "eos_token_id", fix)
    if not ids and named is not None:
        ids = (files.id_of(named[1], f"{files.where(named[0])} eos_token", fix),)
    ids = ids or files.ids("config.json", "eos_token_id", fix)
    if not ids:
        raise ConfigError("causal_lm.eos_token: the model's files name no end-of-text token (eos_token_id in "
                          "generation_config.json or config.json, eos_token in tokenizer_config.json or "
                          "special_tokens_map.json): set causal_lm.eos_token to the token that ends a sequence")
    # A chat template writes the tokenizer's own end token (as transformers does), else the first end id's.
    return ids, named[1] if named is not None else files.tokenizer.id_to_token(ids[0])


def _bos(settings: Any, files: _ModelFiles) -> tuple[Optional[int], Optional[str], Optional[int]]:
    """(start id, its text, the id tokenizer.json's post-processor puts first or None)."""
    post = _post_processor_first(files.tokenizer)
    if settings.bos_token is not None:
        return files.id_of(settings.bos_token, "causal_lm.bos_token", ""), settings.bos_token, post
    fix = "causal_lm.bos_token"
    named = next(((name, text) for name in TOKEN_FILES for text in [files.token(name, "bos_token")] if text), None)
    ids = files.ids("generation_config.json", "bos_token_id", fix)
    if not ids and named is not None:
        ids = (files.id_of(named[1], f"{files.where(named[0])} bos_token", fix),)
    ids = ids or files.ids("config.json", "bos_token_id", fix) or ((post,) if post is not None else ())
    if len(ids) > 1:
        raise ConfigError(f"the model's files name several start tokens {list(ids)}: set {fix}")
    if not ids:
        return None, named[1] if named is not None else None, post
    return ids[0], named[1] if named is not None else files.tokenizer.id_to_token(ids[0]), post


def _post_processor_first(tokenizer) -> Optional[int]:
    """The id tokenizer.json's post-processor puts before a text's own tokens, or None."""
    plain = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a", add_special_tokens=True).ids
    if len(full) > len(plain) and full[1:1 + len(plain)] == plain:
        return int(full[0])
    return None


def _template(settings: Any, files: _ModelFiles, model_dir: Path) -> Optional[str]:
    if settings.chat_template is not None:
        path = (Path(model_dir) / settings.chat_template).resolve()
        inside = path.is_relative_to(Path(model_dir).resolve())
        if "\n" not in settings.chat_template and inside and path.is_file():
            return _checked(path.read_text(encoding="utf-8"), f"causal_lm.chat_template ({settings.chat_template})")
        if "{{" in settings.chat_template or "{%" in settings.chat_template:
            return _checked(settings.chat_template, "causal_lm.chat_template")
        raise ConfigError(f"causal_lm.chat_template: {settings.chat_template!r} is neither a file in the archive "
                          "(extra_files puts one there) nor a Jinja2 template")
    path = files.folder / "chat_template.jinja"
    if path.is_file():
        return _checked(path.read_text(encoding="utf-8"), files.where("chat_template.jinja"))
    raw = files.value("tokenizer_config.json", "chat_template")
    where = f"{files.where('tokenizer_config.json')} chat_template"
    if raw is None or isinstance(raw, str):
        return None if raw is None else _checked(raw, where)
    if isinstance(raw, list) and all(isinstance(t, Mapping) and isinstance(t.get("template"), str) for t in raw):
        named = {t.get("name"): t["template"] for t in raw}
        if "default" in named:
            return _checked(named["default"], where)
        raise ConfigError(f"{where}: templates named {sorted(map(str, named))}, none 'default': set "
                          "causal_lm.chat_template to the one to use")
    raise ConfigError(f"{where}: expected a string or a list of {{name, template}}: set causal_lm.chat_template")


def _checked(source: str, where: str) -> str:
    """The template, parsed once here so a syntax error stops the build, not a chat request."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
    except jinja2.TemplateSyntaxError as err:
        raise ConfigError(f"{where}: not a Jinja2 template: {err.message} (line {err.lineno})") from None
    return source
