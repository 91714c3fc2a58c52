"""Drafting token by token from a drafter's processed law, over a batch (SD, TLI, SLEM, one-token
SLRS): each active row's drafter context is re-synced and fed, then up to ``k[i]`` draws, one
drafter pass per draft position. What differs between methods is given, not branched on:
the columns drafted from and what each proposes (:class:`DraftColumns`), and the context.

Drafting uniforms: a row draws ``k[i]`` uniforms at the start of the round (one per possible
draft) and consumes the first ``n[i]`` of them, one per draft, in order (:func:`drafting_uniforms`).
Validity: each draw's law is checked by the mass the draw reads (NaN, infinite or zero): methods
that must propose raise ``ValueError``, the others stop drafting that row.

The dynamic draft length (``min_confidence``, SD, TLI, SLEM; ``hsd_core.methods.base.draft_autoregressive``):
before its second and every later draft, a row whose law drawn from has a largest probability
(:func:`confidence`: the largest entry over the row's mass, so TLI's slice reads as q_cap) below
``min_confidence`` stops drafting; its first draft is always made. The stop reads only the
drafter's law, so each row stops on its own, and a batch's rows may draft different lengths.
A stopped row consumes no uniform for the draft it did not make.

Where the verification reads no drafter law (``DraftColumns.laws_read`` False: SLEM's exact match),
the laws are read only by the draws and the confidence: they are not kept, each position's law is
computed for the rows still drafting alone, and under top-p on the CPU it stays top-p's kept head
(:class:`hsd_torch.engine.kernels.HeadLaw`: no dense write-back, the draw's cumulative sum over the
head alone), with the dense draws' ids and masses bit for bit (the argument of
:meth:`hsd_torch.engine.kernels.LazyLaw.draw`; ``tests/torch/engine/test_draft_heads.py``).
Where the verification reads the laws from their heads (``DraftColumns.heads_read``: TLI, whose q is
the push of each law onto target columns, :meth:`hsd_torch.vocab.bridge._Push.heads`), the same: each
position's law is computed for the rows still drafting, drawn from its kept heads, and kept as a
:class:`HeadLaw` of the whole batch (:meth:`HeadLaw.at_rows`: a row not drafting there holds no entry)
in :attr:`Drafts.law_heads`; where a boundary ties or off the CPU, that position's law is dense
(the rows not drafting there hold zeros: the verification reads a row's law only where it drafted;
``tests/torch/engine/test_tli_heads.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
import torch
from torch import Tensor

from hsd_core.laws import Prob
from hsd_core.methods.resync import Resync, drafter_context_ids

from . import kernels
from ._draws import HeadLaw
from ._precision import nan_hint
from .laws import TextSpace, restricted_law, space_head_law, space_law
from .round_state import DraftColumns, Drafts, EngineState

__all__ = ["DraftColumns", "confidence", "draft_tokens", "drafter_context_from_text", "drafting_uniforms",
           "feed_drafter"]


def drafter_context_from_text(gen: EngineState, active: Sequence[bool], resync: Resync) -> None:
    """Each active row's drafter context becomes its ids of (prompt + emitted text) under ``resync``
    (``hsd_core.methods.resync.drafter_context_ids``, the rule ``hsd_core``'s SLEM and SLRS use, over
    bytes), after its special prefix (and its own chat template's ids of a conversation,
    ``gen.d_head``): the drafter is re-synced from the accepted text (SLEM, SLRS), re-encoding
    only the tail that can change (each row keeps a memo of its committed blocks, and its emitted
    text is decoded once per id). What the drafter cannot encode is left out
    (``TokenText.encode(free=True)``: its context only shapes proposals)."""
    dt, tt = gen.dt, gen.tt
    assert dt is not None

    def encode(b: bytes) -> list[int]:
        return dt.encode(b, free=True)

    for i in range(gen.batch):
        if not active[i]:
            continue
        n, text = gen.e_text[i]
        emitted = gen.emitted[i]
        if n > len(emitted):  # never within a generation (emitted ids only grow): start afresh
            n, text = 0, b""
        text += tt.decode(emitted[n:])
        gen.e_text[i] = (len(emitted), text)
        gen.d_ctx[i] = gen.d_start[i] + gen.d_head[i] + drafter_context_ids(gen.prompt_bytes[i] + text, encode,
                                                                            dt.decode, resync, gen.d_memos[i])


def drafting_uniforms(gen: EngineState, k: Sequence[int]) -> list[list[float]]:
    """``k[i]`` fresh uniforms of row ``i``'s stream (empty lists when greedy)."""
    if gen.greedy:
        return [[] for _ in range(gen.batch)]
    return [gen.rngs[i].random(k[i]).tolist() if k[i] else [] for i in range(gen.batch)]


def feed_drafter(gen: EngineState, contexts: Sequence[Sequence[int] | None], head: Tensor | None = None) -> Tensor:
    """Re-sync each row's drafter cache to ``contexts[i]`` (None: the row is not fed) and run the
    drafter once: its logits ``[B, Vd]`` after each fed context (zeros for rows not fed); with
    ``head`` (int64 ids), those ids' logits alone, ``[B, len(head)]``."""
    drun = gen.drun
    assert drun is not None
    blocks = [drun.sync(i, c) if c is not None else [] for i, c in enumerate(contexts)]
    return drun.feed(blocks, [len(b) - 1 for b in blocks], None, head)


def confidence(law: Tensor | HeadLaw, rows: Sequence[int]) -> list[float]:
    """The drafter's confidence at each of ``rows`` of ``law [B, N]`` (non-negative weights over the
    drafting columns, need not be normalized: TLI's slice; or a :class:`HeadLaw`, read from its kept
    heads): the row's largest entry divided by its total, the total summed left to right as a draw
    from the row sums it (:func:`hsd_torch.engine.kernels._draw_host`), i.e. the largest probability
    of the law a draw from that row samples (NaN for a row with no mass, which the draw's own check
    then reports). Read back to the host. A :class:`HeadLaw` gives the dense rows' bits on the CPU: its
    largest value is the row's, and its cumulative sum ends on the row's (``LazyLaw.draw``'s argument)."""
    x = law.vals if isinstance(law, HeadLaw) else law
    sub = x if len(rows) == x.shape[0] else x.index_select(
        0, torch.tensor(list(rows), dtype=torch.long, device=x.device))
    out: list[float] = (sub.amax(dim=-1) / torch.cumsum(sub, dim=-1)[:, -1]).tolist()
    return out


def _step_law(gen: EngineState, last: Tensor, cols: DraftColumns, rows: list[int], heads: bool
              ) -> tuple[Tensor | HeadLaw, list[int]]:
    """The law drafted from at one position, ``[R, n_draw]``, and the batch rows ``R`` its rows are.
    Without ``heads``: every row of the batch, a tensor (what :attr:`Drafts.laws` keeps). With
    ``heads`` (the laws are read only by the draws; sampling, the whole processed law): ``rows``
    alone (each law row is a function of its own logits row: the same bits), as
    :func:`hsd_torch.engine.laws.space_head_law` gives them: a :class:`HeadLaw` (its :meth:`HeadLaw.prefix`
    at ``n_draw``) where top-p's boundary is strict on every row and the logits are on the CPU, else
    the dense law (a head off the CPU is written out: there the draw's scan adds in another order).
    With ``heads`` and ``cols.heads_read`` (the verification reads the laws: TLI), the laws of ``rows``
    are returned as rows of the whole batch (the others with no entry, or zeros where dense): every
    row's law where it drafts, at the row the verification indexes."""
    batch = list(range(last.shape[0]))
    if cols.head is not None:  # the drafting columns' logits alone
        return restricted_law(last, gen.d_process.temperature), batch
    space, n_draw, drop = cols.space, cols.n_draw, gen.d_drop
    assert drop is not None
    if not heads:
        full = space_law(last, space, drop, *gen.d_process.args())
        return (full if n_draw == space.n else full[:, :n_draw]), batch
    sub = last if rows == batch else last.index_select(0, torch.tensor(rows, dtype=torch.long, device=last.device))
    got = space_head_law(sub, space, drop, *gen.d_process.args())
    law: Tensor | HeadLaw
    if isinstance(got, HeadLaw) and sub.device.type == "cpu":
        law = got.prefix(n_draw)
    else:
        dense = got.dense() if isinstance(got, HeadLaw) else got
        law = dense if n_draw == space.n else dense[:, :n_draw]
    if not cols.heads_read or rows == batch:
        return law, rows
    if isinstance(law, HeadLaw):
        return law.at_rows(rows, len(batch)), batch
    idx = torch.tensor(rows, dtype=torch.long, device=law.device)
    return law.new_zeros((len(batch), law.shape[1])).index_copy_(0, idx, law), batch


def _pick(law: Tensor | HeadLaw, at: list[int], u: Tensor | None) -> tuple[list[int], list[float]]:
    """The drafting columns picked from rows ``at`` of ``law`` and the mass each read: the
    argmax (``u`` None: greedy, a tensor law) or the inverse-CDF draw with ``u`` (one uniform a row),
    from a :class:`HeadLaw`'s kept heads as :meth:`hsd_torch.engine.kernels.LazyLaw.draw` draws
    (the dense draw's bits)."""
    vals, hcols = (law.vals, law.cols) if isinstance(law, HeadLaw) else (law, None)
    if len(at) != vals.shape[0] or at != list(range(len(at))):
        idx = torch.tensor(at, dtype=torch.long, device=vals.device)
        vals, hcols = vals.index_select(0, idx), None if hcols is None else hcols.index_select(0, idx)
    if u is None:
        assert hcols is None, "a greedy draft reads the dense law"
        return kernels._argmax_host(vals)
    return kernels._draw_host(vals, u, hcols)


def draft_tokens(gen: EngineState, active: Sequence[bool], k: Sequence[int], cols: DraftColumns,
                 min_confidence: Prob | None = None) -> tuple[Drafts, list[list[int]]]:
    """Up to ``k[i]`` drafts for each active row from the drafter's processed law at
    ``gen.d_ctx[i]`` followed by the drafts so far (argmax when greedy, ties to the first column),
    stopping after the drafter's EOS and, with ``min_confidence`` (a probability in (0, 1], as
    ``hsd_core.methods.base.check_confidence`` returns it), before a row's second or later draft
    whose law's :func:`confidence` is below it. Returns the :class:`Drafts` (with ``cols`` filled when
    ``cols.to_target`` is given, and the laws drawn from when ``cols.laws_read``) and each row's
    drafted drafter ids. Where no verification reads the laws (``cols.laws_read`` False) and the
    drafts are sampled, each position's law is computed for the rows still drafting only and, under
    top-p on the CPU, drawn from its kept heads (:func:`_step_law`): the same drafts and masses; with
    ``cols.heads_read`` the same, and the laws are kept in ``Drafts.law_heads``."""
    batch, greedy, dev, dt = gen.batch, gen.greedy, gen.dev, gen.dt
    assert dt is not None and gen.d_drop is not None
    out = Drafts.empty(batch)
    d_uniforms = drafting_uniforms(gen, k)
    u_round: Tensor | None = None  # [max(k), B, 1] in the laws' dtype, made at the first draw
    u_steps: tuple[Tensor, ...] = ()  # its [B, 1] slices, one per draft position
    d_ctx, space, to_target = gen.d_ctx, cols.space, cols.to_target
    heads = (cols.heads_read or not cols.laws_read) and not greedy and cols.head is None
    still = [k[i] > 0 for i in range(batch)]
    drafts_d: list[list[int]] = [[] for _ in range(batch)]
    last = feed_drafter(gen, [d_ctx[i] if active[i] else None for i in range(batch)], cols.head)
    for j in range(max(k, default=0)):
        rows = [i for i in range(batch) if still[i]]
        if not rows:
            break
        law, of = _step_law(gen, last, cols, rows, heads)
        at = {r: a for a, r in enumerate(of)}  # a batch row's row in the law
        if min_confidence is not None and j > 0:  # the dynamic draft length: the first draft is always made
            for r, c in zip(rows, confidence(law, [at[r] for r in rows])):
                if c < min_confidence:
                    still[r] = False
            rows = [i for i in rows if still[i]]
            if not rows:
                break
        if not greedy and u_round is None:  # one host-to-device copy a round
            u_round = kernels._host_tensor([[[r[j] if j < len(r) else 0.0] for r in d_uniforms] for j in range(max(k))],
                                           law.vals.dtype if isinstance(law, HeadLaw) else law.dtype, dev)
            u_steps = u_round.unbind(0)
        u = None if u_round is None else u_steps[j] if len(rows) == batch else u_round[
            j, torch.tensor(rows, dtype=torch.long, device=dev)]
        picked, mass = _pick(law, [at[r] for r in rows], u)
        if cols.heads_read:
            out.law_heads.append(law)
        elif cols.laws_read:
            assert isinstance(law, Tensor)
            out.laws.append(law)
        for r, c, m in zip(rows, picked, mass):
            if not (0 < m < float("inf")):  # NaN, infinite or no mass on the columns drafted from
                if not cols.stop_on_empty:
                    hint = nan_hint(gen.drun.model) if gen.drun is not None else ""
                    raise ValueError(f"the drafter's law at row {r}, position {j} has NaN, infinite or no "
                                     f"mass (NaN or infinite logits?): generation cannot go on{hint}")
                still[r] = False  # no mass on the columns drafted from: the target decodes
                continue
            d = space.ids[c]
            drafts_d[r].append(d)
            if to_target is not None:
                out.cols[r].append(to_target[c])
            out.mass[r].append(m)
            out.n[r] += 1
            if not greedy:
                gen.record(r, d_uniforms[r][j:j + 1])
            if d == dt.eos_id or out.n[r] >= k[r]:
                still[r] = False
        if not any(still):
            break
        last = feed_drafter(gen, [d_ctx[i] + drafts_d[i] if still[i] else None for i in range(batch)], cols.head)
    return out, drafts_d
