"""Drafter training data: JSON lines holding the exact drafter prompt and the text it should write.

Format, one JSON object per line (other fields, e.g. ``id`` or ``question``, are ignored)::

    {"prompt": "<rendered drafter prompt>", "target": "<rationale> ... ## Response: <answer>"}

- ``prompt`` (str, required): exactly what the drafter reads at inference, chat template already applied,
  ending where the drafter starts writing (after the forced ``## Rationale:``). It is tokenized with
  ``tokenizer.encode_rendered`` (BOS per the tokenizer, never doubled).
- ``prompt_ids`` (list of int, optional): the prompt's token ids as inference built them; when present they
  are used instead of tokenizing ``prompt`` (inference encodes the shared prefix and each draft's suffix
  separately, so this is the way to make training and inference ids identical to the token).
- ``target`` (str, required, non-empty): what the drafter should write after the prompt (rationale, then
  ``## Response:`` and the answer). Tokenized without BOS; the end-of-sequence token is appended.
- ``target_ids`` (list of int, optional): the target's ids, used instead of tokenizing ``target``.

``specrag make-drafter-data`` (``drafter_data/examples.py``) writes all four fields.

The loss covers the target tokens (and the appended EOS) only; prompt tokens are context.

Bad input: a line that is not a JSON object, lacks ``prompt``/``target``, has a wrong type or an empty target
is **refused** (one error naming the file, the line and the field: a broken producer should not be trained on
half its output). An example longer than ``max_len`` tokens is **skipped** and counted (the first line numbers
are reported), or refused with ``on_long="refuse"``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from specrag_jax.errors import SpecRagError

if TYPE_CHECKING:  # any object with encode / encode_rendered / vocab_size
    from specrag_jax.models.tokenizer.base import Tokenizer

REQUIRED_FIELDS = ("prompt", "target")


@dataclasses.dataclass(frozen=True)
class Example:
    """One tokenized example: ``prompt_ids`` are context, ``target_ids`` (EOS included) carry the loss."""

    prompt_ids: np.ndarray
    target_ids: np.ndarray
    line: int = 0  # 1-based line in the data file (0: built in memory)

    @property
    def length(self) -> int:
        return int(len(self.prompt_ids) + len(self.target_ids))


@dataclasses.dataclass(frozen=True)
class LoadedData:
    """The examples kept and what was skipped (line numbers of over-long examples)."""

    examples: list[Example]
    skipped_long: list[int]
    path: str = ""

    def summary(self) -> str:
        note = f"{len(self.examples)} examples from {self.path or 'memory'}"
        if self.skipped_long:
            lines = ", ".join(map(str, self.skipped_long[:5])) + (" ..." if len(self.skipped_long) > 5 else "")
            note += f"; skipped {len(self.skipped_long)} over-long (lines {lines})"
        return note


def _field(obj: dict, name: str, where: str) -> str:
    if name not in obj:
        raise SpecRagError(f"{where}: missing field {name!r} (each line needs {', '.join(REQUIRED_FIELDS)})")
    value = obj[name]
    if not isinstance(value, str):
        raise SpecRagError(f"{where}: field {name!r} must be a string, got {type(value).__name__}")
    return value


def _ids(obj: dict, name: str, tokenizer: Tokenizer, where: str) -> list[int] | None:
    """The optional ``<name>_ids`` list, validated (None when absent)."""
    ids = obj.get(f"{name}_ids")
    if ids is None:
        return None
    ok = isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    if not ok or any(not 0 <= i < tokenizer.vocab_size for i in ids):
        raise SpecRagError(f"{where}: field '{name}_ids' must be a list of token ids below {tokenizer.vocab_size}")
    return ids


def tokenize_example(obj: dict, tokenizer: Tokenizer, eos_id: int, where: str = "example", line: int = 0) -> Example:
    """Validate one record and tokenize it (see the module docstring for the rules)."""
    if not isinstance(obj, dict):
        raise SpecRagError(f"{where}: expected a JSON object with fields {', '.join(REQUIRED_FIELDS)}")
    prompt_text, target = _field(obj, "prompt", where), _field(obj, "target", where)
    prompt = _ids(obj, "prompt", tokenizer, where)
    if prompt is None:
        prompt = tokenizer.encode_rendered(prompt_text) if prompt_text else []
    if not prompt:
        raise SpecRagError(f"{where}: field 'prompt' is empty")
    target_ids = _ids(obj, "target", tokenizer, where)
    if target_ids is None:
        target_ids = tokenizer.encode(target, add_bos=False) if target.strip() else []
    if not target_ids:
        raise SpecRagError(f"{where}: field 'target' is empty (nothing to learn)")
    target_ids = list(target_ids) + [eos_id]
    return Example(np.asarray(prompt, np.int32), np.asarray(target_ids, np.int32), line)


def build_examples(
    records: Sequence[dict] | Sequence[tuple[int, dict]],
    tokenizer: Tokenizer,
    eos_id: int,
    max_len: int,
    on_long: str = "skip",
    path: str = "",
) -> LoadedData:
    """Tokenize records (or ``(line, record)`` pairs); over-long ones are skipped (noted) or refused."""
    if on_long not in ("skip", "refuse"):
        raise SpecRagError(f"on_long must be 'skip' or 'refuse' (got {on_long!r})")
    numbered = [r if isinstance(r, tuple) else (i, r) for i, r in enumerate(records, start=1)]
    kept, skipped = [], []
    for line, obj in numbered:
        where = f"{path or 'data'}:{line}"
        ex = tokenize_example(obj, tokenizer, eos_id, where, line=line)
        if ex.length > max_len:
            if on_long == "refuse":
                raise SpecRagError(
                    f"{where}: example has {ex.length} tokens, over the limit of {max_len} "
                    f"(raise --max-len or shorten the prompt)"
                )
            skipped.append(line)
            continue
        kept.append(ex)
    if not kept:
        why = f"all {len(skipped)} are longer than {max_len} tokens" if skipped else "it holds no examples"
        raise SpecRagError(f"no training examples in {path or 'the data'}: {why}")
    return LoadedData(kept, skipped, path)


def read_records(path: str | Path) -> list[tuple[int, dict]]:
    """``(line, record)`` of a JSON-lines file (blank lines skipped); errors name the file and line."""
    p = Path(path)
    if not p.is_file():
        raise SpecRagError(f"training data file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecRagError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    records: list[tuple[int, dict]] = []
    for i, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            records.append((i, json.loads(raw)))
        except json.JSONDecodeError as exc:
            raise SpecRagError(f"{p}:{i}: not valid JSON ({exc.msg})") from None
    return records


def load_examples(
    path: str | Path, tokenizer: Tokenizer, eos_id: int, max_len: int, on_long: str = "skip"
) -> LoadedData:
    """Read and tokenize a training file."""
    return build_examples(read_records(path), tokenizer, eos_id, max_len, on_long, str(path))


def split_holdout(examples: Sequence[Example], fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """(train, held-out) by a seeded permutation; at least one of each when there are two or more examples."""
    if not 0.0 <= fraction < 1.0:
        raise SpecRagError(f"eval fraction must be in [0, 1) (got {fraction})")
    n = len(examples)
    n_eval = 0 if fraction == 0.0 or n < 2 else min(n - 1, max(1, round(fraction * n)))
    order = np.random.default_rng([seed, 7919]).permutation(n)
    held = sorted(order[:n_eval].tolist())
    held_set = set(held)
    return [examples[i] for i in range(n) if i not in held_set], [examples[i] for i in held]
