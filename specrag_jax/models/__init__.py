"""Model execution: weights, tokenizers, the Flax decoder, sampling, speculation and the step executor.

What a newcomer needs first is at this level: ``config`` (``ModelConfig``, the per-architecture table),
``text_model`` (``TextModel``: load a model by name and generate text) and ``generation`` (``Generator``:
the synchronous face of the engine). The rest is in subpackages:

- ``engine/``: the one continuous-batching core of offline calls and the server (step loop, scheduler state,
  step builders, admission, radix prefix cache, warm-up);

- ``decoder/``: the Flax decoder (``layers``, ``transformer``, ``moe``) and its output head (``scoring``);
- ``loading/``: names, GGUF and Hugging Face files -> parameters, through the converted-weights cache;
- ``tokenizer/``: SentencePiece and byte-level BPE tokenizers from GGUF headers or HF folders;
- ``sampling/``: ``SamplingParams``, their per-step batch, penalties and the jitted sampler;
- ``speculative/``: token trees, lossless acceptance, the fused verification step, proposers;
- ``executor/``: ``ModelRunner`` (parameters, KV pool, jitted steps), packing, stored exported steps, K/V
  transfer, the placement protocol, step costs.

Each package lists its public names in ``_EXPORTS``; they are imported on first use, so importing one module
(the CLI reads ``loading.registry``) never imports the whole engine.
"""

from specrag_jax.lazy_exports import lazy_exports

_EXPORTS = {
    "config": ("ModelConfig", "tiny_config"),
    "text_model": ("TextModel", "TextResult"),
    "generation": ("GenerationResult", "Generator", "Phase", "greedy_generate"),
    "engine.engine": ("Engine",),
    "sampling.params": ("SamplingParams",),
    "loading.load": ("load_model_params",),
    "loading.registry": ("KNOWN_MODELS", "resolve_model_path"),
    "tokenizer.base": ("Tokenizer",),
    "tokenizer.load": ("load_tokenizer",),
    "speculative.decode": ("Speculation", "SpeculationStats"),
    "executor.runner": ("ModelRunner",),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
