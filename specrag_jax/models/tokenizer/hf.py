"""Hugging Face tokenizer folders, with the special tokens transformers (5.x) adds to an encoded text.

What ``AutoTokenizer.from_pretrained(folder)(text)["input_ids"]`` puts around the text:

- tokenizer.json present: its ``post_processor`` alone decides (TemplateProcessing as in Llama 3's
  ``<|begin_of_text|> $A`` or Mistral's ``<s> $A``, Bert/Roberta processing, ByteLevel which adds
  nothing). transformers drops tokenizer_config.json's ``add_bos_token``/``add_eos_token`` when a
  tokenizer.json exists, and a null post-processor adds nothing. We read the template by encoding a
  probe text with the post-processor and keeping the tokens it added (``sequence_ids`` None).
- tokenizer.model only (SentencePiece): tokenizer_config.json's ``add_bos_token`` and ``add_eos_token``,
  both False when absent (transformers 5's default; 4.x's LlamaTokenizer defaulted BOS to True).

BOS is tokenizer_config.json's ``bos_token``, else the single token the template puts first. The named
special tokens of tokenizer_config.json (bos, eos, unk, pad and extra ones) are split out of the text
like transformers' added special tokens, when the vocabulary has them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as pb
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from specrag_jax.errors import SpecRagError
from specrag_jax.models.tokenizer.base import Tokenizer, chat_template_from_config, end_of_turn_ids, special_token_text
from specrag_jax.models.tokenizer.bpe import HFTokenizersTokenizer
from specrag_jax.models.tokenizer.spm import CONTROL, SentencePieceTokenizer

_PROBES = ("a", "hello", "0", "x y", " ")
_NAMED = ("bos_token", "eos_token", "unk_token", "pad_token")


def hf_folder_tokenizer(path: Path) -> Tokenizer:
    """An HF tokenizer folder: tokenizer.json (preferred) or a SentencePiece tokenizer.model."""
    config_file = path / "tokenizer_config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    except ValueError as exc:
        raise SpecRagError(f"cannot read {config_file}: {exc}") from None
    template_file = path / "chat_template.jinja"
    if template_file.is_file():
        config["chat_template"] = template_file.read_text(encoding="utf-8")
    if (path / "tokenizer.json").is_file():
        return hf_json_tokenizer(path / "tokenizer.json", config)
    if (path / "tokenizer.model").is_file():
        return spm_from_model_file(path / "tokenizer.model", config)
    raise SpecRagError(f"{path} holds neither tokenizer.json nor tokenizer.model")


def post_processor_template(backend: HFTokenizer) -> tuple[list[int], list[int]]:
    """(prefix, suffix): the ids the backend's post-processor adds around one sequence."""
    if backend.post_processor is None:
        return [], []
    for probe in _PROBES:
        enc = backend.encode(probe, add_special_tokens=True)
        inside = [i for i, s in enumerate(enc.sequence_ids) if s is not None]
        if inside:
            return list(enc.ids[: inside[0]]), list(enc.ids[inside[-1] + 1 :])
    return list(backend.encode("", add_special_tokens=True).ids), []


def _named_special(config: dict[str, Any]) -> list[str]:
    """Texts of tokenizer_config.json's named and extra special tokens."""
    names = [special_token_text(config.get(n)) for n in _NAMED]
    for key in ("additional_special_tokens", "extra_special_tokens"):
        extra = config.get(key) or []
        names += [special_token_text(v) for v in (extra.values() if isinstance(extra, dict) else extra)]
    names += [
        special_token_text(e)
        for e in (config.get("added_tokens_decoder") or {}).values()
        if isinstance(e, dict) and e.get("special")
    ]
    return [n for n in names if n]


def hf_json_tokenizer(path: Path, config: dict[str, Any]) -> HFTokenizersTokenizer:
    """An HF folder's tokenizer.json, with tokenizer_config.json's special tokens and chat template."""
    try:
        backend = HFTokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on a bad file
        raise SpecRagError(f"cannot load {path}: {exc}") from exc
    special = {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    added = {t.content for t in backend.get_added_tokens_decoder().values()}
    for text in _named_special(config):  # transformers registers these as added special tokens
        if backend.token_to_id(text) is not None:
            special[text] = backend.token_to_id(text)
            if text not in added:
                backend.add_special_tokens([AddedToken(text, special=True, normalized=False)])

    def lookup(name: str) -> int | None:
        text = special_token_text(config.get(name))
        return backend.token_to_id(text) if text is not None else None

    prefix, suffix = post_processor_template(backend)
    bos = lookup("bos_token")
    if bos is None and len(prefix) == 1:
        bos = prefix[0]
    tok = HFTokenizersTokenizer(
        backend,
        bos_id=bos,
        pad_id=lookup("pad_token"),
        eos_ids=end_of_turn_ids([lookup("eos_token")], special.get),
        add_bos_default=False,
        chat_template=chat_template_from_config(config),
        special_tokens=special,
        backend_splits=True,
    )
    tok.set_special_template(prefix, suffix)
    return tok


class FolderSentencePieceTokenizer(SentencePieceTokenizer):
    """A folder's tokenizer.model as transformers 5 runs it (Metaspace ``prepend_scheme="first"``): the
    dummy-prefix space only at the start of the text and only if it does not start with a space, never
    again after a control token (SentencePiece would add it to every piece)."""

    def __init__(self, proto: pb.ModelProto, **kwargs: Any) -> None:
        super().__init__(proto, **kwargs)
        plain = pb.ModelProto()
        plain.CopyFrom(proto)
        plain.normalizer_spec.add_dummy_prefix = False
        self._no_prefix = spm.SentencePieceProcessor(model_proto=plain.SerializeToString())

    def _encode_text(self, text: str) -> list[int]:
        ids: list[int] = []
        start = 0
        matches = self._special_re.finditer(text) if self._special_re is not None else ()
        for match in (*matches, None):
            end = len(text) if match is None else match.start()
            if end > start:
                processor = self.processor if start == 0 and not text.startswith(" ") else self._no_prefix
                ids += processor.encode(text[start:end], out_type=int)
            if match is not None:
                ids.append(self.special_tokens[match.group()])
                start = match.end()
        return ids


def spm_from_model_file(path: Path, config: dict[str, Any]) -> SentencePieceTokenizer:
    """A tokenizer.model from an HF folder, with tokenizer_config.json's special tokens and template."""
    proto = pb.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as exc:  # protobuf raises its own DecodeError
        raise SpecRagError(f"{path} is not a SentencePiece model: {exc}") from exc
    special = {p.piece: i for i, p in enumerate(proto.pieces) if p.type == CONTROL}
    pieces = {p.piece: i for i, p in enumerate(proto.pieces)}

    def lookup(name: str) -> int | None:
        text = special_token_text(config.get(name))
        return pieces.get(text) if text is not None else None

    bos = lookup("bos_token")
    if bos is None and proto.trainer_spec.bos_id >= 0:
        bos = proto.trainer_spec.bos_id
    eos = lookup("eos_token")
    if eos is None and proto.trainer_spec.eos_id >= 0:
        eos = proto.trainer_spec.eos_id
    for text in _named_special(config):
        if text in pieces:
            special[text] = pieces[text]
    tok = FolderSentencePieceTokenizer(
        proto,
        bos_id=bos,
        eos_ids=end_of_turn_ids([eos], special.get),
        pad_id=lookup("pad_token"),
        add_bos_default=False,
        chat_template=chat_template_from_config(config),
        special_tokens=special,
    )
    prefix = [bos] if config.get("add_bos_token", False) and bos is not None else []
    suffix = [eos] if config.get("add_eos_token", False) and eos is not None else []
    tok.set_special_template(prefix, suffix)
    return tok
