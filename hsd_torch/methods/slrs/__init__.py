"""SLRS: string-level rejection sampling, over a batch (``hsd_core.methods.slrs``): the paper's
one-token SLRS at lookahead 1 (:class:`SLRS`) and the bounded procedure of docs/slrs.md
(:class:`BoundedSLRSMethod`, psi level by level: :mod:`.psi`, over the byte trie of :mod:`.trie`,
with the tree's drafter passes of :mod:`.tree`).

Glossary
    draft       a drafter token, drawn from the drafter's processed law in its own vocabulary.
    lookahead   k, the number of drafter tokens drafted per round: at most ``min(k, budget)`` (no round
                drafts more drafter tokens than it can emit target tokens), fewer after drafter EOS.
    proposal    the target id(s) read off the drafted text: one-token SLRS, the first target id of
                the target's encoding of the draft's text alone (:class:`FirstTargetMap`; the
                target's EOS for the drafter's); bounded SLRS, the longest target token prefixing
                the text (multi-token: the first ``min(max_tokens, budget)`` ids of its
                longest-prefix parse).
    psi         the exact law of the proposal under that drafting procedure; multi-token, psi_j is
                the law of the j-th proposed id given the first j-1.
    accepted    proposed id t_j kept with probability min(1, p_j(t_j) / psi_j(t_j)).
    rejected / correction   the first proposal that fails; a token from norm(max(p_j - psi_j, 0)).
    bonus       a token from p after the last proposal, when every proposal is accepted.

Steps of one round
    1. Drafter context = its encoding of (prompt + emitted text), recomputed every round
       (:func:`hsd_torch.engine.drafting.drafter_context_from_text`).
    2. One-token: one draft from the drafter's law (:func:`hsd_torch.engine.drafting.draft_tokens`; a law
       with no mass raises ``ValueError``); psi = the pushforward of that law along the first-target
       map (masses of drafter ids with one first target id add up). Bounded: the draft tree walked
       level by level, one batched drafter pass per level, the row's own draft drawn along it
       (:meth:`.psi.BoundedSLRS.round`, :meth:`~.psi.BoundedSLRS.round_multi`).
    3. Rejection verification (:func:`hsd_torch.engine.verification.rejection`) against psi.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hsd_core.methods.resync import Resync

from ...engine._cache import IdentityCache
from ...engine.laws import TextSpace, process_with_drop
from ...engine.round_state import DraftColumns, Drafts, RoundView, Verdicts
from ...engine.validation import NotSupported, OptionNotTaken, UnknownChoice, check_max_tokens, check_min_path_prob
from ...vocab import _Push
from ...vocab.text import TokenText, Unencodable
from ..base import Method
from .psi import MAX_PSI_ROWS, BoundedSLRS, psi_bound
from .tree import TreeCache

__all__ = ["MAX_PSI_ROWS", "SLRS", "BoundedSLRSMethod", "FirstTargetMap", "psi_bound", "slrs_columns", "slrs_options"]

_COLUMNS: IdentityCache[Any] = IdentityCache(16)


def slrs_options(lookahead: int, min_path_prob: float | None, proposal_map: str | None, greedy: bool,
                 max_tokens: int | None = 1) -> bool:
    """Check ``generate``'s SLRS options; True for the bounded procedure of this module, False
    for the paper's one-token SLRS at lookahead 1 (``hsd_core``'s ``SLRS(lookahead=1,
    lookbehind=0)``, :class:`FirstTargetMap`, defined in this module). Refusals (``NotImplementedError``)
    name what would make psi finish (:class:`hsd_torch.engine.validation.NotSupported`); ``ValueError`` for a
    value out of range (``OutOfRange``; numpy numbers are numbers, bools are not), an unknown map
    (``UnknownChoice``), and ``min_path_prob`` with the one-token SLRS, which does not use it
    (``OptionNotTaken``)."""
    check_max_tokens(max_tokens)
    if max_tokens != 1 and proposal_map != "longest_prefix":
        raise NotSupported(
            f"method 'slrs' with max_tokens={max_tokens!r} needs the bounded procedure (proposal_map='longest_prefix' "
            "and min_path_prob=tau, docs/slrs.md, 'The bounded procedure'): multi-token proposals with the re-tokenizing map are not implemented")
    if proposal_map not in (None, "retokenize", "longest_prefix"):
        raise UnknownChoice(f"proposal_map must be None, 'retokenize' or 'longest_prefix', got {proposal_map!r}")
    check_min_path_prob(min_path_prob)
    if proposal_map == "longest_prefix":
        if lookahead > 1 and min_path_prob is None and not greedy:
            raise NotSupported(
                f"method 'slrs' with lookahead={lookahead} and no min_path_prob: psi would enumerate every "
                "drafter path (|D|^lookahead drafter rows; docs/slrs.md, 'The bounded procedure'); pass min_path_prob=tau (e.g. 0.05): psi then "
                "costs at most 1 + (lookahead - 1) / tau rows per round")
        if min_path_prob is not None and psi_bound(lookahead, min_path_prob) > MAX_PSI_ROWS:
            raise NotSupported(
                f"method 'slrs' with lookahead={lookahead}, min_path_prob={min_path_prob}: psi may need up to "
                f"{psi_bound(lookahead, min_path_prob):.0f} drafter rows per round and prompt, more than "
                f"{MAX_PSI_ROWS}; raise min_path_prob or lower the lookahead")
        return True
    if lookahead != 1:
        raise NotSupported(
            f"method 'slrs' with proposal_map={proposal_map!r} supports lookahead=1 only (the paper's one-token "
            f"SLRS), got lookahead={lookahead!r}: deeper lookaheads need the bounded procedure (docs/slrs.md), "
            "proposal_map='longest_prefix' with min_path_prob=tau (the re-tokenizing map would need a tokenizer "
            "call per drafter id per tree node); or use 'tli'/'slem' for longer drafts")
    if min_path_prob is not None:
        raise OptionNotTaken(
            "min_path_prob is an option of bounded SLRS (method 'slrs' with proposal_map='longest_prefix') only; "
            f"one-token SLRS (proposal_map={proposal_map!r}, lookahead 1: psi is exact, nothing to stop) does not "
            f"use it (got min_path_prob={min_path_prob!r})")
    return False



class FirstTargetMap:
    """SLRS at lookahead 1: drafter id -> the first target id of its text.

    ``first[d]``: for a drafter id with text, the first id of the target's encoding of that text
    alone (:meth:`TokenText.encode`, i.e. ``hsd_core``'s ``retokenize`` with look-behind 0, so the
    map does not depend on the context and is built once); the target's EOS for the drafter's EOS;
    -1 for ids without text (they never carry mass) and for ids whose text the target cannot encode
    (:class:`~hsd_torch.vocab.text.Unencodable`: SmolLM2 has no token for the byte 0xC0, a Gemma byte
    token), that it encodes to nothing (SmolLM2's tokenizer drops ``"\\x04"``) or whose first target
    id has no text: such an id proposes nothing (:attr:`unmappable`). psi, the law of the first
    target id of the draft's text given that there is one, is the pushforward of the drafter's law
    along the map (:class:`_Push`: the masses of all drafter ids with one first target id add up),
    divided by its total when some ids with text propose nothing. Built with one batched tokenizer
    call over the ids whose text is valid UTF-8 and :meth:`TokenText.encode` for the rest (partial
    characters)."""

    _cache: IdentityCache[FirstTargetMap] = IdentityCache()

    def __init__(self, tt: TokenText, dt: TokenText) -> None:
        vd = dt.vocab_size
        first = [-1] * vd
        valid: list[int] = []
        texts: list[str] = []
        for d, b in enumerate(dt.bytes_of):
            if b is None:
                continue
            try:
                texts.append(b.decode("utf-8"))
                valid.append(d)
            except UnicodeDecodeError:
                try:
                    first[d] = tt.encode(b)[0]
                except (Unencodable, IndexError):
                    pass
        if texts:
            enc = tt.tokenizer(texts, add_special_tokens=False)["input_ids"]
            for d, ids, text in zip(valid, enc, texts):
                if not all(tt.has_text(i) for i in ids):
                    try:  # a special token's text: read as text (TokenText.encode), as re-encoding does
                        ids = tt.encode(text.encode("utf-8"))
                    except Unencodable:
                        ids = []
                first[d] = int(ids[0]) if len(ids) else -1
        first[dt.eos_id] = tt.eos_id
        self.first: list[int] = first
        self.unmappable: list[int] = [d for d, b in enumerate(dt.bytes_of) if b is not None and first[d] < 0]
        """The drafter ids with text that propose no target id (see the class docstring)."""

    @classmethod
    def get(cls, tt: TokenText, dt: TokenText) -> FirstTargetMap:
        """The map for this pair of texts (built once per pair: a :class:`TokenText` is built once per
        tokenizer object, width and state, so a tokenizer changed in place gets a new map)."""
        return cls._cache.get((tt, dt), (), lambda: cls(tt, dt))



def slrs_columns(tt: TokenText, dt: TokenText, t_space: TextSpace, d_space: TextSpace,
                 device: torch.device) -> tuple[list[int], _Push]:
    """One-token SLRS: the target column of each drafter-space column's first target id
    (:class:`FirstTargetMap`) and psi, the pushforward of a drafter law along it (built once per
    pair of spaces and device)."""
    def build() -> tuple[list[int], _Push]:
        first = FirstTargetMap.get(tt, dt).first
        dst = [t_space.pos[first[d]] if first[d] >= 0 else -1 for d in d_space.ids]
        return dst, _Push(dst, t_space.n, device)
    out: tuple[list[int], _Push] = _COLUMNS.get((tt, dt, t_space, d_space), ("slrs", str(device)), build)
    return out


class SLRS(Method):
    """The paper's one-token SLRS at lookahead 1 (``hsd_core``'s ``SLRS(lookahead=1, lookbehind=0,
    resync=resync)``)."""

    name = "slrs"

    def __init__(self, resync: Resync = Resync()) -> None:
        super().__init__(lookahead=1)
        self.text_resync = resync

    def setup(self, gen: RoundView) -> None:
        """The first-target map's columns and psi's pushforward."""
        assert gen.dt is not None and gen.d_space is not None
        dst, self.push = slrs_columns(gen.tt, gen.dt, gen.t_space, gen.d_space, gen.dev)
        self.cols = DraftColumns(gen.d_space, gen.d_space.n, dst, stop_on_empty=False)
        self.partial = -1 in dst  # some drafter ids with text propose nothing: psi is renormalized

    def draft(self, gen: RoundView, active: list[bool], budget: list[int]) -> Drafts:
        """One drafter token per active row, proposing its first target id; a draft that maps to no
        target id (:attr:`FirstTargetMap.unmappable`) proposes nothing (its uniform is consumed):
        the row's round is the target's own token."""
        gen.drafter_context_from_text(active, self.text_resync)
        k = [self.lookahead if active[i] else 0 for i in range(gen.batch)]
        out = gen.draft_tokens(active, k, self.cols)[0]
        for i in range(gen.batch):
            if out.cols[i] and out.cols[i][0] < 0:
                out.cols[i], out.n[i] = [], 0
        return out

    def verify(self, gen: RoundView, active: list[bool], budget: list[int], drafts: Drafts) -> Verdicts:
        """Rejection verification against psi, the drafter's law pushed along the first-target map
        (given a proposal: divided by its total when some drafter ids propose nothing)."""
        def q_of(kmax: int) -> Tensor:
            q = self.push(torch.stack(drafts.laws[:kmax], dim=1))
            if self.partial:  # rows read here proposed an id, whose mass is in the total: it is > 0
                q = q / q.sum(-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)
            return q
        return gen.rejection(active, budget, drafts, q_of)


class BoundedSLRSMethod(Method):
    """Bounded SLRS (``proposal_map="longest_prefix"``, ``min_path_prob=tau``), ``max_tokens`` target
    ids proposed per round at most (None: up to the budget)."""

    name = "slrs"

    def __init__(self, min_path_prob: float | None, max_tokens: int | None, resync: Resync = Resync(), *,
                 lookahead: int = 4) -> None:
        super().__init__(lookahead=lookahead)
        self.min_path_prob, self.max_tokens, self.text_resync = min_path_prob, max_tokens, resync

    def setup(self, gen: RoundView) -> None:
        """The psi procedure for this pair of tokenizers."""
        assert gen.dt is not None
        self.psi = BoundedSLRS(gen.tt, gen.dt, self.lookahead, self.min_path_prob, gen.greedy, gen.dev,
                               max_tokens=self.max_tokens)

    def draft(self, gen: RoundView, active: list[bool], budget: list[int]) -> Drafts:
        """Each active row's proposal and its psi (multi-token: the conditional psi of each position),
        from the draft tree walked from its context; the drafting uniforms it read are recorded."""
        assert gen.drun is not None and gen.d_drop is not None
        gen.drafter_context_from_text(active, self.text_resync)
        k = self.depth(active, budget)
        d_uniforms = gen.drafting_uniforms(k)
        last = gen.feed_drafter([gen.d_ctx[i] if active[i] else None for i in range(gen.batch)])
        rows = [i for i, a in enumerate(active) if a]
        ridx = torch.tensor(rows, dtype=torch.long, device=last.device)
        tree = TreeCache(gen.drun, rows, [gen.d_ctx[i] for i in rows], self.psi.k)
        drop, proc = gen.d_drop, gen.d_process.args()

        def probs(logits: Tensor) -> Tensor:  # the drafter's processed law over all its ids
            return process_with_drop(logits, drop, *proc)

        root = probs(last.index_select(0, ridx))
        us = None if gen.greedy else [d_uniforms[i] for i in rows]
        extend = lambda parent, tokens, node_row: probs(tree.extend(parent, tokens, node_row))  # noqa: E731
        if self.max_tokens != 1:
            mt = self.max_tokens
            multi = self.psi.round_multi(root, us, extend, [budget[i] if mt is None else min(mt, budget[i])
                                                            for i in rows], depth=[k[i] for i in rows])
            proposals, used, laws = multi.proposals, multi.used, multi.conditionals.unbind(1)
        else:
            res = self.psi.round(root, us, extend, depth=[k[i] for i in rows])
            proposals, used, laws = [[p] if p >= 0 else [] for p in res.proposal], res.used, (res.psi,)
        out = Drafts.empty(gen.batch)
        for law in laws:
            q_full = law.new_zeros(gen.batch, self.psi.vt)
            q_full[ridx] = law
            out.q_steps.append(q_full)
        t_pos = gen.t_space.pos
        for r, i in enumerate(rows):
            out.cols[i] = [t_pos[t] for t in proposals[r]]
            out.n[i] = len(proposals[r])
            if not gen.greedy:
                gen.record(i, d_uniforms[i][:used[r]])
        return out

    def verify(self, gen: RoundView, active: list[bool], budget: list[int], drafts: Drafts) -> Verdicts:
        """Rejection verification against psi at each proposed position (over the target's text space)."""
        def q_of(kmax: int) -> Tensor:
            return gen.t_space.select(torch.stack(drafts.q_steps[:kmax], dim=1))
        return gen.rejection(active, budget, drafts, q_of)

