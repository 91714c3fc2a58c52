"""The verification step every method ends a round with: one target forward pass over each active
row's pending context and proposals, then the kernels' decisions on the host
(:func:`hsd_torch.engine.kernels._exact_match_host`, :func:`hsd_torch.engine.kernels._rejection_host`, the code
the public kernels run).

The kernels run unchecked: their inputs are valid by construction (uniforms from numpy in
``[0, 1)``, drafts and counts built by the method); each draft's law was checked where it was
drawn (its mass read back), and the kernels report a target law that is not one (``bad``: a NaN
softmax row shows in the draw from it, which every output read from such a row makes):
``ValueError`` here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from . import kernels
from ._precision import nan_hint
from .laws import space_head_law
from .processors import process_target_logits
from .round_state import Drafts, EngineState, Verdicts

__all__ = ["TargetPass", "exact_match", "rejection", "target_pass"]

ZOO_SEAMS = ("space_head_law",)
"""What a variant of the bug zoo may replace here (:func:`hsd_torch.auditing.variants.patch_seam`): the name
:func:`target_pass` builds the target's processed law with (a verification that ignores top-k /
top-p)."""


@dataclass
class TargetPass:
    """The target's processed laws ``p [B, kmax + 1, Nt]`` (over its text space; float32, or
    float64 for a float64 model) at each row's proposals and one column past them, processed from
    its logits where the kernels read them (:class:`hsd_torch.engine.kernels.LazyLaw`: a round processes
    the positions up to each row's first rejection or mismatch, not all ``kmax + 1``), the
    proposals as target columns padded to ``kmax`` (``cand``), and each row's budget (at least 1 for an
    active row; 0 for an inactive one, which reads no law and gets no token)."""

    p: kernels.LazyLaw
    cand: list[list[int]]
    kmax: int
    budget: list[int]


def target_pass(gen: EngineState, active: list[bool], budget: list[int], drafts: Drafts) -> TargetPass:
    """One target forward pass: each active row's pending context (what its cache lacks of its
    context) followed by its proposals."""
    trun, t_space = gen.trun, gen.t_space
    n_d, drafts_t = drafts.n, drafts.cols
    pend = [trun.sync(i, gen.t_ctx[i]) if active[i] else [] for i in range(gen.batch)]
    kmax = max(n_d)
    logits = trun.feed([pend[i] + [t_space.ids[c] for c in drafts_t[i]] if active[i] else []
                        for i in range(gen.batch)], [len(pend[i]) - 1 for i in range(gen.batch)], kmax + 1)
    if gen.near is not None and trun.hidden is not None:  # greedy, reduced precision: near ties in float32
        logits, checked, flips = gen.near.apply(logits, trun.hidden)
        for i in range(gen.batch):
            gen.near_ties[i] += checked[i]
            gen.tie_flips[i] += flips[i]
    if gen.processors or gen.min_new_tokens:  # the caller's processors, min_new_tokens (hsd_torch.engine.processors)
        full = [gen.t_ctx[i] + [t_space.ids[c] for c in drafts_t[i]] if active[i] else None for i in range(gen.batch)]
        logits = process_target_logits(logits, full, [n + 1 for n in n_d], [len(e) for e in gen.emitted],
                                       gen.processors, gen.min_new_tokens, sorted(gen.ends))
    process = gen.process.args()

    def law(block: Tensor) -> Tensor | kernels.HeadLaw:  # with top-p, the kept heads (written out only if a row is read)
        return space_head_law(block, t_space, gen.t_drop, *process)
    cand = [row + [0] * (kmax - len(row)) for row in drafts_t]
    sparse = gen.process.reads_every_logit  # top-k or top-p: the laws keep few columns
    # an inactive row's budget is 0: it stops before any position, so no law of it is processed
    return TargetPass(kernels.LazyLaw(logits, law, sparse=sparse), cand, kmax,
                      [max(b, 1) if a else 0 for a, b in zip(active, budget)])


def _check(bad: tuple[int, int] | None, gen: EngineState) -> None:
    if bad is not None:  # rows not fed this round read zero logits: a uniform law, never bad
        raise ValueError(f"the target's law at row {bad[0]}, position {bad[1]} has NaN, infinite or no mass "
                         f"(NaN or infinite logits?): generation cannot go on{nan_hint(gen.trun.model)}")


def exact_match(gen: EngineState, active: list[bool], budget: list[int], drafts: Drafts) -> Verdicts:
    """Exact-match verification (AR, SLEM): the target draws its own token at every proposal
    position (one uniform each, plus one for the bonus; greedy: argmax) and keeps the proposals
    while they equal its draws."""
    tp = target_pass(gen, active, budget, drafts)
    n_d = drafts.n
    uv_rows = None if gen.greedy else [gen.rngs[i].random(n_d[i] + 1).tolist() if active[i] else []
                                       for i in range(gen.batch)]
    rows_pos, n_acc, bad = kernels._exact_match_host(
        tp.p, tp.cand, n_d, None if uv_rows is None else [r + [0.0] * (tp.kmax + 1 - len(r)) for r in uv_rows],
        eos_id=gen.t_eos_col, budget=tp.budget)
    _check(bad, gen)
    read = [] if uv_rows is None else [uv_rows[i][:len(r)] for i, r in enumerate(rows_pos)]
    return Verdicts(rows_pos, n_acc, read)


def rejection(gen: EngineState, active: list[bool], budget: list[int], drafts: Drafts,
              q_of: Callable[[int], Tensor], q_scale: list[list[float]] | None = None) -> Verdicts:
    """Rejection-sampling verification (SD, TLI, SLRS): proposal ``j`` of row ``i`` is accepted
    with probability ``min(1, p/q)``, a rejected one replaced by a draw from the residual, a bonus
    drawn from ``p`` after the last. ``q_of(kmax)`` gives the proposal laws ``[B, kmax, Nt]`` over
    the target's text space (called only when sampling with at least one proposal); ``q_scale[i][j]``,
    if given, divides ``q[i, j]`` (TLI's laws are pushed unnormalized: each is divided by the mass
    its draw read, summed left to right as ``hsd_core`` normalizes)."""
    tp = target_pass(gen, active, budget, drafts)
    n_d, kmax = drafts.n, tp.kmax
    q = None if gen.greedy or not kmax else q_of(kmax)
    # one draw of n_d + 1 uniforms: the same stream as n_d for the drafts, then one for the final token
    u_ver = None if gen.greedy else [gen.rngs[i].random(n_d[i] + 1).tolist() if active[i] else [0.0]
                                     for i in range(gen.batch)]
    ua_rows = None if u_ver is None else [r[:-1] for r in u_ver]
    uf_rows = None if u_ver is None else [r[-1] for r in u_ver]
    rows_pos, n_acc, bad = kernels._rejection_host(
        tp.p, q, tp.cand, n_d, None if ua_rows is None else [r + [0.0] * (kmax - len(r)) for r in ua_rows],
        uf_rows, eos_id=gen.t_eos_col, budget=tp.budget, q_scale=q_scale)
    _check(bad, gen)
    read: list[list[float]] = []
    if ua_rows is not None and uf_rows is not None:
        for i, (na, row) in enumerate(zip(n_acc, rows_pos)):
            ne = len(row)
            tested = na + 1 if (ne > na and na < n_d[i]) else na
            read.append(ua_rows[i][:tested] + ([uf_rows[i]] if ne > na else []))
    return Verdicts(rows_pos, n_acc, read)
