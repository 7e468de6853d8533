"""Which figures of which result file back which claim: the sections of docs/results.md (``benchmarks.report``).

One ``Claim`` per current result file under benchmarks/results/: its title, what it shows and where that is
claimed, and the tables of its figures (paths into the JSON, ``report_source.get``). Each section is a module of
``benchmarks/claim_sections/``; ``SECTIONS`` is their order in docs/results.md. A result file that backs no claim is
not kept (git keeps it); docs/benchmarks.md lists the scripts that write these files.
"""

from __future__ import annotations

from benchmarks.claim_sections.answers import ANSWERS
from benchmarks.claim_sections.cascade import CASCADE
from benchmarks.claim_sections.defaults import DEFAULTS
from benchmarks.claim_sections.drafter import DRAFTER
from benchmarks.claim_sections.engine import ENGINE
from benchmarks.claim_sections.loading import LOADING
from benchmarks.claim_sections.lossless import LOSSLESS
from benchmarks.claim_sections.rerank import RERANK
from benchmarks.claim_sections.roofline import ROOFLINE
from benchmarks.claim_sections.router import ROUTER
from benchmarks.claim_sections.serving import SERVING
from benchmarks.claim_sections.sharding import SHARDING
from benchmarks.claim_sections.sibling import SIBLING
from benchmarks.claim_sections.suite import SUITE

SECTIONS = (
    ROUTER,
    ANSWERS,
    CASCADE,
    DEFAULTS,
    DRAFTER,
    SIBLING,
    LOSSLESS,
    RERANK,
    ENGINE,
    ROOFLINE,
    LOADING,
    SERVING,
    SHARDING,
    SUITE,
)
