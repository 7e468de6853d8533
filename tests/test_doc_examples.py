"""Every ```python block of README.md and docs/*.md runs, as a reader would run it.

The rules a doc writer needs (each enforced here):

- Files are found by glob (``README.md``, ``docs/*.md``), so a new doc is covered without an edit here.
- The blocks of one file run in order, in one namespace, in a fresh Python subprocess of their own (one per file):
  state carries from one block to the next (the quick start's ``rag`` is there in the next block), and a crash
  takes down only that file's blocks. The working directory is a fresh temporary folder (an example may write
  files), the repository is importable, the environment is otherwise the test's. Selecting one block (``-k``)
  runs the earlier blocks of its file first.
- A marker comment alone on a line just above a fence (blank lines between are allowed) sets how a block runs:
  - ``<!-- example: slow -->``: the block loads a real model; its test is marked ``slow``. A block that calls
    ``build_specrag(`` or ``<something>.load(`` (``TextModel.load``, ``FunctionalModel.load``) is slow without the
    marker. Every later block of the same file is ``slow`` too, since it runs in the namespace the slow block built.
  - ``<!-- example: server -->``: the block is a client of ``specrag serve``. It runs alone, in a subprocess of its
    own, against a server this module starts once in a subprocess (``specrag serve --drafter tiny:llama
    --verifier tiny:gemma3``: tiny random models, so what they write is noise) on a free port. Before it runs,
    every ``http://127.0.0.1:8000`` and ``http://localhost:8000`` in the block is rewritten to that port.
  - ``<!-- example: output -->`` above a ```text block that follows a python block (prose between is fine, another
    fence is not): what that python block prints, compared as doctest compares output with ELLIPSIS (``...``
    stands for any text, newlines included).
- No ```python block is skipped: there is no skip marker. A snippet that cannot run must use a ```text, ```bash
  (or other) fence. ```py and ```python3 blocks run too; ```pycon / ```ipython blocks fail the test (they could
  not run). An unknown marker, or a marker above anything else than what it applies to, fails the test.
"""

from __future__ import annotations

import doctest
import json
import os
import queue
import re
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx
import pytest

from tests.xla_env import TEST_XLA_FLAGS, xla_flags

ROOT = Path(__file__).resolve().parents[1]
MARKERS = ("slow", "server", "output")
PYTHON = ("python", "py", "python3")  # fences that run
UNRUNNABLE_PYTHON = ("pycon", "ipython", "ipython3", "pytb")  # python-looking fences that could not run
MARKER = re.compile(r"^<!--\s*example:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
LOADS_A_MODEL = re.compile(r"\bbuild_specrag\(|\.load\(")  # a real model: slow without the marker
DEFAULT_BASE = re.compile(r"http://(?:127\.0\.0\.1|localhost):8000")
BLOCK_TIMEOUT_S = 600  # one block (a real model's first load and compile on a busy 2-core machine included)
SERVER_START_S = 300


@dataclass
class Block:
    file: str  # relative to the repository
    line: int  # the opening fence's line (1-based)
    code: str
    markers: tuple[str, ...] = ()
    slow: bool = False
    expected: str | None = None  # the ```text output block after it, when marked

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def server(self) -> bool:
        return "server" in self.markers


@dataclass
class DocFile:
    path: str
    blocks: list[Block] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def parse(path: Path, root: Path = ROOT) -> DocFile:
    """The python blocks of a Markdown file with their markers, and every misuse of a marker."""
    rel = path.relative_to(root).as_posix()
    doc = DocFile(rel)
    lines = path.read_text(encoding="utf-8").splitlines()
    pending: list[tuple[int, str]] = []  # markers waiting for their fence: (line, name)
    last_python: Block | None = None  # the python block an output block may follow (no fence between)
    i = 0
    while i < len(lines):
        text = lines[i]
        if m := MARKER.match(text.strip()):
            names = m.group(1).split()
            unknown = [n for n in names if n not in MARKERS]
            if unknown:
                doc.errors.append(f"{rel}:{i + 1}: unknown example marker {unknown[0]!r} (known: {', '.join(MARKERS)})")
            pending += [(i + 1, n) for n in names]
            i += 1
            continue
        if not (fence := FENCE.match(text.strip())):
            if text.strip():  # prose: markers above it are misplaced; an output block may still follow
                doc.errors += [f"{rel}:{at}: marker {n!r} is not right above a code fence" for at, n in pending]
                pending = []
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence.group(1)):
            end += 1
        body = textwrap.dedent("\n".join(lines[i + 1 : end]) + "\n")  # a fence indented in a list item
        lang, names = fence.group(2).lower(), tuple(n for _, n in pending)
        if lang in UNRUNNABLE_PYTHON:
            doc.errors.append(f"{rel}:{i + 1}: a ```{lang} block cannot run: use ```python (it runs) or ```text")
        if lang in PYTHON:
            if "output" in names:
                doc.errors.append(f"{rel}:{i + 1}: 'output' marks a ```text block after a python block, not python")
            last_python = Block(rel, i + 1, body, names)
            doc.blocks.append(last_python)
        elif "output" in names and lang == "text" and last_python is not None and last_python.expected is None:
            last_python.expected = body
            last_python = None
        else:
            if names:
                doc.errors.append(f"{rel}:{i + 1}: example markers {list(names)} above a ```{lang} block")
            last_python = None
        pending = []
        i = end + 1
    doc.errors += [f"{rel}:{at}: marker {n!r} is not right above a code fence" for at, n in pending]
    slow = False
    for b in doc.blocks:
        if b.server:
            if b.expected is not None or "slow" in b.markers:
                doc.errors.append(f"{b.id}: a server block runs against tiny models: no 'slow', no output block")
            continue
        slow = slow or "slow" in b.markers or bool(LOADS_A_MODEL.search(b.code))
        b.slow = slow
    return doc


DOCS = [parse(p) for p in doc_files()]
BLOCKS = [b for d in DOCS for b in d.blocks]


def test_markers_are_used_as_documented():
    errors = [e for d in DOCS for e in d.errors]
    assert not errors, "\n".join(errors)


def parse_text(folder: Path, text: str) -> DocFile:
    md = folder / "doc.md"
    md.write_text(text)
    return parse(md, folder)


def test_parse_rules(tmp_path):
    """The parser on small files: slow propagates to later blocks (and follows from a model load), server blocks
    stand alone, output attaches to the python block before it, and misused markers are reported."""
    doc = parse_text(
        tmp_path,
        "```python\na = 1\n```\n<!-- example: slow -->\n```python\nb = a\n```\n\n<!-- example: output -->\n"
        "```text\n...\n```\n<!-- example: server -->\n```python\nc = 3\n```\n```python\nd = b\n```\n"
        "<!-- example: slow -->\n```bash\nls\n```\n<!-- example: sloww -->\ntext\n```pycon\n>>> 1\n```\n"
        "```py\ne = d\n```\n",
    )
    assert [(b.line, b.slow, b.server, b.expected) for b in doc.blocks] == [
        (1, False, False, None),
        (5, True, False, "...\n"),
        (14, False, True, None),
        (17, True, False, None),
        (29, True, False, None),
    ]
    assert len(doc.errors) == 4 and "```bash" in doc.errors[0] and "'sloww'" in doc.errors[1], doc.errors
    assert "```pycon" in doc.errors[3], doc.errors
    loads = parse_text(
        tmp_path, "```python\nc = sr.load_corpus('c')\n```\n```python\nm = sr.TextModel.load('m')\n```\n"
    )
    assert [b.slow for b in loads.blocks] == [False, True]


# -- running blocks ---------------------------------------------------------------------------------------------

# The subprocess: blocks arrive as JSON lines on stdin and run in one namespace; each reply is one JSON line on a
# private copy of the original stdout (fd 1 itself goes to stderr, so stray prints of libraries cannot break it).
DRIVER = r"""
import contextlib, io, json, os, sys, traceback
reply = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
ns = {"__name__": "__main__"}
for line in sys.stdin:
    job = json.loads(line)
    out = io.StringIO()
    error = None
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(job["code"], job["name"], "exec"), ns)
    except BaseException:
        error = traceback.format_exc()
    sys.stderr.flush()
    reply.write(json.dumps({"stdout": out.getvalue(), "error": error}) + "\n")
    reply.flush()
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["XLA_FLAGS"] = xla_flags(TEST_XLA_FLAGS)  # the suite's compile level, as every test subprocess
    return env


def _shut_down(runner: Session | Server, ask: Callable[[], None]) -> None:
    """Stop ``runner``'s subprocess (``ask`` it to end, wait up to 60 s, then kill it); close its log and folder."""
    if runner.proc.poll() is None:
        ask()
        try:
            runner.proc.wait(60)
        except subprocess.TimeoutExpired:
            runner.proc.kill()
            runner.proc.wait()
    runner.log.close()
    runner.dir.cleanup()


class Session:
    """One subprocess and its namespace: the blocks of one file (or one server block)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.dir = tempfile.TemporaryDirectory(prefix="doc_examples_")
        self.log = open(Path(self.dir.name) / "stderr.log", "w+", encoding="utf-8")
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-c", DRIVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            cwd=self.dir.name,
            env=_env(),
            text=True,
        )
        self.replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.done = 0  # blocks of the file run so far
        self.failed: str | None = None

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.replies.put(json.loads(line))
        self.replies.put(None)

    def log_tail(self, n: int = 4000) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-n:]

    def run(self, block: Block, code: str | None = None) -> str:
        """Run one block; its stdout, or AssertionError naming the block and showing the traceback."""
        if self.failed:
            raise AssertionError(f"{self.label}: an earlier block failed ({self.failed}), so this one cannot run")
        self.proc.stdin.write(json.dumps({"code": code or block.code, "name": block.id}) + "\n")
        self.proc.stdin.flush()
        try:
            reply = self.replies.get(timeout=BLOCK_TIMEOUT_S)
        except queue.Empty:
            reply = {"error": f"no result after {BLOCK_TIMEOUT_S} s"}
        if reply is None:
            reply = {"error": f"the subprocess died (exit status {self.proc.wait()})"}
        if reply["error"]:
            self.failed = block.id
            raise AssertionError(f"{block.id} failed:\n{reply['error']}\n--- stderr (tail) ---\n{self.log_tail()}")
        print(reply["stdout"], end="")
        return reply["stdout"]

    def close(self) -> None:
        _shut_down(self, ask=self.proc.stdin.close)  # end of input ends the DRIVER loop


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``specrag serve`` with tiny random models on a free loopback port (as tests/serving/test_server_process.py)."""

    def __init__(self) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="doc_examples_serve_")
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(Path(self.dir.name) / "server.log", "w+", encoding="utf-8")
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "specrag_jax.cli", "serve", "--port", str(self.port)),
                *("--drafter", "tiny:llama", "--verifier", "tiny:gemma3", "--num-pages", "128"),
                *("--max-seq-len", "512", "--m", "2", "--warmup", "none"),
                *("--compile-cache", str(Path(self.dir.name) / "xla")),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=_env(),
        )
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(f"{self.base}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.close()
        raise AssertionError(f"the server did not start:\n{self._log()}")

    def _log(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def close(self) -> None:
        _shut_down(self, ask=self.proc.terminate)


@pytest.fixture(scope="module")
def runners():
    """Sessions per file and the server, each started when a block first needs it, all closed at the end."""
    state: dict = {"sessions": {}, "server": None}
    yield state
    for session in state["sessions"].values():
        session.close()
    if state["server"] is not None:
        state["server"].close()


def _check_output(block: Block, got: str) -> None:
    checker = doctest.OutputChecker()
    if not checker.check_output(block.expected, got, doctest.ELLIPSIS):
        raise AssertionError(
            f"{block.id} printed what its output block does not say (`...` matches any text):\n"
            f"--- expected ---\n{block.expected}--- printed ---\n{got}"
        )


def _run_server_block(block: Block, runners: dict) -> None:
    if runners["server"] is None:
        runners["server"] = Server()
    code = DEFAULT_BASE.sub(runners["server"].base, block.code)
    session = Session(block.id)
    try:
        session.run(block, code)
    finally:
        session.close()


def _run_file_block(block: Block, runners: dict) -> None:
    doc = next(d for d in DOCS if d.path == block.file)
    session = runners["sessions"].get(block.file)
    if session is None:
        session = runners["sessions"][block.file] = Session(block.file)
    own = [b for b in doc.blocks if not b.server]
    index = own.index(block)
    while session.done < index:  # earlier blocks not selected in this run: they build the namespace
        session.run(own[session.done])
        session.done += 1
    if session.done > index:
        raise AssertionError(f"{block.id} already ran in this session")
    out = session.run(block)
    session.done += 1
    if block.expected is not None:
        _check_output(block, out)


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id, marks=[pytest.mark.slow] * b.slow) for b in BLOCKS])
def test_example(block: Block, runners):
    if block.server:
        _run_server_block(block, runners)
    else:
        _run_file_block(block, runners)
