"""Bounded SLRS over real vocabularies (docs/slrs.md, "On real tokenizer pairs"): psi level by level, one batched
drafter pass per level.

The procedure is ``hsd_core``'s bounded one, ``SLRS(lookahead=k, min_path_prob=tau,
proposal_map="longest_prefix", max_tokens=1)`` (``proofs/slrs_bounded.md``), over token byte
strings (:class:`~hsd_torch.vocab.text.TokenText`; the mirror reads them as latin-1):

1. The drafter's context is its encoding of (prompt + emitted text), as SLEM's.
2. It drafts from its processed law, one token per level; after each drafted token it stops on its
   EOS, after ``k`` tokens, when the path's probability (the product of the drafted tokens'
   probabilities, float64) is below ``tau``, or when the first target token of the text is
   *settled* (the text is not a proper prefix of any target token's bytes).
3. The proposal is the longest target token whose bytes prefix the drafted text (the lowest id
   among ids with the same bytes); the target's EOS if the drafter ended with no text.

psi is the exact law of that proposal. Every drafter context the procedure can reach at depth
``j >= 1`` has path probability ``>= tau`` (else it stopped), so the draft tree has at most ``1/tau``
expanded nodes per level: psi is computed by walking the tree level by level, **one batched drafter
forward pass per level** over the expanded nodes of every row (:class:`TreeCache`: the rows'
KV caches are copied along the batch, ``index_select``, and extended by one token per level;
the generation's own caches are never touched). Each expanded node's children are *all* drafter
ids; for each the proposal and the settled test come from one vectorized walk of the drafter
tokens' bytes through a byte trie of the target vocabulary (:class:`TargetTrie`,
:func:`walk`; sorted ``node * 256 + byte`` keys and ``searchsorted``, no Python loop over the
vocabulary). Children that stop add their path mass to psi at their proposal (``index_add``);
the others are the next level's nodes. The row's own draft is sampled along the same tree with
its uniforms (one per drafted token, inverse CDF in ``hsd_core``'s column order), so drafting
costs no extra pass.

Greedy: only the argmax path is walked (psi is a point mass).

Cost per round and prompt: at most ``1 + (k - 1) / tau`` drafter rows (``k`` passes), whatever the
vocabularies; :data:`MAX_PSI_ROWS` bounds that promise up front (a larger one is refused).

Multi-token proposals (``max_tokens=m`` > 1 or None, :meth:`BoundedSLRS.round_multi`):
``hsd_core``'s ``SLRS(lookahead=k, max_tokens=m, min_path_prob=tau, proposal_map="longest_prefix")``.
Drafting also stops when the first ``min(m, budget)`` target ids of the text are settled, and the
proposal is those ids read off the text (:func:`parse_pairs`: the greedy longest-prefix parse of
many texts at once, with where the settled ids end), the target's EOS appended after the drafter's.
A node's text splits into ids already settled and a rest (empty or a proper prefix of a target
token); each child's proposal is the node's settled ids followed by the parse of (rest + its
bytes). Every stopping child's proposal tuple and mass are kept; once the row's own proposal
``X`` is drawn, position ``j`` gets psi conditioned on ``X[:j]`` (``PsiLaw.conditional``: the
mass of the kept tuples that start with ``X[:j]`` and go on, by their ``j``-th id), and
``generate`` verifies the tuple with :func:`hsd_torch.engine.kernels.rejection_verify`. Same cost bound
(every expanded node has path probability ``>= tau``), more nodes expanded (the text must settle
several ids), and every child of every node is parsed (no first-byte shortcut).

Not here: the ``"retokenize"`` proposal map beyond lookahead 1 (it needs a tokenizer call per
leaf, i.e. per drafter id per node); ``generate`` refuses it with a clear message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from hsd_core.methods.resync import Resync, drafter_context_ids

from ...engine import kernels
from ...engine.laws import process_with_drop
from ...engine.runner import Runner, logit_width
from ...engine.validation import NotSupported, as_int, check_max_tokens, check_min_path_prob
from ...vocab.text import TokenText
from .psi_multi import MultiRoundResult, MultiTokenRound
from .psi_one import OneTokenRound, RoundResult
from .tree import TreeCache
from .trie import NEVER, DrafterBytes, TargetTrie, parse_pairs, walk_pairs

__all__ = ["MAX_PSI_ROWS", "BoundedSLRS", "MultiRoundResult", "RoundResult", "first_round", "first_round_multi",
           "psi_bound"]

MAX_PSI_ROWS = 4096
"""The largest psi cost bound ``1 + (k - 1) / tau`` (drafter rows per prompt per round) that
``generate`` accepts; past it the round could need thousands of rows times the drafter's vocabulary
in memory, and it is refused."""

def psi_bound(lookahead: int, min_path_prob: float) -> float:
    """The bound on drafter rows per round (``proofs/slrs_bounded.md``, Lemma 3)."""
    return 1 + (lookahead - 1) / min_path_prob


class _EosLast:
    """The column order in which bounded SLRS samples its full-width drafter laws: the ids in
    increasing order with EOS moved to the end, which is ``hsd_core``'s order (its EOS is the last
    id). Inverse-CDF draws and argmax ties depend on the order, so the backend samples in this one
    (the mirror needs it). ``generate`` itself keeps its laws over text-space columns
    (:class:`hsd_torch.engine.laws.TextSpace`), already in this order."""

    def __init__(self, eos: int, v: int, device: torch.device) -> None:
        self.eos, self.v = eos, v
        self.identity = eos == v - 1
        self.perm = torch.cat([torch.arange(eos), torch.arange(eos + 1, v), torch.tensor([eos])]).to(device)

    def law(self, x: Tensor) -> Tensor:
        """``x [..., V]`` with its columns in sampling order (``x`` itself when EOS is the last id)."""
        if self.identity:
            return x
        if x.dim() == 2 and x.shape[0] == 1:  # one row (a batch-1 draft): one index_select, 2-4x faster than the cat
            return x.index_select(1, self.perm)
        e = self.eos  # three slices and a cat: on the CPU, index_select over the last dim of several rows is far slower
        return torch.cat([x[..., :e], x[..., e + 1:], x[..., e:e + 1]], dim=-1)

    def draw(self, x: Tensor, u: Tensor | None) -> Tensor:
        """One id per row of ``x [R, V]`` (a law over ids), read in sampling order: the argmax
        (ties to the first in that order) when ``u`` is None, else the inverse-CDF draw with
        ``u [R]`` (:func:`hsd_torch.engine.kernels.sample`, unchecked: a drafter's law only chooses
        proposals; the laws that decide what is emitted are checked where they are verified)."""
        sel = self.law(x)
        return self.to_id(torch.argmax(sel, dim=-1) if u is None else kernels.sample(sel, u, check=False))

    def to_id(self, c: Tensor) -> Tensor:
        """Sampling-order positions back to ids."""
        return c if self.identity else self.perm[c]


class BoundedSLRS:
    """The bounded procedure's round (module docstring) for a target/drafter pair of tokenizers."""

    _root_walks: dict[tuple[int, int], tuple[TargetTrie, DrafterBytes, tuple[Tensor, Tensor, Tensor]]] = {}
    _root_parses: dict[tuple[int, int], tuple[TargetTrie, DrafterBytes, tuple[Tensor, Tensor, Tensor, Tensor]]] = {}

    def __init__(self, target: TokenText, drafter: TokenText, lookahead: int, min_path_prob: float | None,
                 greedy: bool, device: torch.device, max_tokens: int | None = 1) -> None:
        # a public constructor (the benches and first_round build it directly): the boundary's checks
        self.max_tokens = check_max_tokens(max_tokens)
        lookahead = as_int("lookahead", lookahead, 1)
        min_path_prob = check_min_path_prob(min_path_prob)
        if min_path_prob is None and lookahead > 1 and not greedy:
            raise NotSupported("bounded SLRS needs min_path_prob > 0 beyond lookahead 1 (psi would "
                                      "enumerate every drafter id at every depth)")
        self.tt, self.dt = target, drafter
        self.k = lookahead
        self.tau = float(min_path_prob) if min_path_prob is not None else 0.0
        self.greedy = greedy
        self.device = device
        self.trie = TargetTrie.get(target, device)
        self.db = DrafterBytes.get(drafter, device)
        self.order = _EosLast(drafter.eos_id, drafter.vocab_size, device)
        self.vt = target.vocab_size
        key = (id(self.trie), id(self.db))
        hit = BoundedSLRS._root_walks.get(key)
        if hit is None or hit[0] is not self.trie or hit[1] is not self.db:
            nt = self.db.ids.shape[0]
            walked = walk_pairs(self.trie, torch.zeros(nt, dtype=torch.long, device=device),
                                torch.full((nt,), -1, dtype=torch.long, device=device),
                                torch.arange(nt, device=device), self.db)
            if len(BoundedSLRS._root_walks) > 8:
                BoundedSLRS._root_walks.clear()
            hit = BoundedSLRS._root_walks[key] = (self.trie, self.db, walked)
        self.root_walk: tuple[Tensor, Tensor, Tensor] = hit[2]
        # some drafter text can start with a byte that is no target token by itself (the target lacks
        # it): such a draft may propose nothing, and psi is then the law given a proposal
        one_byte = self.trie.keys < 256  # the root's children (key 0 * 256 + byte)
        single = torch.zeros(256, dtype=torch.bool, device=device)
        single[self.trie.keys[one_byte]] = self.trie.term.index_select(0, self.trie.child[one_byte]) >= 0
        self.holes = not bool(single.index_select(0, self.db.first).all())
        """Whether a draft can propose nothing (one-token psi is then divided by the mass that proposes)."""

    def _continuing(self, state: Tensor) -> tuple[Tensor, Tensor]:
        """Pairs (node, drafter column) whose first byte is a child byte of the node's trie state."""
        trie, db, dev = self.trie, self.db, self.device
        lo = torch.searchsorted(trie.keys, state * 256)
        cnt = torch.searchsorted(trie.keys, state * 256 + 256) - lo
        total = int(cnt.sum())
        if total == 0:
            e = torch.zeros(0, dtype=torch.long, device=dev)
            return e, e
        owner = torch.repeat_interleave(torch.arange(state.shape[0], device=dev), cnt)
        idx = torch.arange(total, device=dev) - torch.repeat_interleave(cnt.cumsum(0) - cnt, cnt) \
            + lo.index_select(0, owner)
        byte = trie.keys.index_select(0, idx) - state.index_select(0, owner) * 256
        gc = db.gcount.index_select(0, byte)
        n_pairs = int(gc.sum())
        pn = torch.repeat_interleave(owner, gc)
        within = torch.arange(n_pairs, device=dev) - torch.repeat_interleave(gc.cumsum(0) - gc, gc)
        pc = db.order.index_select(0, torch.repeat_interleave(db.gstart.index_select(0, byte), gc) + within)
        return pn, pc

    def _given_a_proposal(self, psi: Tensor) -> Tensor:
        """One-token psi ``[R, Vt]`` (the mass of each proposal) as the law given that there is one:
        each row divided by its total, which is below 1 when some drafts propose nothing (a text
        starting with a byte the target has no token for; ``proofs/slrs.md`` section 5). A hook for
        the deliberately lossy variant of the tests only (psi left undivided)."""
        if not self.holes:
            return psi  # every draft proposes: the total is 1 (up to rounding), left as computed
        tot = psi.sum(-1, keepdim=True)
        return torch.where(tot > 0, psi / torch.where(tot > 0, tot, torch.ones_like(tot)), psi)

    def _psi_counts(self, stop: Tensor, settled: Tensor, w: Tensor, depth: int) -> Tensor:
        """Which stopping children psi counts: all of them. A hook for the deliberately lossy
        variant of the tests only (a psi that ignores the paths pruned by ``min_path_prob``)."""
        return stop

    def _draw(self, laws: Tensor, cur_t: Tensor, live: list[int], uniforms: Sequence[Sequence[float]] | None,
              depth: int, used: list[int]) -> Tensor:
        """The rows' own drafts at ``depth``: one id per live row from the law of its current node
        (``laws[cur_t]``), in hsd_core's column order, with the row's ``depth``-th uniform (counted
        in ``used``); greedy: the argmax. No live row: ``cur_t`` itself (empty)."""
        if not live:
            return cur_t
        u = None
        if not self.greedy:
            assert uniforms is not None
            u = torch.tensor([uniforms[r][depth - 1] for r in live], dtype=torch.float64, device=laws.device)
            for r in live:
                used[r] += 1
        return self.order.draw(laws.index_select(0, cur_t), u)

    def round(self, root: Tensor, uniforms: Sequence[Sequence[float]] | None,
              extend: Callable[[Tensor, Tensor, Tensor], Tensor], depth: Sequence[int] | None = None) -> RoundResult:
        """One round with one proposed target id per row (:class:`.psi_one.OneTokenRound`):
        ``root [R, Vd]``: each row's processed drafter law at its context; ``uniforms[r]``: at
        least ``lookahead`` uniforms (None when greedy); ``extend(parent, tokens, node_row)``: the
        processed laws ``[N, Vd]`` of the next level's nodes (:meth:`TreeCache.extend` followed by
        the drafter's processing); ``depth[r]``: row ``r`` drafts at most that many tokens (``generate``:
        ``min(lookahead, budget)``; None: ``lookahead`` for every row)."""
        return OneTokenRound(self, root, uniforms, extend, depth).run()

    def _given_prefix(self, same: Tensor, j: int) -> Tensor:
        """Which kept proposals the conditional law at position ``j`` sums: those that agree with
        the drawn proposal on its first ``j`` ids (``same``: the length of their common prefix). A
        hook for the deliberately lossy variant of the tests only (the unconditional marginal)."""
        return same >= j

    def _counts_its_own_psi(self) -> bool:
        """Whether this procedure's psi is :class:`BoundedSLRS`'s own (:meth:`_psi_counts` and
        :meth:`_given_prefix` not overridden by a lossy variant): only then may the multi-token
        round leave unparsed the children whose parse changes nothing
        (:meth:`.psi_multi.MultiTokenRound.needs_parse`)."""
        cls = type(self)
        return cls._psi_counts is BoundedSLRS._psi_counts and cls._given_prefix is BoundedSLRS._given_prefix

    def _root_parse(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """:func:`parse_pairs` of every drafter token's text alone (no limit): once per pair of
        vocabularies."""
        key = (id(self.trie), id(self.db))
        hit = BoundedSLRS._root_parses.get(key)
        if hit is None or hit[0] is not self.trie or hit[1] is not self.db:
            nt, dev = self.db.ids.shape[0], self.device
            zeros = torch.zeros(nt, dtype=torch.long, device=dev)
            parsed = parse_pairs(self.trie, torch.full((1, 1), -1, dtype=torch.long, device=dev), zeros[:1], zeros,
                                 torch.arange(nt, device=dev), self.db, torch.full_like(zeros, NEVER))
            if len(BoundedSLRS._root_parses) > 8:
                BoundedSLRS._root_parses.clear()
            hit = BoundedSLRS._root_parses[key] = (self.trie, self.db, parsed)
        return hit[2]

    def round_multi(self, root: Tensor, uniforms: Sequence[Sequence[float]] | None,
                    extend: Callable[[Tensor, Tensor, Tensor], Tensor], m: Sequence[int],
                    depth: Sequence[int] | None = None) -> MultiRoundResult:
        """One round with multi-token proposals (:class:`.psi_multi.MultiTokenRound`): as
        :meth:`round`, with ``m[r]`` (``min(max_tokens, budget)``) target ids proposed per row at
        most, the settled stop on the first ``m[r]`` ids, and at most ``depth[r]`` drafted tokens."""
        return MultiTokenRound(self, root, uniforms, extend, m, depth).run()


def first_round(target_tokenizer: Any, target_vocab_size: int, drafter: Any, drafter_tokenizer: Any,
                prompts: Sequence[str], *, lookahead: int, min_path_prob: float | None, greedy: bool = False,
                uniforms: Sequence[Sequence[float]] | None = None, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None) -> RoundResult:
    """The bounded SLRS round at each prompt's first state (nothing emitted yet), batched as
    ``generate`` runs it: psi, the proposal and what it cost (for tests and ``bench/slrs_real.py``).
    ``uniforms`` default to 0.5 for every draw (psi does not depend on them)."""
    res = _first(target_tokenizer, target_vocab_size, drafter, drafter_tokenizer, prompts, lookahead, min_path_prob,
                 greedy, uniforms, temperature, top_k, top_p, None)
    assert isinstance(res, RoundResult)
    return res


def first_round_multi(target_tokenizer: Any, target_vocab_size: int, drafter: Any, drafter_tokenizer: Any,
                      prompts: Sequence[str], *, lookahead: int, min_path_prob: float | None, max_tokens: int | None,
                      budget: int, greedy: bool = False, uniforms: Sequence[Sequence[float]] | None = None,
                      temperature: float = 1.0, top_k: int | None = None,
                      top_p: float | None = None) -> MultiRoundResult:
    """:func:`first_round` with multi-token proposals (:meth:`BoundedSLRS.round_multi`), ``m =
    min(max_tokens, budget)`` (``budget`` when ``max_tokens`` is None): the drawn proposals and
    their conditional psi."""
    m = budget if max_tokens is None else min(max_tokens, budget)
    res = _first(target_tokenizer, target_vocab_size, drafter, drafter_tokenizer, prompts, lookahead, min_path_prob,
                 greedy, uniforms, temperature, top_k, top_p, m)
    assert isinstance(res, MultiRoundResult)
    return res


def _first(target_tokenizer: Any, target_vocab_size: int, drafter: Any, drafter_tokenizer: Any,
           prompts: Sequence[str], lookahead: int, min_path_prob: float | None, greedy: bool,
           uniforms: Sequence[Sequence[float]] | None, temperature: float, top_k: int | None, top_p: float | None,
           m: int | None) -> RoundResult | MultiRoundResult:
    tt = TokenText.get(target_tokenizer, target_vocab_size)
    vd = logit_width(drafter)
    dt = TokenText.get(drafter_tokenizer, vd)
    dev = next(drafter.parameters()).device
    bounded = BoundedSLRS(tt, dt, lookahead, min_path_prob, greedy, dev, max_tokens=1 if m is None else m)
    starts = [dt.start(p) for p in prompts]
    ctx = [starts[i] + drafter_context_ids(p.encode("utf-8"), lambda b: dt.encode(b, free=True), dt.decode, Resync())
           for i, p in enumerate(prompts)]  # the drafter's context in a first round (drafting module)
    runner = Runner(drafter, len(prompts), dt.eos_id, "drafter", window=True, n_prefix=[len(s) for s in starts])
    drop = ~dt.text_mask.to(dev)

    def probs(logits: Tensor) -> Tensor:
        return process_with_drop(logits, drop, temperature, top_k, top_p)

    with torch.inference_mode():
        blocks = [runner.sync(i, c) for i, c in enumerate(ctx)]
        last = runner.feed(blocks, [len(b) - 1 for b in blocks], None)
        tree = TreeCache(runner, list(range(len(prompts))), ctx, lookahead)
        us = uniforms if uniforms is not None or greedy else [[0.5] * lookahead for _ in prompts]
        if m is None:
            return bounded.round(probs(last), us, lambda p, t, r: probs(tree.extend(p, t, r)))
        return bounded.round_multi(probs(last), us, lambda p, t, r: probs(tree.extend(p, t, r)), [m] * len(prompts))
