"""Tokenizers for the supported models: one small interface, built from a GGUF header or an HF folder.

`load_tokenizer("gemma3-270m")` builds a SentencePiece tokenizer from the GGUF vocabulary (see
tokenizer_spm.py); `load_tokenizer("smollm2-135m-instruct")` a byte-level BPE one with the `tokenizers`
library (see tokenizer_bpe.py). Control tokens written literally in the text (`<start_of_turn>`,
`<|im_start|>`, `<bos>`) are split out first and mapped to their ids; the text between them is encoded
normally. Chat prompts are rendered with the model's jinja2 chat template.
"""

from __future__ import annotations

import abc
import functools
import json
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specrag_jax.errors import SpecRagError
from specrag_jax.models.tokenizer_gguf import read_gguf_tokenizer_metadata

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

    def _init_special(self, special_tokens: dict[str, int]) -> None:
        """Remember the control tokens and compile the pattern that finds them in text."""
        self.special_tokens = dict(special_tokens)
        self._special_ids = frozenset(special_tokens.values())
        self._special_re = _literal_pattern(special_tokens) if special_tokens else None

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

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Ids of `text`; control tokens written in it become their ids. `add_bos` prepends BOS."""
        if not isinstance(text, str):
            raise SpecRagError(f"encode() needs a str, got {type(text).__name__}")
        ids: list[int] = [self.bos_id] if add_bos and self.bos_id is not None else []
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
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=bos, eos_token=eos, **kwargs,
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


# --- loading ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def load_tokenizer(path_or_name: str) -> Tokenizer:
    """The tokenizer of a known model name, a .gguf file, or an HF folder (tokenizer.json / tokenizer.model).

    Cached per name and per resolved path, so a name and its file share one tokenizer object.
    """
    from specrag_jax.models.registry import resolve_model_path

    return _load_path(str(resolve_model_path(str(path_or_name)).resolve()))


@functools.lru_cache(maxsize=8)
def _load_path(path_str: str) -> Tokenizer:
    path = Path(path_str)
    if path.is_dir():
        return _load_hf_dir(path)
    meta = read_gguf_tokenizer_metadata(path)
    model = meta.get("tokenizer.ggml.model")
    if model == "llama":
        from specrag_jax.models.tokenizer_spm import spm_from_gguf

        return spm_from_gguf(meta)
    if model == "gpt2":
        from specrag_jax.models.tokenizer_bpe import bpe_from_gguf

        return bpe_from_gguf(meta)
    raise SpecRagError(
        f"unsupported tokenizer model {model!r} in {path} (supported: 'llama' SentencePiece, 'gpt2' BPE)"
    )


def _load_hf_dir(path: Path) -> Tokenizer:
    """An HF tokenizer folder: tokenizer.json (preferred) or a SentencePiece tokenizer.model."""
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    template_file = path / "chat_template.jinja"
    if template_file.is_file():
        config["chat_template"] = template_file.read_text(encoding="utf-8")
    if (path / "tokenizer.json").is_file():
        from specrag_jax.models.tokenizer_bpe import hf_json_tokenizer

        return hf_json_tokenizer(path / "tokenizer.json", config)
    if (path / "tokenizer.model").is_file():
        from specrag_jax.models.tokenizer_spm import spm_from_model_file

        return spm_from_model_file(path / "tokenizer.model", config)
    raise SpecRagError(f"{path} holds neither tokenizer.json nor tokenizer.model")


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
