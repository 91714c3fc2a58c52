"""The shell examples of the documentation site and the decision written before each (helpers of
``test_docs_shell.py``).

A page's shell example is a fenced block tagged ``bash`` / ``sh`` / ``shell`` / ``console``, or an
indented code block whose first line is a command (:data:`COMMAND`). The line before it (blank
lines aside) must be an HTML comment that says what the test suite does with it (the site does not
show it; inside a list item, where a comment line would end the list, the comment ends the line
before the block)::

    <!-- doc-test: fast -->                  run in the fast tier
    <!-- doc-test: slow -->                  run in the slow tier (-m slow)
    <!-- doc-test: engines needs=vllm -->    run in the slow tier, marker engines
    <!-- doc-test: skip REASON -->           never run (an install, a schematic line, ...): REASON says why

Options after the decision: ``needs=A,B`` (``real-models``: SmolLM2 and Gemma, ``real-qwen``,
``real-tokenizers``, ``vllm``, ``llama-server``, ``cuda``:
skipped with the reason when missing, a failure where the ``HSD_REQUIRE_*`` variable of that need is
1), ``fails-with="TEXT"`` (a reproducer of a crash: the block must exit non-zero and print TEXT),
``env="NAME=VALUE ..."`` (set for the run, e.g. a script's own size knob).

A fenced block with no language tag is refused: it is tagged ``text`` (output) or a shell.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "proofs").glob("*.md")),
         ROOT / "bench" / "README.md", ROOT / "bench" / "RESULTS.md"]
"""Every page of the site (mkdocs.yml: docs/, and the README, proofs/ and bench's pages the hook adds)."""

SHELL_TAGS = {"bash", "sh", "shell", "console"}
COMMAND = re.compile(r"^(hsd|python3?|pip|bash|export|nice|setsid|mkdocs|cd|\.|\$[A-Z_]+|~/|bench/|\.venv/|"
                     r"[A-Z][A-Z0-9_]*=\S*|#)(\s|$)|^(bench|tests|\.venv|~)/\S+")
"""The first line of an indented code block that makes it a shell example."""
DECISION = re.compile(r"<!--\s*doc-test:\s*(?P<body>.*?)\s*-->$")
KINDS = ("fast", "slow", "engines", "skip")
NEEDS = ("real-models", "real-qwen", "real-tokenizers", "vllm", "llama-server", "cuda")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([^\s`]*)")


@dataclass(frozen=True)
class Block:
    """One shell example: its page, its first line's number (1-based), its text (indentation
    removed) and its decision (None: none written)."""

    page: Path
    line: int
    code: str
    kind: str | None
    reason: str = ""
    needs: tuple[str, ...] = ()
    fails_with: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse_decision(text: str) -> tuple[str, str, tuple[str, ...], str | None, dict[str, str]]:
    """``(kind, reason, needs, fails_with, env)`` of a decision's body; ``ValueError`` naming what is
    wrong with it."""
    kind, _, rest = text.partition(" ")
    if kind not in KINDS:
        raise ValueError(f"doc-test decision {kind!r}: give one of {', '.join(KINDS)}")
    if kind == "skip":
        if not rest.strip():
            raise ValueError("doc-test: skip needs a reason")
        return kind, rest.strip(), (), None, {}
    needs: tuple[str, ...] = ()
    fails_with, env = None, {}
    for word in shlex.split(rest):
        key, eq, value = word.partition("=")
        if not eq or key not in ("needs", "fails-with", "env"):
            raise ValueError(f"doc-test option {word!r}: give needs=..., fails-with=\"...\" or env=\"A=B ...\"")
        if key == "needs":
            needs = tuple(value.split(","))
            if bad := [n for n in needs if n not in NEEDS]:
                raise ValueError(f"doc-test needs={','.join(bad)}: give {', '.join(NEEDS)}")
        elif key == "fails-with":
            fails_with = value
        else:
            env = dict(pair.split("=", 1) for pair in value.split())
    return kind, "", needs, fails_with, env


def _decision(lines: list[str], i: int) -> str | None:
    """The doc-test comment before line ``i`` (blank lines skipped), or None."""
    j = i - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    m = DECISION.search(lines[j].strip()) if j >= 0 else None
    return m.group("body") if m else None


def _block(page: Path, lines: list[str], start: int, code: list[str]) -> Block:
    body = _decision(lines, start)
    text = "\n".join(code).strip("\n") + "\n"
    if body is None:
        return Block(page, start + 1, text, None)
    kind, reason, needs, fails_with, env = parse_decision(body)
    return Block(page, start + 1, text, kind, reason, needs, fails_with, env)


def _dedent(lines: list[str]) -> list[str]:
    width = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
    return [x[width:] for x in lines]


def scan(page: Path) -> tuple[list[Block], list[str]]:
    """The shell examples of ``page`` and the problems found (an untagged fence: ``page:line``)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            fence, tag = m.group(2), m.group(3)
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(fence[:3]):
                j += 1
            if not tag:
                problems.append(f"{page.relative_to(ROOT)}:{i + 1}: a fenced block without a language tag (text for "
                                "output, bash for commands)")
            elif tag in SHELL_TAGS:
                blocks.append(_block(page, lines, i, _dedent(lines[i + 1:j])))
            i = j + 1
            continue
        if lines[i].startswith("    ") and lines[i].strip() and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            code = _dedent(lines[i:j])
            if COMMAND.match(code[0]):
                blocks.append(_block(page, lines, i, code))
            i = j
            continue
        i += 1
    return blocks, problems


def site_blocks() -> tuple[list[Block], list[str]]:
    """Every page's shell examples, and every problem found."""
    blocks: list[Block] = []
    problems: list[str] = []
    for page in PAGES:
        b, p = scan(page)
        blocks += b
        problems += p
    return blocks, problems
