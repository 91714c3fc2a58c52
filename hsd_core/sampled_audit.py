"""``hsd audit --sampled N``: every method and every lossy variant of the toy world audited by sampling.

:func:`sampled_audit_all` runs :func:`hsd_core.audit.audit_sampler` on each correct method of the
built-in world and on each variant of :data:`hsd_core.variants.VARIANTS` and
:data:`hsd_core.variants.TREE_VARIANTS` on its pinned world, prints a line each and writes an optional
markdown report with plots: the correct methods must pass and the variants be caught.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from .audit import AuditReport, audit_sampler
from .stats.outputs import Output

__all__ = ["sampled_audit_all"]


def sampled_audit_all(
    methods: Sequence[tuple[str, Any]],
    n: int,
    report_path: str | None = None,
    progress: Any = None,
) -> int:
    """Audit, with ``n`` samples each, every ``(label, method)`` of ``methods`` on the built-in
    world (against the target law; greedy methods against the greedy one) and every variant of
    :data:`hsd_core.variants.VARIANTS` and :data:`hsd_core.variants.TREE_VARIANTS` on its pinned
    world (against the target law).

    Prints one line per sampler (verdict and detectable TV) to stdout and ``[i/total] label ...``
    progress lines to ``progress`` (default stderr). With ``report_path``, writes the markdown
    report there and, when matplotlib is importable, one PNG per sampler next to it. Seeds are
    fixed: ``numpy.random.default_rng(crc32(label))``. Returns 1 if a correct method is found
    lossy, else 0.
    """
    import zlib

    from . import exact, variants
    from .methods import SD
    from .worlds import builtin_world, from_spec

    out = sys.stderr if progress is None else progress
    world = builtin_world()
    jobs: list[tuple[str, bool, Any, Any, Any, str, int]] = []
    for lab, m in methods:
        drafter = world.same_vocab_drafter if isinstance(m, SD) else world.drafter
        jobs.append((lab, True, m, world.target, drafter, world.prompt, world.max_new_tokens))
    for name, mk in variants.VARIANTS.items():
        target, drafter, prompt = from_spec(variants.PINNED[name])
        jobs.append(("variant:" + name, False, mk(), target, drafter, prompt, variants.PINNED_MAX_NEW_TOKENS))
    for name, mk in variants.TREE_VARIANTS.items():
        target, drafter, prompt = from_spec(variants.TREE_PINNED[name])
        jobs.append(("variant:" + name, False, mk(), target, drafter, prompt,
                     int(variants.TREE_PINNED[name]["max_new_tokens"])))
    print()
    print(f"Sampled audit (hsd_core.audit.audit_sampler, n={n} samples each, family-wise alpha 1e-6, "
          "against the target law; variants on their pinned worlds):")
    reports: list[tuple[str, bool, AuditReport]] = []
    for i, (lab, correct, m, target, drafter, prompt, mnt) in enumerate(jobs, 1):
        print(f"[{i}/{len(jobs)}] {lab} ...", file=out, flush=True)
        law = exact.target_law(target, prompt, mnt, greedy=m.greedy)
        rng = np.random.default_rng(zlib.crc32(lab.encode()))

        def draw(m: Any = m, target: Any = target, drafter: Any = drafter, prompt: str = prompt,
                 mnt: int = mnt, rng: Any = rng) -> Sequence[int]:
            return list(m.generate(target, drafter, prompt, mnt, rng))

        def decode(s: Output, t: Any = target) -> str:
            return str(t.tokenizer.decode(s))

        rep = audit_sampler(draw, law, n=n, alpha=1e-6, text=decode,
                            rng_note=f"numpy default_rng(crc32({lab!r}))", name=lab)
        reports.append((lab, correct, rep))
        det = "n/a" if rep.detectable_tv is None else f"{rep.detectable_tv:.4f}"
        print(f"  {lab:34s} {rep.verdict:20s} detectable TV {det}")
    bad = [lab for lab, correct, rep in reports if correct and rep.verdict == "lossy"]
    missed = [lab for lab, correct, rep in reports if not correct and rep.verdict != "lossy"]
    if missed:
        print(f"  variants not rejected at n={n} (need more samples, or inconclusive): {missed}")
    if report_path is not None:
        _write_sampled_report(report_path, n, reports)
    if bad:
        print(f"ERROR: correct methods found lossy by sampling: {bad}")
        return 1
    return 0


def _write_sampled_report(report_path: str, n: int, reports: Sequence[tuple[str, bool, AuditReport]]) -> None:
    """Write :func:`sampled_audit_all`'s markdown report (a summary table, then each sampler's
    report) to ``report_path``, with one PNG per sampler next to it when matplotlib is importable."""
    import os

    stem, _ = os.path.splitext(report_path)
    parts = [f"# hsd sampled audit (n={n} per sampler)", "",
             "| sampler | expected | verdict | detectable TV |", "|---|---|---|---|"]
    for lab, correct, rep in reports:
        det = "n/a" if rep.detectable_tv is None else f"{rep.detectable_tv:.4g}"
        parts.append(f"| {lab} | {'lossless' if correct else 'lossy'} | {rep.verdict} | {det} |")
    parts.append("")
    os.makedirs(os.path.dirname(os.path.abspath(report_path)), exist_ok=True)
    for lab, _correct, rep in reports:
        slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in lab)
        png = f"{stem}_{slug}.png"
        parts.append(rep.to_markdown(title=lab))
        if rep.save_plot(png, title=lab):
            parts += [f"![{lab}]({os.path.basename(png)})", ""]
    with open(report_path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    print(f"  report written to {report_path}")
