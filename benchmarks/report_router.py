"""The router's two tables (dev 100 against standard, long context) and the README's results block built from them."""

from __future__ import annotations

from benchmarks.claim_sections.sibling import SIBLING_FILE, sibling_runs
from benchmarks.report_eval_runs import split_breakdown
from benchmarks.report_provenance import provenance
from benchmarks.report_source import Source, get
from benchmarks.report_text import fmt, pct, points, secs, table, wrap

DEV_RUN = "eval_dev100_auto"
LONG_RUN = "long_context.json"


def router_dev_lines(src: Source, name: str = DEV_RUN) -> list[str]:
    """The dev-100 table of standard against auto (the README's and docs/results.md's)."""
    res, where = src.json(name), src.shown(name)
    std, auto = get(res, "methods/standard", where), get(res, "methods/auto", where)
    preds = src.jsonl(f"{name}/predictions.jsonl")
    answers = {p["question_id"]: p["answer"] for p in preds if p["method"] == "auto"}
    same = sum(answers.get(p["question_id"]) == p["answer"] for p in preds if p["method"] == "standard")
    n = get(std, "n", where)
    parts = split_breakdown(src, name, ["standard", "auto"])
    router = get(auto, "router", where)
    lat_s, lat_a = get(std, "latency_s/mean", where), get(auto, "latency_s/mean", where)
    rows = [
        [f"dev {n} accuracy", fmt(get(std, "accuracy", where), "{:.0%}"),
         f"{fmt(get(auto, 'accuracy', where), '{:.0%}')} (answers identical on {same} of {n})", ""],
        [f"dev {n} mean latency", secs(lat_s), secs(lat_a), f"**{lat_a / lat_s:.3f}x**"],
    ]  # fmt: skip
    for part, label in (("heldout", "held-out"), ("train", "train")):
        (ns, acc_s, t_s), (_, acc_a, t_a) = parts["standard"][part], parts["auto"][part]
        rows.append([f"{label} {ns} accuracy / latency", f"{pct(acc_s)} / {secs(t_s)}", f"{pct(acc_a)} / {secs(t_a)}",
                     f"{t_a / t_s:.3f}x"])  # fmt: skip
    paths = get(router, "paths", where)
    rows.append(["paths", "", ", ".join(f"{k} {v}" for k, v in paths.items()), ""])
    predicted = get(router, "predicted_s_mean", where) / get(router, "measured_s_mean", where)
    rows.append(["exact path", "",
                 f"{get(auto, 'speculation/accepted_tokens_per_step', where):.2f} tokens per verifier step; "
                 f"predicted time {predicted:.2f}x the measured", ""])  # fmt: skip
    return table(("", "standard", "auto", "auto / standard"), rows)


def _route(entry: dict, where: str) -> str:
    paths = ", ".join(f"{k} {v}" for k, v in get(entry, "paths", where).items() if v)
    return paths


def long_context_lines(src: Source, name: str = LONG_RUN) -> list[str]:
    """Accuracy / mean latency per context size, and the route each platform's prediction takes."""
    data, where = src.json(name), src.shown(name)
    rows = []
    for i, s in enumerate(get(data, "sizes", where)):
        at = f"{where}: sizes/{i}"
        std_t = get(s, "standard/latency_s", at)

        def acc_lat(key: str, with_ratio: bool, bold: bool = False) -> str:
            a, t = get(s, f"{key}/accuracy", at), get(s, f"{key}/latency_s", at)
            text = f"{a:.0%} / {t:.1f} s"
            if with_ratio:
                r = f"{t / std_t:.2f}x"
                text += f" (**{r}**)" if bold else f" ({r})"
            return text

        route = get(s, "auto/router", at)
        devices = get(s, "auto/router_on_devices", at)
        dev_cells = []
        for dev, unit in (("h200", "{:.1f}"), ("tpu-v5e", "{:.0f}")):
            d = get(devices, dev, at)
            dev_cells.append(
                f"{_route(d, at)}: {unit.format(get(d, 'predicted_exact_ms', at))} vs "
                f"{unit.format(get(d, 'predicted_cascade_ms', at))} ms ({get(d, 'break_even_accept', at):.2f})"
            )
        rows.append(
            [
                get(s, "n_docs", at),
                f"{get(s, 'standard_prompt_tokens', at):.0f}",
                acc_lat("standard", False),
                acc_lat("auto", True, bold=True),
                acc_lat("speculative", True),
                f"{_route(route, at)} (break-even {get(route, 'break_even_accept_mean', at):.2f})",
                *dev_cells,
            ]
        )
    header = (
        "passages",
        "standard prompt tokens",
        "standard",
        "auto",
        "the cascade",
        "CPU route (break-even P(accept))",
        "H200 route: exact vs cascade predicted (break-even)",
        "TPU v5e route (break-even)",
    )
    return table(header, rows)


def long_context_summary(src: Source, name: str = LONG_RUN) -> str:
    """One paragraph of the long-context run's findings, every number read from the file."""
    data, where = src.json(name), src.shown(name)
    sizes = get(data, "sizes", where)
    ratios = [get(s, "auto/ratio_vs_standard", where) for s in sizes]
    last = sizes[-1]
    at = f"{where}: sizes/{len(sizes) - 1}"
    prefill = get(last, "roofline/auto/exact.prefill/measured_s", at)
    exact = get(last, "roofline/auto/exact/measured_s", at)
    cascade = get(last, "speculative/cascade", at)
    route = get(last, "auto/router", at)
    device_even = [
        get(s, f"auto/router_on_devices/{d}/break_even_accept", where) for s in sizes for d in ("h200", "tpu-v5e")
    ]
    exact_everywhere = all(get(s, "auto/router/paths/cascade", where) == 0 for s in sizes)
    return (
        f"`auto` ran at {min(ratios):.2f}-{max(ratios):.2f}x standard's latency"
        + (" and took the exact path on every question at every size" if exact_everywhere else "")
        + f". At {get(last, 'n_docs', at)} passages the exact path's prefill was {prefill:.1f} of its {exact:.1f} s "
        f"({prefill / exact:.0%}), which lossless decoding cannot shorten; the cascade accepted "
        f"{get(cascade, 'accepted', at)} of {get(cascade, 'n', at)} drafts (oracle "
        f"{get(last, 'selection/oracle', at):.0%}), and the predicted P(accept) was "
        f"{get(route, 'mean_acceptance/accept', at):.2f} against a CPU break-even of "
        f"{get(route, 'break_even_accept_mean', at):.2f}. The same prompts on an H200 and a TPU v5e (published "
        f"peaks, stage ratios 1.0) route to the exact path too, at a break-even acceptance of "
        f"{min(device_even):.2f}-{max(device_even):.2f}."
    )


def _run_facts(src: Source, name: str) -> str:
    p = provenance(src, name)
    return f"`{p.command}`; machine: {p.machine}; commit {p.commit}; date: {p.date}"


def readme_block(src: Source) -> str:
    """The README's results block, between the markers (markers excluded)."""
    dev_where, long_where = src.shown(DEV_RUN), src.shown(LONG_RUN)
    n = get(src.json(DEV_RUN), "methods/standard/n", dev_where)
    held = split_breakdown(src, DEV_RUN, ["standard"])["standard"]["heldout"][0]
    data = src.json(LONG_RUN)
    sizes = get(data, "sizes", long_where)
    first, last = (get(sizes, i, long_where) for i in ("0", "-1"))
    lines = [
        f"**Dev {n}, one run** ({_run_facts(src, DEV_RUN)}; latency without one-time compilation; one question is "
        f"{points(100 / n)} on dev {n}, {points(100 / held)} on the held-out {held}):",
        "",
        *router_dev_lines(src),
        "",
        f"**Long context, one run** ({_run_facts(src, LONG_RUN)}: {len(get(data, 'questions', long_where))} held-out "
        f"questions, each retrieving its top {get(first, 'n_docs', f'{long_where}: sizes/0')} to "
        f"{get(last, 'n_docs', f'{long_where}: sizes/{len(sizes) - 1}')} passages by BM25 from the dev file's "
        f"{get(data, 'corpus_passages', long_where):,} pooled passages; one question is "
        f"{points(get(data, 'one_question_points', long_where))}; the plot is `long_context.png`). "
        "Accuracy / mean latency:",
        "",
        *long_context_lines(src),
        "",
        long_context_summary(src),
        "",
        f"**The drafter** ({_run_facts(src, SIBLING_FILE)}; drafts per split, the verifier's sibling against the tuned "
        "SmolLM2; the train-calibrate split decides, per second of drafting):",
        "",
        *sibling_runs(src, SIBLING_FILE),
    ]
    return "\n".join(wrap(lines)) + "\n"
