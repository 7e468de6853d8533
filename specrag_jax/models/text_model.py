"""TextModel: a loaded model + tokenizer + runner, generating text with stop strings and timings."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

from specrag_jax.errors import SpecRagError
from specrag_jax.models.config import ModelConfig
from specrag_jax.models.executor.placement_api import StepPlacement
from specrag_jax.models.executor.runner import ModelRunner
from specrag_jax.models.generation import GenerationResult, Generator
from specrag_jax.models.loading.load import load_model_params
from specrag_jax.models.loading.registry import instruction_tuned
from specrag_jax.models.sampling.params import SamplingParams
from specrag_jax.models.speculative.decode import Speculation, SpeculationStats
from specrag_jax.models.tokenizer.base import Tokenizer
from specrag_jax.models.tokenizer.detokenize import IncrementalDetokenizer
from specrag_jax.models.tokenizer.load import load_tokenizer


@dataclasses.dataclass
class TextResult:
    """One generated continuation."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    num_prompt_tokens: int
    prefill_s: float
    decode_s: float
    speculation: SpeculationStats | None = None  # decode-phase counts when generated with speculation
    prefill_compile_s: float = 0.0  # of prefill_s, one-time XLA work (a program compiled or loaded)
    decode_compile_s: float = 0.0  # of decode_s, the same


def _cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


class TextModel:
    """Everything needed to turn prompts into text with one model."""

    def __init__(
        self,
        name: str,
        runner: ModelRunner,
        tokenizer: Tokenizer,
        load_s: float = 0.0,
        instruct: bool = False,
        generator: Generator | None = None,
    ) -> None:
        """``generator``: the engine it generates through (default: an engine of its own, driven by the caller)."""
        self.name = name
        self.runner = runner
        self.tokenizer = tokenizer
        self.load_s = load_s
        self.instruct = instruct  # instruction-tuned: RAG prompts go through its chat template
        eos = sorted(set(tokenizer.eos_ids) | set(runner.cfg.eos_token_ids))
        self.generator = generator or Generator(runner, eos, name=name)

    @classmethod
    def load(
        cls,
        name_or_path: str,
        *,
        dtype: str = "float32",
        max_seq_len: int = 2048,
        num_pages: int | None = None,
        page_size: int = 16,
        max_batch: int = 4,
        attention_impl: str = "reference",
        cache: bool = True,
        placement: StepPlacement | None = None,
        transform_params: Callable[[ModelConfig, dict], dict] | None = None,
    ) -> "TextModel":
        """Load weights (GGUF or HF directory, converted once into loading/weights_cache.py) and the tokenizer.

        ``placement``: optional ``specrag_jax.parallel.Placement`` to shard the model over a device mesh.
        ``transform_params(cfg, params)``: applied to the loaded weights before placing them (the pipeline merges
        a trained drafter adapter this way, ``training/lora_merge.py``)."""
        t0 = time.perf_counter()
        shardings = placement.param_shardings if placement is not None else None  # loaded straight into them
        cfg, params = load_model_params(name_or_path, dtype=dtype, cache=cache, shardings=shardings)
        if transform_params is not None:  # e.g. trained adapters merged into the weights (training/lora_merge.py)
            params = transform_params(cfg, params)
        tokenizer = load_tokenizer(name_or_path)
        max_seq_len = min(max_seq_len, cfg.max_position_embeddings)
        if num_pages is None:
            num_pages = max_batch * -(-max_seq_len // page_size) + 1
        runner = ModelRunner(
            cfg,
            params,
            num_pages=num_pages,
            page_size=page_size,
            max_seq_len=max_seq_len,
            attention_impl=attention_impl,
            placement=placement,
        )
        instruct = instruction_tuned(name_or_path, cfg.name) and bool(tokenizer.chat_template)
        return cls(name_or_path, runner, tokenizer, time.perf_counter() - t0, instruct=instruct)

    def encode_prompt(self, prompt: str, chat: bool = False) -> list[int]:
        """Token ids of a prompt: with the special tokens transformers' ``tokenizer(prompt)`` adds (the
        tokenizer's template), or wrapped in the model's chat template (BOS not doubled)."""
        if not prompt:
            raise SpecRagError("empty prompt: nothing to generate from")
        if chat:
            return self.tokenizer.encode_rendered(
                self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
            )
        return self.tokenizer.encode(prompt, add_special_tokens=True)

    def generate(
        self,
        prompts: Sequence[str],
        sampling: SamplingParams = SamplingParams(),
        max_new_tokens: int = 64,
        stop: Sequence[str] = (),
        chat: bool = False,
    ) -> list[TextResult]:
        """Generate for a batch of prompts; text is cut at the first stop string."""
        ids = [self.encode_prompt(p, chat) for p in prompts]
        return self.generate_ids(ids, sampling, max_new_tokens, stop)

    def generate_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
        max_new_tokens: int = 64,
        stop: Sequence[str] = (),
        speculation: Speculation | None = None,
        on_text: Callable[[int, str], None] | None = None,
    ) -> list[TextResult]:
        """Generate from token ids; stop strings are checked on the decoded text as tokens arrive.

        ``speculation``: decode with token-tree speculation (same output as plain greedy decoding, fewer
        verifier steps; sampled output keeps the model's distribution). ``on_text(row, text)``: each row's new text
        as its tokens are accepted (end-of-sequence tokens excluded; text past a stop string is not held back)."""
        stops = [s for s in stop if s]
        decode = self.tokenizer.decode
        streams: dict[int, IncrementalDetokenizer] = {}

        def stream(row: int, out: list[int]) -> None:
            detok = streams.setdefault(row, IncrementalDetokenizer(decode))
            for token in out[len(detok.ids) :]:
                if piece := detok.push(token):
                    on_text(row, piece)

        def stop_fn(row: int, out: list[int]) -> bool:  # called once per accepted token that is not EOS
            if on_text is not None:
                stream(row, out)
            if not stops:
                return False
            tail = decode(out[-16:])  # a stop string is short; look at the recent text only
            return any(s in tail for s in stops)

        results = self.generator.generate(
            prompt_ids, sampling, max_new_tokens, stop_fn if stops or on_text else None, speculation=speculation
        )
        for row, detok in streams.items():
            if rest := detok.flush():
                on_text(row, rest)
        return [self._to_text(r, stops) for r in results]

    def _to_text(self, r: GenerationResult, stops: Sequence[str]) -> TextResult:
        text, _ = _cut_at_stop(self.tokenizer.decode(r.token_ids), stops)
        return TextResult(
            text,
            r.token_ids,
            r.logprobs,
            r.finish_reason,
            r.num_prompt_tokens,
            r.prefill_s,
            r.decode_s,
            r.speculation,
            r.prefill_compile_s,
            r.decode_compile_s,
        )
