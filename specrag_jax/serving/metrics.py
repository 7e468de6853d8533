"""Prometheus metrics: engine gauges read at scrape time, stage latency histograms, request counters."""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from specrag_jax.models.engine.engine import Engine

_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

# name suffix, help, stats key
_GAUGES = [
    ("kv_pages_free", "KV pages free in the pool", "pages_free"),
    ("kv_pages_cached", "KV pages held only by the prefix cache (evictable)", "pages_cached"),
    ("kv_pages_total", "KV pages in the pool (null page excluded)", "pages_total"),
    ("queue_depth", "Requests waiting for admission", "queue_depth"),
    ("running_requests", "Requests admitted and running", "running_requests"),
    ("running_sequences", "Sequences being generated", "running_seqs"),
    (
        "prefix_cache_hit_rate",
        "Prompt tokens served from the prefix cache / prompt tokens looked up",
        "prefix_hit_rate",
    ),
    ("prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache (prefill saved)", "prefix_hit_tokens"),
    ("tokens_per_second", "Generated tokens per second (last 10 s)", "tokens_per_s"),
    ("prefill_chunk_tokens", "Current prefill chunk size (backpressure)", "prefill_chunk"),
    ("generated_tokens", "Generated tokens since start", "generated_tokens"),
    ("steps", "Engine steps since start", "steps"),
    ("speculation_steps", "Speculation (token-tree) steps since start", "spec_steps"),
    ("speculation_proposed_tokens", "Proposed tree nodes verified since start", "spec_proposed"),
    ("speculation_accepted_tokens", "Proposed tokens accepted since start", "spec_accepted"),
    ("speculation_emitted_tokens", "Tokens emitted by speculation steps (accepted + bonus)", "spec_emitted"),
]


class _EngineCollector:
    def __init__(self, engines: Callable[[], dict[str, Engine]]) -> None:
        self.engines = engines

    def collect(self):
        families = [GaugeMetricFamily(f"specrag_{n}", h, labels=["engine"]) for n, h, _ in _GAUGES]
        for name, eng in self.engines().items():
            st = eng.stats()
            for fam, (_, _, key) in zip(families, _GAUGES):
                fam.add_metric([name], float(st.get(key, 0)))
        yield from families


class Metrics:
    """One registry per app (tests build many apps in one process)."""

    def __init__(self, engines: Callable[[], dict[str, Engine]]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engines))
        self.stage = Histogram(
            "specrag_stage_seconds",
            "Per-stage latency (RAG stages and engine stages)",
            ["stage"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.engine_stage = Histogram(
            "specrag_engine_stage_seconds",
            "Engine stage latency (queue, steps, request)",
            ["engine", "stage"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "specrag_http_requests",
            "HTTP requests by endpoint and status",
            ["endpoint", "status"],
            registry=self.registry,
        )

    def on_engine_stage(self, engine: str, stage: str, seconds: float) -> None:
        self.engine_stage.labels(engine, stage).observe(seconds)

    def observe_trace(self, trace: dict) -> None:
        """RAG stage timings from a pipeline trace (keys ending in ``_s``)."""
        for key, value in trace.items():
            if key.endswith("_s") and isinstance(value, (int, float)):
                self.stage.labels(key[:-2]).observe(float(value))

    def render(self) -> bytes:
        return generate_latest(self.registry)
