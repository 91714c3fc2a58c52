"""Batched verification kernels: the decisions of ``hsd_core``'s samplers, over tensors.

Every kernel here is the tensor form of one piece of ``hsd_core`` and makes **the same decisions
on the same uniforms**:

=========================  ==========================================================
kernel                     reference it mirrors
=========================  ==========================================================
:func:`sample`             :func:`hsd_core.rand.inverse_cdf` (``UniformRand.categorical``)
:func:`rejection_verify`   :meth:`hsd_core.methods.base.RejectionVerifier.verify` (SD, TLI)
:func:`exact_match_verify` the verification loop of :meth:`hsd_core.methods.slem.SLEM.step`
=========================  ==========================================================

Shapes: ``B`` rows (independent sequences), ``K`` draft positions (ragged: row ``b`` uses its
first ``n_drafts[b]``), ``V`` the width of the probability vectors (a model's logits may be wider
than its tokenizer; columns of probability 0 are never emitted). Tensors may live on any device;
the outputs live on the device of ``p``. No Python loop runs over the vocabulary: the laws are
gathered, compared and sampled by tensor operations; the verifiers' small ``[B, K]`` decisions (the
run of passing drafts, the cut at an EOS or a budget, the assembly of the output) are read back once
and made on the host, where one pass over ``B x K`` booleans costs less than the two dozen tensor
operations it replaces (``Verified`` keeps the host lists, so a caller reads them without a sync).

Which uniforms a row reads, in the order the reference reads them (so that a
``hsd_core.rand.UniformRand`` fed that list reproduces the row):

* :func:`rejection_verify`: ``u_accept[b, j]`` for each draft tested (``j = 0 .. n_tested - 1``,
  where ``n_tested = n_accepted + 1`` after a rejection, ``n_accepted`` otherwise), then
  ``u_final[b]`` if and only if ``n_emitted > n_accepted`` (a correction or a bonus was drawn).
  Greedy reads none.
* :func:`exact_match_verify`: ``u[b, 0 .. n_emitted - 1]``, one per emitted token. Greedy reads none.
* :func:`sample`: ``u[b]``.

Numerics (every rule below is tested in ``tests/torch/engine/test_kernels.py``):

* **Compute dtype.** float64 inputs are computed in float64; float32, float16 and bfloat16 in
  float32 (:func:`compute_dtype`). Only the rows a decision needs are converted (the gathered
  ``p(x)``, ``q(x)`` and the one law each row finally samples from; :func:`exact_match_verify`
  converts every position, since it samples at every one). In float64 on the CPU the decisions are
  bit-identical to the reference (``torch.cumsum`` accumulates left to right there, as the
  reference does); in float32, or on CUDA whose scan adds in another order, they differ only where
  a uniform falls within rounding of a boundary (the measured rate is in ``docs/kernels.md``).
* **Inverse CDF.** ``cs = cumsum(probs)``; the index is the first ``i`` with
  ``u * cs[-1] < cs[i]``; it never has probability 0 (a zero entry leaves ``cs`` unchanged). When
  rounding pushes ``u * cs[-1]`` to ``cs[-1]`` or past it, the result is the last index of
  positive probability, as in the reference. Rows need not be normalized.
* **Kept heads.** Where a :class:`LazyLaw`'s processing gives a :class:`HeadLaw` (top-p with a strict
  boundary, ``generate``'s target laws), the CPU reads the laws on their kept heads: the draws
  (:meth:`LazyLaw.draw`), the ratio tests' ``p(x)`` (:meth:`LazyLaw.at_columns`) and a correction's
  residual at batch 1, each the dense path's bits (argued in :meth:`LazyLaw.draw`, tested in
  ``tests/torch/engine/test_head_draws.py``); a law is written out only where a dense row is read.
  The drafter's laws come as kept heads too (SLEM's draws; TLI's draws and its q, pushed onto
  target columns from the heads: :func:`hsd_torch.methods.tli.push_laws`), but ``q`` reaches these
  kernels dense.
* **A draft whose q underflowed to 0** (it was drawn, so its true q is positive): the ratio
  ``p/q`` is taken as ``+inf`` when ``p(x) > 0`` (accept: the exact ratio is at least
  ``p(x) / q_min``, beyond 1 whenever the underflow was to a value below ``p(x)``), and as 0
  when ``p(x) = 0``. A token the target gives probability 0 is never accepted.
* **A residual ``max(p - q, 0)`` whose mass rounds to 0**: the correction is drawn from ``p``
  (exactly as :func:`hsd_core.laws.residual` does); in exact arithmetic a rejection implies a
  positive residual, so this is the rule that changes the law least. Residual mass lies only where
  ``p > q >= 0``, so a correction never has target probability 0.
* A NaN, infinite or negative entry, or no mass, in any law row a row may read (``p[b, :n+1]``,
  ``q[b, :n]``), raises ``ValueError``: never a NaN, never a silent wrong token. The check is two
  read-only reductions over those rows.
* ``check=False`` (every kernel) skips the value checks (uniform ranges, ids, ragged lengths,
  budgets, law rows) and their host synchronizations, for a caller that guarantees its inputs
  (``hsd_torch.generate`` builds its laws with a softmax and checks them once per round); shapes,
  dtypes and devices are still checked. On valid inputs the result is the same either way.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ._draws import (HeadLaw as HeadLaw, LazyLaw as LazyLaw, _residual_on_support as _residual_on_support,
    _rows_at as _rows_at, Verified as Verified, _INF as _INF, _NAN as _NAN, _NP as _NP, _argmax_host as _argmax_host,
    _check_law_rows as _check_law_rows, _check_uniforms as _check_uniforms, _draw_host as _draw_host,
    _fail_if as _fail_if, _host_tensor as _host_tensor, _inverse_cdf as _inverse_cdf,
    _last_positive as _last_positive, _searchsorted_draw as _searchsorted_draw, compute_dtype as compute_dtype,
    sample as sample)

__all__ = ["HeadLaw", "LazyLaw", "Verified", "compute_dtype", "exact_match_verify", "rejection_verify", "sample"]

ZOO_SEAMS = ("_rejection_host",)
"""What a variant of the bug zoo (:mod:`hsd_torch.auditing.variants`, ``bench/zoo.py``) may replace here, through
:func:`hsd_torch.auditing.variants.patch_seam`: the host-side rejection kernel (its inputs rewritten: a
permuted q, a skipped ratio test, a wrong residual; or recorded). Nothing else here is a seam."""

def _check_ragged(name: str, n: Tensor, batch: int, k: int, check: bool) -> None:
    if n.dim() != 1 or n.shape[0] != batch:
        raise ValueError(f"{name} must have shape [B] = [{batch}], got {tuple(n.shape)}")
    if n.dtype.is_floating_point or n.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {n.dtype}")
    if check:
        _fail_if((n < 0) | (n > k), f"{name} must lie in [0, {k}]")


def _stop_rule(ok: list[list[bool]], tokens: list[list[int]], eos_id: int | None,
               budget: list[int] | None) -> tuple[list[int], list[bool]]:
    """Shared by both verifiers, on the host (``[B, K]`` is small; one pass per row beats a dozen
    tensor ops at small batch): how many drafts are kept, and whether the row stops there.

    ``ok[b][j]`` says whether position ``j`` passes its test (False beyond ``n_drafts``);
    ``tokens[b][j]`` is the id kept there. The kept prefix is the run of passing positions, cut after
    the first kept EOS and at ``budget[b]``; a row cut that way stops without a final token.
    """
    n_acc: list[int] = []
    stopped: list[bool] = []
    for b, row in enumerate(ok):
        n, stop = 0, False
        for good, t in zip(row, tokens[b]):
            if not good:
                break
            n += 1
            if t == eos_id:
                stop = True
                break
        if budget is not None and n >= budget[b]:
            n, stop = budget[b], True
        n_acc.append(n)
        stopped.append(stop)
    return n_acc, stopped


def _check_budget(budget: Tensor | None, n_drafts: Tensor, batch: int, check: bool) -> Tensor | None:
    if budget is None:
        return None
    budget = budget.to(device=n_drafts.device)
    if budget.dim() != 1 or budget.shape[0] != batch or budget.dtype.is_floating_point:
        raise ValueError(f"budget must be an integer tensor of shape [B] = [{batch}]")
    if check:
        _fail_if(budget < 1, "budget must be >= 1 in every row")
        _fail_if(n_drafts > budget, "n_drafts must not exceed budget (the reference verifies at most budget drafts)")
    return budget


def _assemble(rows: list[list[int]], n_acc: list[int], k1: int, device: torch.device) -> Verified:
    """:class:`Verified` of the host decisions: ``rows[b]`` the emitted ids (the kept prefix and
    the final token, if any), ``tokens [B, K+1]`` padded with -1; one host-to-device copy for the
    three tensors."""
    flat: list[int] = []
    for row in rows:
        flat.extend(row)
        flat.extend([-1] * (k1 - len(row)))
    flat.extend(n_acc)
    flat.extend(len(r) for r in rows)
    batch = len(rows)
    out = torch.tensor(flat, dtype=torch.int64, device=device)
    return Verified(out[:batch * k1].view(batch, k1), out[batch * k1:batch * (k1 + 1)], out[batch * (k1 + 1):],
                    _host=([list(r) for r in rows], list(n_acc)))


def rejection_verify(
    p: Tensor,
    q: Tensor,
    drafts: Tensor,
    n_drafts: Tensor,
    u_accept: Tensor,
    u_final: Tensor,
    *,
    greedy: bool = False,
    eos_id: int | None = None,
    budget: Tensor | None = None,
    check: bool = True,
) -> Verified:
    """Standard speculative verification of drafted target ids, batched and ragged.

    ``p [B, K+1, V]``: the target's laws at each draft position and after the last (row ``b``
    reads ``p[b, :n_drafts[b] + 1]``). ``q [B, K, V]``: the laws (over target ids) the drafts were
    *actually* drawn from. ``drafts [B, K]`` target ids; ``n_drafts [B]`` in [0, K]; ``u_accept
    [B, K]`` and ``u_final [B]`` uniforms in [0, 1) (ignored when ``greedy``).

    Draft ``j`` is accepted when ``u_accept[b, j] < min(1, p_j(x_j) / q_j(x_j))`` (greedy: when
    ``x_j`` is the argmax of ``p_j``, ties to the lowest id); at the first rejection a correction
    token is drawn with ``u_final`` from ``norm(max(p_j - q_j, 0))`` (greedy: the argmax of
    ``p_j``); when every draft is accepted, a bonus token is drawn from ``p_{n}``. Optional, as in
    the reference: ``eos_id`` stops a row after an accepted EOS, ``budget [B]`` after that many
    accepted drafts (``n_drafts <= budget``), in both cases with no final token.

    Returns :class:`Verified`. The decisions equal those of
    :meth:`hsd_core.methods.base.RejectionVerifier.verify` fed the uniforms the row read, in the
    order listed in this module's docstring (bit for bit in float64 on the CPU). Underflowed q,
    empty residuals and invalid entries follow the rules of the module docstring.
    """
    if p.dim() != 3 or q.dim() != 3:
        raise ValueError(f"p must be [B, K+1, V] and q [B, K, V], got {tuple(p.shape)} and {tuple(q.shape)}")
    batch, k1, v = p.shape
    k = k1 - 1
    if k < 0 or q.shape != (batch, k, v):
        raise ValueError(f"q must have shape [B, K, V] = {(batch, k, v)} for p {tuple(p.shape)}, got {tuple(q.shape)}")
    if drafts.shape != (batch, k) or drafts.dtype != torch.int64:
        raise ValueError(f"drafts must be a LongTensor of shape {(batch, k)}, got {drafts.dtype} {tuple(drafts.shape)}")
    dev = p.device
    for name, t in (("q", q), ("drafts", drafts), ("n_drafts", n_drafts), ("u_accept", u_accept), ("u_final", u_final)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device} but p is on {dev}: put every input on one device")
    _check_ragged("n_drafts", n_drafts, batch, k, check)
    budget = _check_budget(budget, n_drafts, batch, check)
    if not greedy:
        if u_accept.shape != (batch, k) or u_final.shape != (batch,):
            raise ValueError(f"u_accept must be [B, K] = {(batch, k)} and u_final [B], got "
                             f"{tuple(u_accept.shape)} and {tuple(u_final.shape)}")
        if check:
            _check_uniforms(u_accept, "u_accept")
            _check_uniforms(u_final, "u_final")
    if check:
        valid = torch.arange(k, device=dev).unsqueeze(0) < n_drafts.unsqueeze(1)
        _fail_if(valid & ((drafts < 0) | (drafts >= v)), f"drafts must be ids in [0, {v})")
        _check_law_rows(p, torch.arange(k + 1, device=dev).unsqueeze(0) <= n_drafts.unsqueeze(1), "p")
        if not greedy:
            _check_law_rows(q, valid, "q")
    drafts_l: list[list[int]] = drafts.tolist()
    rows, n_acc, _ = _rejection_host(p, q, drafts_l, n_drafts.tolist(), None if greedy else u_accept.tolist(),
                                  None if greedy else u_final.tolist(), eos_id=eos_id,
                                  budget=None if budget is None else budget.tolist())
    return _assemble(rows, n_acc, k1, dev)


def _ratio_test(u: list[float], px: list[float], qx: list[float], cdt: torch.dtype) -> list[bool]:
    """``u < min(1, px / qx)`` elementwise, in ``cdt`` (float32 or float64) arithmetic: a ratio of
    at least 1 accepts whatever the uniform (``u < 1`` always holds, before any rounding), else
    ``u.to(cdt) < px / qx``. ``q = 0`` gives ``+inf`` (accept) for ``p > 0`` and NaN (reject) for
    ``p = 0``, and a NaN ratio rejects. In float32 the quotient of two float32 values is taken in
    double and rounded once to float32 (one NumPy cast for the list), which is the correctly rounded
    float32 quotient (double has more than 2 x 24 + 2 bits); quotients above 2 are taken as 2 first
    (the comparison with 1 makes them equal, and the cast cannot overflow). The ratio is compared
    with 1 first because a float64 uniform above ``1 - 2**-25`` rounds to 1.0 in float32, and
    ``1.0 < 1.0`` would reject a draft the target accepts with probability 1 (about 3 uniforms in
    1e8)."""
    ratios: list[float] = []
    for a, b in zip(px, qx):
        if b == 0.0:
            r = _INF if a > 0 else _NAN
        else:
            r = a / b
        ratios.append(2.0 if r > 2.0 else r)  # NaN stays NaN
    if cdt != torch.float64:
        ratios = np.array(ratios, dtype=np.float32).tolist()
        u = np.array(u, dtype=np.float32).tolist()
    return [r >= 1.0 or uu < r for uu, r in zip(u, ratios)]  # a NaN ratio fails both comparisons


def _rejection_host(p: Tensor | LazyLaw, q: Tensor | None, drafts: list[list[int]], n_drafts: list[int],
                    u_accept: list[list[float]] | None, u_final: list[float] | None, *, eos_id: int | None,
                    budget: list[int] | None, q_scale: list[list[float]] | None = None
                    ) -> tuple[list[list[int]], list[int], tuple[int, int] | None]:
    """:func:`rejection_verify`'s decisions, unchecked, from host lists (``drafts[b]`` holds ``K``
    ids, any id past ``n_drafts[b]``; ``u_accept`` None: greedy): ``(emitted ids per row,
    n_accepted per row, bad)``. What ``generate`` calls: its drafts, counts and uniforms are on the
    host already, so only the laws are read, position by position (``p`` a tensor or a
    :class:`LazyLaw`: a position's laws are read only for the rows still testing there, until each
    row's first rejection, kept EOS or budget), at the tested drafts (one gather each for ``p`` and
    ``q`` a position) and at the one row each final token is drawn from. ``q`` may be None where no
    row has a draft or when greedy (greedy never reads it). ``q_scale[b][j]`` (optional): ``q[b, j]`` is the
    law times that positive factor (a TLI drafter's unnormalized restriction, pushed); the law's
    entries are then ``q[b, j, x] / q_scale[b][j]``, each division rounded in the compute dtype
    (the same value on the host, for the ratio test, and on the device, for a residual).

    ``bad``: ``(row, position)`` of the first final token drawn from a ``p`` row that is not a law
    (its total mass, or greedy its maximum, read back with the draw, is not finite and positive),
    else None. A NaN or infinite logit makes the whole softmax row NaN, so its draft (if any) fails
    the ratio test (a NaN ratio rejects) and the final token is drawn from that row: every such
    row that a row's output depends on shows here, at no extra reduction."""
    law = p if isinstance(p, LazyLaw) else LazyLaw(p)
    batch, k1 = law.batch, law.positions
    k = k1 - 1
    cdt = torch.float64 if law.dtype == torch.float64 or (q is not None and q.dtype == torch.float64) else torch.float32
    dev = law.device
    ok = [[False] * k for _ in range(batch)]
    running = [b for b in range(batch) if n_drafts[b] > 0]
    for j in range(k):  # position by position: the rows whose drafts so far all passed
        rows = [b for b in running if j < n_drafts[b]]
        if not rows:
            break
        pairs = [(b, j) for b in rows]
        if u_accept is None:  # greedy: the draft must be p's argmax (ties to the first column)
            passed = [a == drafts[b][j] for a, b in zip(_argmax_host(law.rows(pairs))[0], rows)]
        else:
            assert q is not None, "drafts to test need their laws"
            xs = [drafts[b][j] for b in rows]
            px = law.at_columns(pairs, xs)  # p(x): from the kept heads where top-p gave them
            qx: list[float] = torch.take(q, _host_tensor([(b * k + j) * q.shape[-1] + x for b, x in zip(rows, xs)],
                                                         torch.int64, dev)).tolist()
            if q_scale is not None:  # each quotient rounded once in the compute dtype, as the device divides
                qx = [a / q_scale[b][j] for a, b in zip(qx, rows)]
                if cdt != torch.float64:
                    qx = np.array(qx, dtype=np.float32).tolist()
            passed = _ratio_test([u_accept[b][j] for b in rows], px, qx, cdt)
        running = []
        for b, good in zip(rows, passed):
            ok[b][j] = good
            if good and drafts[b][j] != eos_id and (budget is None or j + 1 < budget[b]):
                running.append(b)
    n_acc, stopped = _stop_rule(ok, drafts, eos_id, budget)
    has_final = [not s for s in stopped]
    final, totals = _final_tokens(law, q, n_acc, n_drafts, has_final, u_final, cdt, q_scale)
    bad = next(((b, n_acc[b]) for b in range(batch) if has_final[b] and not 0 < totals[b] < _INF), None)
    return [drafts[b][:n_acc[b]] + ([final[b]] if has_final[b] else []) for b in range(batch)], n_acc, bad


def _final_tokens(p: LazyLaw, q: Tensor | None, n_acc: list[int], n_drafts: list[int], has_final: list[bool],
                  u_final: list[float] | None, cdt: torch.dtype, q_scale: list[list[float]] | None = None
                  ) -> tuple[list[int], list[float]]:
    """The correction or bonus token of every row (any value where ``has_final`` is False): drawn
    with ``u_final`` (greedy, None: the argmax) from ``p[b, n_acc[b]]``, or after a rejection
    (``n_acc < n_drafts``, sampling) from ``norm(max(p - q, 0))`` at that position, ``p`` itself
    when that residual's mass (summed left to right, as the reference sums) is not positive; and
    the total mass (greedy: the maximum) of the law each was drawn from. ``q_scale``: as in
    :func:`_rejection_host`."""
    batch = p.batch
    dev = p.device
    if not any(has_final):
        return [0] * batch, [1.0] * batch
    if batch == 1:  # the usual case: the one row, no index tensors
        n = n_acc[0]
        if u_final is not None and n >= n_drafts[0]:  # a bonus: only its draw reads p there (on the heads, if kept)
            return p.draw([(0, n)], u_final, cdt)
        head = None if u_final is None or not p.sparse else p.head([(0, n)])
        if head is not None and u_final is not None:  # a correction from the residual on p's kept head
            assert q is not None
            got = _residual_on_support(head[0][0].to(cdt), q[0, n], None if q_scale is None else q_scale[0][n], cdt,
                                       u_final[0], head[1][0])
            if got is not None:
                return got
        p_sel = p.rows([(0, n)])
        if u_final is None:
            return _argmax_host(p_sel)
        law = p_sel if p_sel.dtype == cdt else p_sel.to(cdt)
        if n < n_drafts[0]:
            assert q is not None
            if p.sparse and head is None:
                got = _residual_on_support(law[0], q[0, n], None if q_scale is None else q_scale[0][n], cdt,
                                           u_final[0])
                if got is not None:
                    return got
            q_sel = q[:, n]
            q_sel = q_sel if q_sel.dtype == cdt else q_sel.to(cdt)
            if q_scale is not None:
                q_sel = q_sel / q_scale[0][n]
            diff = torch.sub(law, q_sel).clamp_(min=0)  # max(p - q, 0)
            mass = torch.cumsum(diff, dim=-1)[:, -1:]  # left to right, as the reference sums
            drawn = _draw_host(diff.div_(mass), u_final)
            if 0 < drawn[1][0] < _INF:
                return drawn
            # the residual's mass rounded to 0 (0 / 0: no total): the correction is drawn from p
        return _draw_host(law, u_final)
    live = [b for b in range(batch) if has_final[b]]  # a row without a final token reads no law
    at = [(b, n_acc[b]) for b in live]
    p_sel = p.rows(at).to(cdt)  # [L, V], a fresh buffer: the law after the kept prefix
    if u_final is None:
        ids, tot = _argmax_host(p_sel)
    else:
        ids, tot = _draw_host(_final_laws(p, p_sel, at, q, n_drafts, cdt, q_scale), [u_final[b] for b in live])
    out_ids, out_tot = [0] * batch, [1.0] * batch
    for b, i, t in zip(live, ids, tot):
        out_ids[b], out_tot[b] = i, t
    return out_ids, out_tot


def _final_laws(p: LazyLaw, p_sel: Tensor, at: list[tuple[int, int]], q: Tensor | None, n_drafts: list[int],
                cdt: torch.dtype, q_scale: list[list[float]] | None) -> Tensor:
    """The laws :func:`_final_tokens` draws from at ``at`` (``(row, n_acc)`` each; ``p_sel`` their
    laws, a fresh buffer it may change): the residual after a rejection where it has mass, else ``p``."""
    dev = p.device
    law = p_sel
    rej = [i for i, (b, n) in enumerate(at) if n < n_drafts[b]]  # indices into at
    if rej:  # in place on fresh buffers: large allocations dominate on the CPU
        assert q is not None
        scratch = _rows_at(q, [at[i][0] for i in rej], [at[i][1] for i in rej]).to(cdt)
        if q_scale is not None:
            scratch.div_(torch.tensor([[q_scale[at[i][0]][at[i][1]]] for i in rej], dtype=cdt, device=dev))
        every = len(rej) == len(at)  # p_sel is then changed in place
        if every:
            diff = p_sel.sub_(scratch).clamp_(min=0)  # max(p - q, 0)
        else:
            diff = p_sel.index_select(0, torch.tensor(rej, dtype=torch.int64, device=dev)).sub_(scratch).clamp_(min=0)
        mass = torch.cumsum(diff, dim=-1, out=scratch)[:, -1:]  # left to right, as the reference sums
        has_mass = (mass > 0).squeeze(-1).tolist()
        if every and all(has_mass):
            law = diff.div_(mass)
        else:  # rows whose residual has no mass keep p itself
            law = p.rows(at).to(cdt) if every else p_sel
            if any(has_mass):
                keep = torch.tensor([i for i, h in enumerate(has_mass) if h], dtype=torch.int64, device=dev)
                dst = torch.tensor([rej[i] for i, h in enumerate(has_mass) if h], dtype=torch.int64, device=dev)
                law.index_copy_(0, dst, diff.index_select(0, keep).div_(mass.index_select(0, keep)))
    return law


def exact_match_verify(
    p: Tensor,
    candidates: Tensor,
    n_candidates: Tensor,
    u: Tensor,
    *,
    greedy: bool = False,
    eos_id: int | None = None,
    budget: Tensor | None = None,
    check: bool = True,
) -> Verified:
    """SLEM's verification: the target draws its own token at every candidate position and keeps
    the prefix that matches the candidates, plus its own next token.

    ``p [B, K+1, V]`` the target's laws after each candidate prefix; ``candidates [B, K]`` target
    ids; ``n_candidates [B]`` in [0, K]; ``u [B, K+1]`` uniforms in [0, 1) (ignored when greedy).
    At position ``j`` the target's token is ``y_j = sample(p_j, u_j)`` (greedy: argmax). Tokens are
    emitted while ``y_j`` equals candidate ``j``; the first ``y_j`` that differs, or ``y_n`` after
    all ``n`` candidates matched, is emitted last. ``eos_id`` and ``budget [B]`` stop a row after a
    matched EOS or that many matches, with no further token, as the reference does.

    Returns :class:`Verified` (``n_accepted`` = matched candidates), with the decisions of the
    verification loop of :meth:`hsd_core.methods.slem.SLEM.step` fed ``u[b, :n_emitted[b]]``.
    """
    if p.dim() != 3:
        raise ValueError(f"p must be [B, K+1, V], got {tuple(p.shape)}")
    batch, k1, v = p.shape
    k = k1 - 1
    if k < 0 or candidates.shape != (batch, k) or candidates.dtype != torch.int64:
        raise ValueError(f"candidates must be a LongTensor of shape {(batch, k)}, got "
                         f"{candidates.dtype} {tuple(candidates.shape)}")
    dev = p.device
    for name, t in (("candidates", candidates), ("n_candidates", n_candidates), ("u", u)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device} but p is on {dev}: put every input on one device")
    _check_ragged("n_candidates", n_candidates, batch, k, check)
    budget = _check_budget(budget, n_candidates, batch, check)
    if not greedy:
        if u.shape != (batch, k1):
            raise ValueError(f"u must be [B, K+1] = {(batch, k1)}, got {tuple(u.shape)}")
        if check:
            _check_uniforms(u, "u")
    cdt = compute_dtype(p)
    if check:
        used = torch.arange(k1, device=dev).unsqueeze(0) <= n_candidates.unsqueeze(1)  # positions a row may read
        _check_law_rows(p, used, "p")
    cand_l: list[list[int]] = candidates.tolist()
    rows, n_acc, _ = _exact_match_host(p, cand_l, n_candidates.tolist(), None if greedy else u.tolist(), eos_id=eos_id,
                                    budget=None if budget is None else budget.tolist())
    return _assemble(rows, n_acc, k1, dev)


def _exact_match_host(p: Tensor | LazyLaw, candidates: list[list[int]], n_candidates: list[int],
                      u: list[list[float]] | None, *, eos_id: int | None, budget: list[int] | None
                      ) -> tuple[list[list[int]], list[int], tuple[int, int] | None]:
    """:func:`exact_match_verify`'s decisions, unchecked, from host lists (``candidates[b]`` holds
    ``K`` ids; ``u[b]`` ``K + 1`` uniforms, None: greedy): ``(emitted ids per row, n_accepted per
    row, bad)``. The target draws position by position (``p`` a tensor or a :class:`LazyLaw`),
    at each position for the rows whose draws so far all matched (one cumulative sum over those
    rows' laws, :meth:`LazyLaw.draw`: on top-p's kept heads alone where the laws came as
    :class:`HeadLaw`, the dense draw's bits), until each row's first mismatch, matched EOS or budget:
    the draws that are emitted, and no other; ``bad`` is the first ``(row, position)`` whose draw
    was emitted from a ``p`` row that is not a law (total mass, or greedy maximum, not finite and
    positive), else None."""
    law = p if isinstance(p, LazyLaw) else LazyLaw(p)
    batch, k1 = law.batch, law.positions
    k = k1 - 1
    cdt = torch.float64 if law.dtype == torch.float64 else torch.float32
    y_l = [[-1] * k1 for _ in range(batch)]
    totals: dict[tuple[int, int], float] = {}
    running = list(range(batch))
    for j in range(k1):
        if not running:
            break
        if u is None:
            at = law.rows([(b, j) for b in running])
            ys, ts = _argmax_host(at if at.dtype == cdt else at.to(cdt))
        else:  # only the draw reads these laws: from the kept heads where top-p gave them (LazyLaw.draw)
            ys, ts = law.draw([(b, j) for b in running], [u[b][j] for b in running])
        nxt = []
        for b, y, t in zip(running, ys, ts):
            y_l[b][j], totals[b, j] = y, t
            if j < n_candidates[b] and y == candidates[b][j] and y != eos_id and (budget is None or j + 1 < budget[b]):
                nxt.append(b)
        running = nxt
    ok = [[j < n_candidates[b] and y_l[b][j] == candidates[b][j] for j in range(k)] for b in range(batch)]
    n_acc, stopped = _stop_rule(ok, y_l, eos_id, budget)
    rows = [y_l[b][:n_acc[b]] + ([y_l[b][n_acc[b]]] if not stopped[b] else []) for b in range(batch)]
    bad = next(((b, j) for b in range(batch) for j in range(len(rows[b])) if not 0 < totals[b, j] < _INF), None)
    return rows, n_acc, bad
