"""Load test of `specrag serve` over loopback: concurrent clients vs one request at a time, and a rate sweep.

Starts the real server as a subprocess (once with backpressure, once without when the sweep asks for both),
sends a bounded number of requests (count and wall time) and reports requests/s, generated tokens/s (from
the server's own counters), p50/p95 latency; the speedup of N concurrent clients over the same workload
one request at a time on the same engine (the same requests, each run from a cold prefix cache); and, for
open-loop arrivals at increasing rates, the highest rate whose p95 stays under a stated bound. Results (with the
command) go to benchmarks/results/serve_load.json.

    nice -n 19 .venv/bin/python benchmarks/serve_load.py                  # real models, RAG requests
    .venv/bin/python benchmarks/serve_load.py --drafter tiny:llama --verifier tiny:gemma3 --requests 8
    .venv/bin/python benchmarks/serve_load.py --workload chat --max-tokens 48 --backpressure on --rates '' \
        --sampling-cost --out benchmarks/results/serve_load_sampling_cost.json   # logprobs + penalties on vs off
"""

from __future__ import annotations

import argparse
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import RESULTS_DIR, command_line, git_state, loadavg, machine_info, write_results
from specrag_jax.models.engine.warmup import default_compile_cache

TOPICS = [
    ("France", "Paris", "the Seine"),
    ("Italy", "Rome", "the Tiber"),
    ("Germany", "Berlin", "the Spree"),
    ("Spain", "Madrid", "the Manzanares"),
    ("Austria", "Vienna", "the Danube"),
    ("Hungary", "Budapest", "the Danube"),
    ("Poland", "Warsaw", "the Vistula"),
    ("Portugal", "Lisbon", "the Tagus"),
    ("Egypt", "Cairo", "the Nile"),
    ("England", "London", "the Thames"),
    ("Russia", "Moscow", "the Moskva"),
    ("Ireland", "Dublin", "the Liffey"),
]


PHRASINGS = [
    "What is the capital of {}?",
    "Which city is the capital of {}?",
    "Name the capital city of {}.",
    "What city serves as the capital of {}?",
    "Tell me the capital of {}.",
    "Where is the seat of {}'s government?",
]
ENDINGS = ["", " Answer briefly.", " Please be concise.", " One word is enough."]
UNIQUE_QUESTIONS = len(TOPICS) * len(PHRASINGS) * len(ENDINGS)  # 288


def rag_body(i: int, m: int, k: int) -> dict:
    """Question i with six short passages (two relevant, four distractors). Every i below UNIQUE_QUESTIONS
    asks a different question, with its own distractors: a measured run never reuses another run's question
    from the prefix cache (the shared instructions still are)."""
    n = len(TOPICS)
    country, city, river = TOPICS[i % n]
    docs = [
        {"id": f"{country}-capital", "title": city, "text": f"{city} is the capital of {country}."},
        {"id": f"{country}-river", "title": river, "text": f"{city} lies on {river}, in {country}."},
    ]
    others = random.Random(i).sample([t for t in TOPICS if t[0] != country], 4)
    for c2, city2, _ in others:
        docs.append({"id": f"{c2}-capital", "title": city2, "text": f"{city2} is the capital of {c2}."})
    question = PHRASINGS[(i // n) % len(PHRASINGS)].format(country) + ENDINGS[(i // (n * len(PHRASINGS))) % 4]
    return {"question": question, "documents": docs, "m": m, "k": k}


EXTRAS = {
    "logprobs": True,
    "top_logprobs": 5,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "repetition_penalty": 1.1,
}  # --sampling-cost: the same chat requests with and without these


def completion_body(i: int, max_tokens: int, extras: bool = False) -> dict:
    country, city, _ = TOPICS[i % len(TOPICS)]
    return {
        "messages": [{"role": "user", "content": f"Tell me about {city}, the capital of {country}."}],
        "max_tokens": max_tokens,
        **(EXTRAS if extras else {}),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`specrag serve` in a subprocess on a free loopback port."""

    def __init__(self, args: argparse.Namespace, backpressure: bool) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "specrag_jax.cli",
            "serve",
            "--port",
            str(self.port),
            "--drafter",
            args.drafter,
            "--verifier",
            args.verifier,
            "--num-pages",
            str(args.num_pages),
            "--max-seq-len",
            str(args.max_seq_len),
            "--token-budget",
            str(args.token_budget),
            "--request-timeout",
            "600",
            "--max-inflight",
            "64",
            "--max-waiting",
            "256",
            "--warmup",
            args.warmup_level,
            "--compile-cache",
            args.compile_cache,
        ] + ([] if backpressure else ["--no-backpressure"])
        self.log = open(Path(args.log_dir) / f"serve_load_server_{'bp' if backpressure else 'nobp'}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        deadline = t0 + args.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}); see {self.log.name}")
            try:
                if httpx.get(f"{self.base}/health", timeout=5).status_code == 200:
                    self.startup_s = round(time.monotonic() - t0, 1)
                    return
            except httpx.HTTPError:
                time.sleep(0.5)
        raise RuntimeError("server did not start in time")

    def health(self) -> dict:
        return httpx.get(f"{self.base}/health", timeout=30).json()["engines"]

    def reset_prefix_cache(self) -> None:
        httpx.post(f"{self.base}/reset_prefix_cache", timeout=30).raise_for_status()

    def generated_tokens(self) -> int:
        return sum(e.get("generated_tokens", 0) for e in self.health().values())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def _post(client: httpx.Client, server: Server, args: argparse.Namespace, i: int) -> tuple[float, int]:
    path, body = (
        ("/v1/rag", rag_body(i, args.m, args.k))
        if args.workload == "rag"
        else ("/v1/chat/completions", completion_body(i, args.max_tokens, getattr(args, "extras", False)))
    )
    t0 = time.perf_counter()
    r = client.post(server.base + path, json=body, timeout=args.request_timeout)
    return time.perf_counter() - t0, r.status_code


def _summary(latencies: list[float], codes: list[int], wall: float, tokens: int) -> dict:
    ok = sorted(lat for lat, c in zip(latencies, codes) if c == 200)
    pct = lambda q: round(ok[min(len(ok) - 1, int(q * len(ok)))], 3) if ok else None  # noqa: E731
    return {
        "requests": len(codes),
        "ok": len(ok),
        "errors": {str(c): codes.count(c) for c in set(codes) if c != 200},
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(ok) / wall, 4) if wall else None,
        "tokens_per_s": round(tokens / wall, 2) if wall else None,
        "generated_tokens": tokens,
        "latency_s": {"p50": pct(0.5), "p95": pct(0.95), "mean": round(statistics.fmean(ok), 3) if ok else None},
    }


def closed_loop(server: Server, args: argparse.Namespace, concurrency: int, n: int, offset: int = 0) -> dict:
    """``concurrency`` clients, each sending its next request when the previous returns (``n`` in all)."""
    lock, next_i, results = threading.Lock(), [0], []
    deadline = time.monotonic() + args.max_time

    def client_loop():
        with httpx.Client() as client:
            while time.monotonic() < deadline:
                with lock:
                    if next_i[0] >= n:
                        return
                    i = next_i[0]
                    next_i[0] += 1
                results.append(_post(client, server, args, offset + i))

    tokens0, t0 = server.generated_tokens(), time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        for f in [pool.submit(client_loop) for _ in range(concurrency)]:
            f.result()
    wall = time.perf_counter() - t0
    out = _summary([r[0] for r in results], [r[1] for r in results], wall, server.generated_tokens() - tokens0)
    out["concurrency"] = concurrency
    return out


def open_loop(server: Server, args: argparse.Namespace, rate: float, offset: int = 1000) -> dict:
    """Arrivals every 1/rate seconds for ``--sweep-time`` seconds (at most ``--sweep-requests``), not waiting."""
    n = max(1, min(args.sweep_requests, int(rate * args.sweep_time)))
    results: list[tuple[float, int]] = []
    tokens0, t0 = server.generated_tokens(), time.perf_counter()
    with httpx.Client(limits=httpx.Limits(max_connections=256)) as client, ThreadPoolExecutor(128) as pool:
        futures = []
        for i in range(n):
            time.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            futures.append(pool.submit(_post, client, server, args, offset + i))
        results = [f.result() for f in futures]
    wall = time.perf_counter() - t0
    out = _summary([r[0] for r in results], [r[1] for r in results], wall, server.generated_tokens() - tokens0)
    out["offered_rate"] = rate
    return out


def _max_map_count() -> int | None:
    """Linux's per-process mapping limit: a full warm-up of both real models on CPU needs more than the default."""
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return None


def sampling_cost(server: Server, args: argparse.Namespace, rounds: int = 2) -> dict:
    """Concurrent chat decoding with logprobs (top 5) and all three penalties on vs off, the same requests (each
    from a cold prefix cache), alternating ``rounds`` times: generated tokens/s both ways (best round) and the ratio."""
    out: dict = {"extras": EXTRAS, "off": [], "on": []}
    for _ in range(rounds):
        for name, extras in (("off", False), ("on", True)):
            server.reset_prefix_cache()
            out[name].append(
                closed_loop(
                    server,
                    argparse.Namespace(**{**vars(args), "workload": "chat", "extras": extras}),
                    args.concurrency,
                    args.requests,
                )
            )
    off, on = (max(r["tokens_per_s"] or 0 for r in out[k]) for k in ("off", "on"))
    out["best_tokens_per_s"] = {"off": off, "on": on}
    out["tokens_per_s_on_over_off"] = round(on / off, 3) if off and on else None
    print(f"decode tokens/s (best of {rounds}): extras off {off}, on {on}", file=sys.stderr, flush=True)
    return out


def run(args: argparse.Namespace) -> dict:
    modes = {"both": [True, False], "on": [True], "off": [False]}[args.backpressure]
    payload: dict = {
        "command": command_line(),
        "machine": machine_info(),
        "git": git_state(),
        "loadavg_start": loadavg(),
        "vm_max_map_count": _max_map_count(),
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "runs": {},
    }
    for bp in modes:
        name = "backpressure" if bp else "no_backpressure"
        server = Server(args, bp)
        try:
            run_out: dict = {
                "startup_s": server.startup_s,
                "warmup": {
                    n: {k: e.get(k) for k in ("warmup_programs", "warmup_s")} for n, e in server.health().items()
                },
            }
            # Warm-up asks questions from the end of the set; the sweep asks fresh ones (rag_body).
            offset = UNIQUE_QUESTIONS - args.warmup * args.concurrency
            for i in range(args.warmup):  # a few requests on top of the server's own warm-up (tokenizers, jits)
                closed_loop(
                    server,
                    args,
                    1 if i == 0 else args.concurrency,
                    1 if i == 0 else args.concurrency,
                    offset=offset + args.concurrency * i,
                )
            if bp or args.backpressure == "off":  # the same requests both ways, each from a cold prefix cache
                server.reset_prefix_cache()
                run_out["sequential"] = closed_loop(server, args, 1, args.requests)
                server.reset_prefix_cache()
                run_out["concurrent"] = closed_loop(server, args, args.concurrency, args.requests)
                seq, con = run_out["sequential"]["requests_per_s"], run_out["concurrent"]["requests_per_s"]
                run_out["speedup"] = round(con / seq, 3) if seq and con else None
            if args.sampling_cost and bp == modes[0]:
                run_out["sampling_cost"] = sampling_cost(server, args)
            sweep = []
            sweep_offset = args.requests  # fresh questions from here on
            for rate in args.rates:
                point = open_loop(server, args, rate, sweep_offset)
                sweep_offset += point["requests"]
                # Held: every request served, p95 under the bound, and the server kept up (a short burst can meet
                # the bound from the queue while the served rate falls far below the offered one).
                point["held"] = bool(
                    point["ok"] == point["requests"]
                    and point["latency_s"]["p95"] is not None
                    and point["latency_s"]["p95"] <= args.p95_bound
                    and point["requests_per_s"] >= args.min_served_fraction * rate
                )
                sweep.append(point)
                print(
                    f"[{name}] rate {rate}/s: p95 {point['latency_s']['p95']} s, held={point['held']}",
                    file=sys.stderr,
                    flush=True,
                )
                if not point["held"]:
                    break  # higher rates only queue more
            run_out["rate_sweep"] = sweep
            held = [p["offered_rate"] for p in sweep if p["held"]]
            run_out["max_rate_with_p95_under_bound"] = max(held) if held else None
            run_out["server_counters"] = server.health()
            payload["runs"][name] = run_out
        finally:
            server.stop()
    payload["p95_bound_s"] = args.p95_bound
    payload["loadavg_end"] = loadavg()
    return payload


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--drafter", default="smollm2-135m-instruct")
    p.add_argument("--verifier", default="gemma3-270m")
    p.add_argument("--workload", default="rag", choices=["rag", "chat"])
    p.add_argument("--m", type=int, default=3)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=32, help="chat workload: tokens per request")
    p.add_argument("--requests", type=int, default=16, help="requests per measurement (upper bound)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-time", type=float, default=600.0, help="seconds per closed-loop measurement (bound)")
    p.add_argument(
        "--rates",
        type=lambda s: [float(x) for x in s.split(",") if x],
        default=[0.1, 0.2, 0.4, 0.8],
        help="offered rates of the sweep ('' = no sweep)",
    )
    p.add_argument(
        "--sampling-cost",
        action="store_true",
        help="also: chat decode tokens/s with logprobs and penalties on vs off (first server)",
    )
    p.add_argument("--sweep-time", type=float, default=60.0, help="seconds of arrivals per rate")
    p.add_argument("--sweep-requests", type=int, default=40, help="most requests per rate of the sweep")
    p.add_argument(
        "--min-served-fraction",
        type=float,
        default=0.8,
        help="a rate is held only if the served rate reaches this fraction of it (the tail's latency "
        "lowers the served rate a little even when the server keeps up)",
    )
    p.add_argument("--p95-bound", type=float, default=60.0, help="latency bound (s) for the rate sweep")
    p.add_argument("--backpressure", default="both", choices=["both", "on", "off"])
    p.add_argument("--warmup", type=int, default=2, help="warm-up rounds (1 sequential, then concurrent)")
    p.add_argument(
        "--warmup-level",
        default="full",
        choices=["none", "decode", "full"],
        help="the server's own step-shape warm-up (specrag serve --warmup)",
    )
    p.add_argument(
        "--compile-cache",
        default=str(default_compile_cache()),
        help="the server's persistent compilation cache ('none' = off)",
    )
    p.add_argument("--num-pages", type=int, default=1024)
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--token-budget", type=int, default=256)
    p.add_argument("--request-timeout", type=float, default=900.0)
    p.add_argument("--startup-timeout", type=float, default=1800.0, help="seconds for the server to load and warm up")
    p.add_argument("--log-dir", default="/tmp")
    p.add_argument("--out", default=str(RESULTS_DIR / "serve_load.json"))
    args = p.parse_args(argv)
    payload = run(args)
    path = write_results(args.out, payload)
    for name, r in payload["runs"].items():
        if "speedup" in r:
            print(
                f"{name}: 1 at a time {r['sequential']['requests_per_s']} req/s, {args.concurrency} concurrent "
                f"{r['concurrent']['requests_per_s']} req/s (x{r['speedup']}); p95 "
                f"{r['concurrent']['latency_s']['p95']} s"
            )
        print(f"{name}: highest rate with p95 <= {args.p95_bound}s: {r['max_rate_with_p95_under_bound']}/s")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
