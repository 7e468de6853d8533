"""The tokenizer interface every family implements, and the helpers the family modules share.

Control tokens written literally in the text (`<start_of_turn>`, `<|im_start|>`, `<bos>`) are split out
first and mapped to their ids; the text between them is encoded normally. ``encode(text,
add_special_tokens=True)`` then wraps the ids in the tokenizer's special-token template (``prefix_ids`` +
ids + ``suffix_ids``), as transformers' ``tokenizer(text)`` does. Chat prompts are rendered with the
model's jinja2 chat template.
"""

from __future__ import annotations

import abc
import functools
import json
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specrag_jax.errors import SpecRagError

# Gemma's standard chat template (the one its HF tokenizer_config carries): a system message is folded
# into the first user turn, assistant turns are called "model", and the prompt starts with <bos>.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}"
    "{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}"
    "{{ raise_exception('Invalid content type') }}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
FALLBACK_CHAT_TEMPLATES = {"gemma3": GEMMA_CHAT_TEMPLATE, "gemma2": GEMMA_CHAT_TEMPLATE, "gemma": GEMMA_CHAT_TEMPLATE}

# Control tokens that end a turn: generation stops on them as on EOS (llama.cpp's end-of-generation set).
END_OF_TURN_TOKENS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>", "<|return|>")


class Tokenizer(abc.ABC):
    """Text <-> token ids for one model, plus its special ids and chat template."""

    bos_id: int | None
    eos_ids: tuple[int, ...]
    pad_id: int | None
    vocab_size: int
    add_bos_default: bool
    chat_template: str | None
    special_tokens: dict[str, int]  # control tokens split out of the text before encoding
    _template: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # see set_special_template

    def _init_special(self, special_tokens: dict[str, int]) -> None:
        """Remember the control tokens and compile the pattern that finds them in text."""
        self.special_tokens = dict(special_tokens)
        self._special_ids = frozenset(special_tokens.values())
        self._special_re = _literal_pattern(special_tokens) if special_tokens else None

    def set_special_template(self, prefix: Sequence[int], suffix: Sequence[int] = ()) -> None:
        """The ids ``add_special_tokens=True`` puts around a text (transformers' post-processor of one
        sequence); ``add_bos_default`` follows: True when the prefix starts with BOS."""
        self._template = (tuple(int(i) for i in prefix), tuple(int(i) for i in suffix))
        self.add_bos_default = bool(prefix) and self.bos_id is not None and int(prefix[0]) == self.bos_id

    @property
    def prefix_ids(self) -> tuple[int, ...]:
        """Ids before the text under ``add_special_tokens=True`` (default: BOS per ``add_bos_default``)."""
        if self._template is not None:
            return self._template[0]
        return (self.bos_id,) if self.add_bos_default and self.bos_id is not None else ()

    @property
    def suffix_ids(self) -> tuple[int, ...]:
        """Ids after the text under ``add_special_tokens=True`` (an EOS where the template appends one)."""
        return self._template[1] if self._template is not None else ()

    @abc.abstractmethod
    def _encode_plain(self, text: str) -> list[int]:
        """Ids of text that holds no control token."""

    @abc.abstractmethod
    def _decode_plain(self, ids: Sequence[int]) -> str:
        """Text of ids that hold no control token."""

    @abc.abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary entry spelled as the model spells it, or None."""

    @abc.abstractmethod
    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry for an id, as the model spells it."""

    def encode(self, text: str, add_bos: bool = False, add_special_tokens: bool = False) -> list[int]:
        """Ids of `text`; control tokens written in it become their ids. `add_bos` prepends BOS;
        `add_special_tokens` wraps the ids in ``prefix_ids`` and ``suffix_ids`` as transformers does."""
        if not isinstance(text, str):
            raise SpecRagError(f"encode() needs a str, got {type(text).__name__}")
        if add_special_tokens:
            return [*self.prefix_ids, *self.encode(text), *self.suffix_ids]
        ids: list[int] = [self.bos_id] if add_bos and self.bos_id is not None else []
        return ids + self._encode_text(text)

    def _encode_text(self, text: str) -> list[int]:
        """Ids of `text` with no special tokens added: control tokens split out, the rest encoded plainly."""
        ids: list[int] = []
        start = 0
        if self._special_re is not None:
            for match in self._special_re.finditer(text):
                if match.start() > start:
                    ids += self._encode_plain(text[start : match.start()])
                ids.append(self.special_tokens[match.group()])
                start = match.end()
        if start < len(text):
            ids += self._encode_plain(text[start:])
        return ids

    def encode_rendered(self, text: str) -> list[int]:
        """Ids of a prompt rendered by a chat template: BOS per ``add_bos_default``, not doubled when the
        template already wrote it."""
        ids = self.encode(text, add_bos=False)
        if self.add_bos_default and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: Sequence[int] | Iterable[int], skip_special: bool = True) -> str:
        """Text of `ids`; control tokens are dropped, or written literally with skip_special=False."""
        ids = [int(i) for i in ids]
        for token_id in ids:
            if not 0 <= token_id < self.vocab_size:
                raise SpecRagError(f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})")
        parts: list[str] = []
        run: list[int] = []
        for token_id in ids:
            if token_id in self._special_ids:
                if run:
                    parts.append(self._decode_plain(run))
                    run = []
                if not skip_special:
                    parts.append(self.id_to_token(token_id))
            else:
                run.append(token_id)
        if run:
            parts.append(self._decode_plain(run))
        return "".join(parts)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render `messages` ([{"role", "content"}, ...]) as a prompt string with the chat template."""
        if not self.chat_template:
            raise SpecRagError("this tokenizer has no chat template")
        bos = self.id_to_token(self.bos_id) if self.bos_id is not None else ""
        eos = self.id_to_token(self.eos_ids[0]) if self.eos_ids else ""
        try:
            return _compile_template(self.chat_template).render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=bos,
                eos_token=eos,
                **kwargs,
            )
        except TemplateError as exc:
            raise SpecRagError(f"chat template failed: {exc}") from exc


def _literal_pattern(tokens: Iterable[str]) -> re.Pattern[str]:
    """A regex that matches any of `tokens`, longest first, built as a trie so thousands stay fast."""
    trie: dict[str, Any] = {}
    for token in tokens:
        node = trie
        for char in token:
            node = node.setdefault(char, {})
        node[""] = True

    def render(node: dict[str, Any]) -> str:
        branches = [re.escape(char) + render(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return re.compile(render(trie))


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


@functools.lru_cache(maxsize=16)
def _compile_template(source: str) -> Any:
    """A jinja2 template in a sandbox, with the helpers HF chat templates use."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda value, indent=None, **_: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise SpecRagError(f"chat template does not parse: {exc}") from exc


def chat_template_from_config(config: dict[str, Any]) -> str | None:
    """tokenizer_config.json's chat template: a string, or the "default" of a list of named ones."""
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def special_token_text(value: Any) -> str | None:
    """The text of a special token in tokenizer_config.json (a string or an {"content": ...} dict)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def end_of_turn_ids(eos: Iterable[int | None], lookup: Any) -> tuple[int, ...]:
    """EOS ids first, then the ids of END_OF_TURN_TOKENS that the vocabulary holds, without repeats."""
    ids = [i for i in eos if i is not None]
    ids += [i for i in (lookup(t) for t in END_OF_TURN_TOKENS) if i is not None]
    return tuple(dict.fromkeys(ids))


def gguf_template(meta: dict[str, Any], add_bos: bool) -> tuple[list[int], list[int]]:
    """(prefix, suffix) of a GGUF vocabulary as llama.cpp applies it: BOS per ``add_bos``, EOS per
    ``tokenizer.ggml.add_eos_token``."""
    bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    prefix = [int(bos)] if add_bos and bos is not None else []
    suffix = [int(eos)] if meta.get("tokenizer.ggml.add_eos_token", False) and eos is not None else []
    return prefix, suffix
