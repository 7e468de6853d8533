"""The sections of docs/results.md, one module each; ``benchmarks.claims`` puts them in order."""
