"""Walking documentation pages as a user would: their code blocks, in order, in one folder.

Used by ``tests/test_docs_walk.py``. The conventions, written in the Markdown:

- A ````bash```` block is one shell script, run with ``set -e -o pipefail`` in
  the walk's folder with ``partitioning`` (this environment's) on ``PATH``
  and no device flags (the CLI simulates what a config asks for).
- The ````python```` blocks of one page share one interpreter, started fresh
  for the page, as if pasted into one session (no device flags either).
- Other blocks (``yaml``, ``text``, ``output``, none) are read, not run,
  unless ``<!-- file: PATH -->`` precedes one: then its text is written to
  ``PATH`` (a snippet the next commands use, saved as the page says).
- ``<!-- skip: REASON -->`` on the line before a block: not run; the reason
  is reported.
- Comments right after a block's closing fence check what it did:
  ``<!-- expect: PATH ... -->`` (files or globs it must have made, not empty),
  ``<!-- exit: N -->`` (its exit status; default 0; python blocks: 0 or 1),
  ``<!-- stdout: TEXT -->`` (text its output must contain).

Every block fails on a traceback in its output, and a block expected to
succeed fails on an ``error:`` line.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

FENCE = re.compile(r"^(\s*)```+\s*([\w+-]*)\s*(.*)$")
COMMENT = re.compile(r"^\s*<!--\s*([\w-]+)\s*:\s*(.*?)\s*-->\s*$")
BEFORE = ("skip", "file")  # markers on the lines right before a block's fence
AFTER = ("expect", "exit", "stdout")  # markers on the lines right after its closing fence
RUN = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "py": "python"}


@dataclasses.dataclass
class Block:
    """One fenced code block of a page, with the markers around it."""

    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    before: dict[str, str] = dataclasses.field(default_factory=dict)
    after: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    @property
    def kind(self) -> str | None:
        """``bash``, ``python``, ``file`` (write it out) or None (read only)."""
        if "file" in self.before:
            return "file"
        return RUN.get(self.lang)

    @property
    def skip(self) -> str | None:
        return self.before.get("skip")

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def expected_exit(self) -> int:
        return int(self.after.get("exit", ["0"])[-1])


def parse(text: str, page: str) -> list[Block]:
    """The fenced blocks of a Markdown page, in order, with their before/after markers."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, extra = m.group(1), m.group(2).lower(), m.group(3)
        start = i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        before: dict[str, str] = {}
        j = start - 1
        while j >= 0 and COMMENT.match(lines[j]):
            key, value = COMMENT.match(lines[j]).groups()
            if key in BEFORE:
                before.setdefault(key, value)
            j -= 1
        if "skip" in extra.split():
            before.setdefault("skip", "marked skip")
        after: dict[str, list[str]] = {}
        k = i + 1
        while k < len(lines) and (not lines[k].strip() or COMMENT.match(lines[k])):
            c = COMMENT.match(lines[k])
            if c and c.group(1) in AFTER:
                after.setdefault(c.group(1), []).append(c.group(2))
            k += 1
        blocks.append(Block(page, start + 1, lang, "\n".join(body) + "\n", before, after))
        i += 1
    return blocks


@dataclasses.dataclass
class Result:
    """What a run block did."""

    code: int
    output: str  # stdout and stderr, as a user sees them
    stderr: str = ""


def check(block: Block, result: Result, folder: Path) -> list[str]:
    """Why ``result`` is not what ``block`` says it does ([] when it is)."""
    problems = []
    want = block.expected_exit()
    if result.code != want:
        problems.append(f"exit status {result.code}, expected {want}")
    if "Traceback (most recent call last)" in result.output and want == 0:
        problems.append("a traceback")
    if want == 0 and any(line.startswith("error:") for line in (result.stderr or result.output).splitlines()):
        problems.append("an error: line")
    for spec in block.after.get("expect", []):
        for pattern in spec.split():
            found = [p for p in folder.glob(pattern) if not p.is_file() or p.stat().st_size > 0]
            if not found:
                problems.append(f"expected {pattern} to exist (not empty)")
    for text in block.after.get("stdout", []):
        if text not in result.output:
            problems.append(f"expected the output to contain {text!r}")
    return problems


def user_env(extra_path: str | None = None) -> dict[str, str]:
    """The environment a user's shell has: no device flags; this environment's ``partitioning`` first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "PYTEST_CURRENT_TEST")}
    env["PATH"] = os.pathsep.join([extra_path or str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_bash(script: str, folder: Path, env: dict[str, str], timeout: float) -> Result:
    try:
        r = subprocess.run(
            ["bash", "-c", "set -e -o pipefail\n" + script],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        err = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else e.stderr or ""
        return Result(124, f"{out}{err}\n(timed out after {timeout:.0f} s)", err)
    return Result(r.returncode, r.stdout + r.stderr, r.stderr)


DRIVER = r"""
import sys, traceback
ns = {"__name__": "__main__"}
while True:
    header = sys.stdin.readline()
    if not header:
        break
    size, name = header.split(" ", 1)
    code = sys.stdin.read(int(size))
    status = 0
    try:
        exec(compile(code, name.strip(), "exec"), ns)
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    print("\n@@docswalk-done %d@@" % status, flush=True)
"""


class PythonSession:
    """One interpreter that runs blocks in one namespace, like pasting them into one session."""

    def __init__(self, folder: Path, env: dict[str, str]):
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-c", DRIVER],
            cwd=folder,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def run(self, code: str, name: str, timeout: float) -> Result:
        assert self.proc.stdin is not None
        # Text mode on both ends: the driver reads the block's length in characters.
        self.proc.stdin.write(f"{len(code)} {name}\n{code}")
        self.proc.stdin.flush()
        out: list[str] = []
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                self.close()
                return Result(124, "".join(out) + f"\n(timed out after {timeout:.0f} s)")
            if line is None:
                return Result(self.proc.wait(), "".join(out) + "\n(the interpreter exited)")
            m = re.match(r"^@@docswalk-done (\d)@@$", line.strip())
            if m:
                text = "".join(out)
                return Result(int(m.group(1)), text[:-1] if text.endswith("\n") else text)
            out.append(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def walk(
    pages: list[Path],
    folder: Path,
    *,
    root: Path,
    env: dict[str, str],
    shorten: Callable[[Block], str] = lambda b: b.text,
    timeout: float = 1800,
    say: Callable[[str], None] = print,
    timings: list[tuple[str, float]] | None = None,
) -> list[str]:
    """Runs every block of ``pages`` in order in ``folder``; returns one failure line per failing block.

    ``shorten(block)`` gives the text to run (the walk may make long runs
    shorter); the page's own text is what the checks read. ``timings``
    collects ``(page:line, seconds)`` of every block run.
    """
    failures: list[str] = []
    for page in pages:
        name = page.relative_to(root).as_posix() if page.is_relative_to(root) else page.name
        session: PythonSession | None = None
        try:
            for b in parse(page.read_text(), name):
                if b.kind is None:
                    continue
                if b.skip:
                    say(f"{b.where}: skipped ({b.skip})")
                    continue
                if b.kind == "file":
                    target = folder / b.before["file"]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(shorten(b))
                    continue
                t0 = time.perf_counter()
                if b.kind == "bash":
                    result = run_bash(shorten(b), folder, env, timeout)
                else:
                    session = session or PythonSession(folder, env)
                    result = session.run(shorten(b), b.where, timeout)
                if timings is not None:
                    timings.append((b.where, time.perf_counter() - t0))
                problems = check(b, result, folder)
                if problems:
                    failures.append(
                        f"{b.where} ({b.lang}): {'; '.join(problems)}\n--- block:\n{b.text}--- output (last 3000):\n"
                        f"{result.output[-3000:]}"
                    )
                    if b.kind == "python" and result.code != b.expected_exit():
                        break  # the session's state is unknown from here: the page stops
        finally:
            if session is not None:
                session.close()
    return failures


__all__ = ["Block", "parse", "check", "walk", "run_bash", "PythonSession", "user_env", "Result"]
