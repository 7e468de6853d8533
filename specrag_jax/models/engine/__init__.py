"""The engine core, one for offline calls and the server: a continuous-batching step loop over a model's page pool.

``engine`` (``Engine``: the loop, on its own thread or driven by the caller), ``state`` (what the step builders
work on), ``steps`` / ``spec_steps`` (build and dispatch one step), ``rules`` (phases, results, the stop rule,
the prompt check), ``admission``, ``prefix_cache`` (radix), ``policy`` (token budget, buckets, backpressure),
``requests`` (request and sequence records, errors), ``context`` (a caller's deadline and cancellation),
``warmup`` (compile every reachable step shape), ``per_model`` (one engine per model, shared by its roles).
"""

from specrag_jax.lazy_exports import lazy_exports

_EXPORTS = {
    "engine": ("Engine",),
    "policy": ("SchedulerConfig",),
    "context": ("RequestContext",),
    "rules": ("GenerationResult", "Phase"),
    "requests": ("EngineError", "Request", "Tree"),
    "warmup": ("WarmupReport", "warmup"),
    "per_model": ("engine_per_model", "distinct_engines"),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
