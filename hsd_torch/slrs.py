"""Bounded SLRS over real vocabularies (issue 11, section 2): psi level by level, one batched
drafter pass per level.

The procedure is ``hsd_core``'s bounded one, ``SLRS(lookahead=k, min_path_prob=tau,
proposal_map="longest_prefix", max_tokens=1)`` (``proofs/slrs_bounded.md``), over token byte
strings (:class:`~hsd_torch.text.TokenText`; the mirror reads them as latin-1):

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
``generate`` verifies the tuple with :func:`hsd_torch.kernels.rejection_verify`. Same cost bound
(every expanded node has path probability ``>= tau``), more nodes expanded (the text must settle
several ids), and every child of every node is parsed (no first-byte shortcut).

Not here: the ``"retokenize"`` proposal map beyond lookahead 1 (it needs a tokenizer call per
leaf, i.e. per drafter id per node); ``generate`` refuses it with a clear message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from . import kernels
from ._cache import IdentityCache
from .text import TokenText

__all__ = ["MAX_PSI_ROWS", "BoundedSLRS", "DrafterBytes", "MultiRoundResult", "RoundResult", "TargetTrie", "TreeCache",
           "parse_pairs", "psi_bound", "slrs_options", "walk", "walk_pairs"]

MAX_PSI_ROWS = 4096
"""The largest psi cost bound ``1 + (k - 1) / tau`` (drafter rows per prompt per round) that
``generate`` accepts; past it the round could need thousands of rows times the drafter's vocabulary
in memory, and it is refused."""

_CHUNK = 1 << 22
"""Children (node x drafter id) handled per vectorized step: bounds the memory of one level."""

_CHUNK_MULTI = 1 << 20
"""The same for multi-token proposals (each child keeps its proposal tuple until the round ends)."""


def psi_bound(lookahead: int, min_path_prob: float) -> float:
    """The bound on drafter rows per round (``proofs/slrs_bounded.md``, Lemma 3)."""
    return 1 + (lookahead - 1) / min_path_prob


def slrs_options(lookahead: int, min_path_prob: float | None, proposal_map: str | None, greedy: bool,
                 max_tokens: int | None = 1) -> bool:
    """Check ``generate``'s SLRS options; True for the bounded procedure of this module, False
    for the paper's one-token SLRS at lookahead 1 (``hsd_core``'s ``SLRS(lookahead=1,
    lookbehind=0)``, :class:`hsd_torch.generate.FirstTargetMap`). Refusals (``NotImplementedError``)
    name what would make psi finish."""
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"max_tokens must be None or an int >= 1, got {max_tokens!r}")
    if max_tokens != 1 and proposal_map != "longest_prefix":
        raise NotImplementedError(
            f"method 'slrs' with max_tokens={max_tokens!r} needs the bounded procedure (proposal_map='longest_prefix' "
            "and min_path_prob=tau, issue 11): multi-token proposals with the re-tokenizing map are not implemented")
    if proposal_map not in (None, "retokenize", "longest_prefix"):
        raise ValueError(f"proposal_map must be None, 'retokenize' or 'longest_prefix', got {proposal_map!r}")
    if min_path_prob is not None and (isinstance(min_path_prob, bool) or not isinstance(min_path_prob, (int, float))
                                      or not 0 < min_path_prob <= 1):
        raise ValueError(f"min_path_prob must be None or a number in (0, 1], got {min_path_prob!r}")
    if proposal_map == "longest_prefix":
        if lookahead > 1 and min_path_prob is None and not greedy:
            raise NotImplementedError(
                f"method 'slrs' with lookahead={lookahead} and no min_path_prob: psi would enumerate every "
                "drafter path (|D|^lookahead drafter rows, issue 11); pass min_path_prob=tau (e.g. 0.05): psi then "
                "costs at most 1 + (lookahead - 1) / tau rows per round")
        if min_path_prob is not None and psi_bound(lookahead, min_path_prob) > MAX_PSI_ROWS:
            raise NotImplementedError(
                f"method 'slrs' with lookahead={lookahead}, min_path_prob={min_path_prob}: psi may need up to "
                f"{psi_bound(lookahead, min_path_prob):.0f} drafter rows per round and prompt, more than "
                f"{MAX_PSI_ROWS}; raise min_path_prob or lower the lookahead")
        return True
    if lookahead != 1:
        raise NotImplementedError(
            f"method 'slrs' with proposal_map={proposal_map!r} supports lookahead=1 only (the paper's one-token "
            f"SLRS), got lookahead={lookahead!r}: deeper lookaheads need the bounded procedure of issue 11, "
            "proposal_map='longest_prefix' with min_path_prob=tau (the re-tokenizing map would need a tokenizer "
            "call per drafter id per tree node); or use 'tli'/'slem' for longer drafts")
    return False


class TargetTrie:
    """A byte trie of a vocabulary's token strings, as tensors.

    Node 0 is the root (the empty string). ``keys`` (sorted int64) are ``parent * 256 + byte`` and
    ``child`` the node they lead to; ``term[n]`` is the lowest id whose bytes are node ``n``'s
    string (-1: none); ``has_child[n]``: ``n``'s string is a proper prefix of some token."""

    _cache: IdentityCache[TargetTrie] = IdentityCache()

    def __init__(self, text: TokenText, device: torch.device | str = "cpu") -> None:
        children: dict[int, int] = {}
        term: list[int] = [-1]
        for i, b in enumerate(text.bytes_of):
            if b is None:
                continue
            n = 0
            for c in b:
                key = n * 256 + c
                nxt = children.get(key)
                if nxt is None:
                    nxt = children[key] = len(term)
                    term.append(-1)
                n = nxt
            if term[n] < 0:
                term[n] = i
        keys = sorted(children)
        self.n_nodes = len(term)
        self.keys = torch.tensor(keys, dtype=torch.long, device=device)
        self.child = torch.tensor([children[k] for k in keys], dtype=torch.long, device=device)
        self.term = torch.tensor(term, dtype=torch.long, device=device)
        has = torch.zeros(self.n_nodes, dtype=torch.bool)
        if keys:
            has[torch.tensor(keys, dtype=torch.long) // 256] = True
        self.has_child = has.to(device)

    @classmethod
    def get(cls, text: TokenText, device: torch.device) -> TargetTrie:
        return cls._cache.get((text,), (text.vocab_size, str(device)), lambda: cls(text, device))


class DrafterBytes:
    """The drafter ids with text and their bytes as a padded matrix: ``ids [N]``, ``data [N, L]``
    (-1 padding), ``length [N]``; ``column[d]``: the position of id ``d`` in ``ids`` (-1: no text)."""

    _cache: IdentityCache[DrafterBytes] = IdentityCache()

    def __init__(self, text: TokenText, device: torch.device | str = "cpu") -> None:
        ids = [i for i, b in enumerate(text.bytes_of) if b is not None]
        lmax = max((len(text.bytes_of[i] or b"") for i in ids), default=1)
        data = torch.full((len(ids), lmax), -1, dtype=torch.long)
        length = torch.zeros(len(ids), dtype=torch.long)
        for r, i in enumerate(ids):
            b = text.bytes_of[i]
            assert b is not None
            data[r, :len(b)] = torch.tensor(list(b), dtype=torch.long)
            length[r] = len(b)
        column = torch.full((text.vocab_size,), -1, dtype=torch.long)
        column[torch.tensor(ids, dtype=torch.long)] = torch.arange(len(ids))
        self.ids = torch.tensor(ids, dtype=torch.long, device=device)
        self.data = data.to(device)
        self.first = data[:, 0].clamp(min=0).to(device)
        # the columns grouped by first byte: group b is order[gstart[b] : gstart[b] + gcount[b]]
        self.order = torch.argsort(data[:, 0].clamp(min=0), stable=True).to(device)
        gcount = torch.bincount(data[:, 0].clamp(min=0), minlength=256)
        self.gcount = gcount.to(device)
        self.gstart = (gcount.cumsum(0) - gcount).to(device)
        self.length = length.to(device)
        self.column = column.to(device)

    @classmethod
    def get(cls, text: TokenText, device: torch.device) -> DrafterBytes:
        return cls._cache.get((text,), (text.vocab_size, str(device)), lambda: cls(text, device))


def walk_pairs(trie: TargetTrie, start: Tensor, best: Tensor, col: Tensor, db: DrafterBytes,
               group: Tensor | None = None, group_start: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """For pairs ``i`` of (a text whose trie state is ``start[i]`` and whose longest target-token
    prefix is ``best[i]`` (-1: none), the drafter id in column ``col[i]`` of ``db``): the text
    extended by that id's bytes. Returns ``prop [P]`` (the longest target token prefixing the
    extended text, lowest id among equal bytes), ``end [P]`` (its trie state, -1 once it left the
    trie) and ``settled [P]`` (it is not a proper prefix of any target token's bytes). The first
    byte is a gather from a 256-wide child table per start state (``group [P]`` indexes the
    distinct states ``group_start``, when the caller knows them); the pairs still in the trie then
    take one ``searchsorted`` per byte position."""
    p = start.shape[0]
    state = start.clone()
    prop = best.clone()
    active = torch.arange(p, device=start.device)
    length = db.length.index_select(0, col)
    nkeys = trie.keys.shape[0]
    if nkeys and p:
        # first byte: a dense 256-wide child table per distinct start state (a gather, not a search);
        # most pairs leave the trie here, the few others go on with searchsorted below
        if group is None or group_start is None:
            starts, inv = torch.unique(start, return_inverse=True)
        else:
            starts, inv = group_start, group
        lo = torch.searchsorted(trie.keys, starts * 256)
        hi = torch.searchsorted(trie.keys, starts * 256 + 256)
        cnt = hi - lo
        table = torch.full((starts.shape[0], 256), -1, dtype=torch.long, device=start.device)
        if int(cnt.sum()):
            owner = torch.repeat_interleave(torch.arange(starts.shape[0], device=start.device), cnt)
            idx = torch.arange(int(cnt.sum()), device=start.device) - torch.repeat_interleave(cnt.cumsum(0) - cnt, cnt) \
                + lo.index_select(0, owner)
            table[owner, trie.keys.index_select(0, idx) - starts.index_select(0, owner) * 256] = trie.child.index_select(0, idx)
        child = table[inv, db.first.index_select(0, col)]
        state = child  # every drafter token has at least one byte
        t = trie.term.index_select(0, child.clamp(min=0))
        hit = (child >= 0) & (t >= 0)
        prop = torch.where(hit, t, prop)
        found = child >= 0
        active, col, length = active[found], col[found], length[found]
        first = 1
    else:
        first = 0
    for j in range(first, db.data.shape[1]):
        going = length > j
        if not bool(going.all()):
            active, col, length = active[going], col[going], length[going]
        if active.numel() == 0:
            break
        if nkeys == 0:
            state[active] = -1
            break
        key = state.index_select(0, active) * 256 + db.data[col, j]
        pos = torch.searchsorted(trie.keys, key).clamp(max=nkeys - 1)
        found = trie.keys.index_select(0, pos) == key
        child = torch.where(found, trie.child.index_select(0, pos), torch.full_like(key, -1))
        state[active] = child
        t = trie.term.index_select(0, child.clamp(min=0))
        hit = found & (t >= 0)
        prop[active[hit]] = t[hit]
        active, col, length = active[found], col[found], length[found]
    settled = ~((state >= 0) & trie.has_child.index_select(0, state.clamp(min=0)))
    return prop, state, settled


def walk(trie: TargetTrie, start: Tensor, best: Tensor, db: DrafterBytes) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`walk_pairs` for every node ``n`` (``start [N]``, ``best [N]``) and every drafter id
    with text: ``prop``, ``end``, ``settled`` as ``[N, C]``."""
    n, c = start.shape[0], db.ids.shape[0]
    cols = torch.arange(c, device=start.device)
    prop, end, settled = walk_pairs(trie, start.repeat_interleave(c), best.repeat_interleave(c), cols.repeat(n), db)
    return prop.view(n, c), end.view(n, c), settled.view(n, c)


class TreeCache:
    """Drafter contexts of the draft tree, one batched forward pass per level, on a copy of the
    rows' KV caches (a :class:`hsd_torch.generate._Runner`'s, never modified).

    ``rows``: the batch rows (indices of ``runner``) whose root context the runner just fed;
    ``contexts[r]``: the full context of ``rows[r]`` (for rows that would outgrow the drafter's
    positions: their nodes are run without the cache, on the backend's sliding window of the full
    context, exactly as the mirror's ``CoreModel(window=True)``)."""

    def __init__(self, runner: Any, rows: Sequence[int], contexts: Sequence[Sequence[int]], depth: int) -> None:
        self.runner = runner
        self.rows = list(rows)
        self.contexts = [list(c) for c in contexts]
        dev = runner.device
        self.device = dev
        self.slots = torch.tensor([runner.slot(i) for i in self.rows], dtype=torch.long, device=dev)
        self.base = torch.tensor([len(runner.ids[i]) for i in self.rows], dtype=torch.long, device=dev)
        mp = runner.max_pos
        self.direct = [mp is not None and len(c) + depth - 1 > mp for c in self.contexts]
        self.cache: Any = None
        self.mask: Tensor | None = None
        self.pos: Tensor | None = None
        self.paths: list[list[int]] = []  # per node of the last level: its drafted ids
        self.node_row: list[int] = []

    def extend(self, parent: Tensor, tokens: Tensor, node_row: Tensor) -> Tensor:
        """The next level: node ``i`` is node ``parent[i]`` of the last level (a row index into
        ``rows`` at the first call) followed by drafter id ``tokens[i]``; ``node_row[i]`` its row
        index. Returns the logits ``[N, V]`` after each new node's context."""
        from transformers import DynamicCache

        from .generate import window_view

        runner = self.runner
        par = parent.tolist()
        tok = tokens.tolist()
        rws = node_row.tolist()
        if self.cache is None:
            paths = [[t] for t in tok]
        else:
            paths = [self.paths[p] + [t] for p, t in zip(par, tok)]
        direct = [self.direct[r] for r in rws]
        cached = [i for i, d in enumerate(direct) if not d]
        out: Tensor | None = None
        n = len(tok)
        if cached:
            cidx = torch.tensor(cached, dtype=torch.long, device=self.device)
            pc = parent.index_select(0, cidx)
            if self.cache is None:
                src = runner.cache
                sel = self.slots.index_select(0, pc)
                mask = runner.mask.index_select(0, sel)
                pos = self.base.index_select(0, pc)
                cache = DynamicCache(config=runner.model.config)
                for li, layer in enumerate(src.layers):
                    cache.layers[li].update(  # type: ignore[union-attr]
                        layer.keys.index_select(0, sel), layer.values.index_select(0, sel))
            else:
                assert self.mask is not None and self.pos is not None
                # parents index the last level's nodes; only cached ones sit in the cache
                where = self._cached_index.index_select(0, pc)
                cache = self.cache
                cache.batch_select_indices(where)
                mask = self.mask.index_select(0, where)
                pos = self.pos.index_select(0, where)
            mask = torch.cat([mask, torch.ones(len(cached), 1, dtype=mask.dtype, device=self.device)], dim=1)
            res = runner.model(input_ids=tokens.index_select(0, cidx).unsqueeze(1), attention_mask=mask,
                               position_ids=pos.unsqueeze(1), use_cache=True, **{runner._cache_kw: cache})
            logits: Tensor = res.logits[:, -1]
            out = logits.new_zeros((n, logits.shape[-1]))
            out[cidx] = logits
            self.cache, self.mask, self.pos = cache, mask, pos + 1
        ci = torch.full((n,), -1, dtype=torch.long, device=self.device)
        if cached:
            ci[torch.tensor(cached, dtype=torch.long, device=self.device)] = torch.arange(len(cached), device=self.device)
        self._cached_index = ci
        for i, d in enumerate(direct):
            if not d:
                continue
            r = rws[i]
            full = window_view(self.contexts[r] + paths[i], runner.n_prefix[self.rows[r]], runner.max_pos)
            lg: Tensor = runner.model(input_ids=torch.tensor([full], dtype=torch.long, device=self.device)).logits[0, -1]
            if out is None:
                out = lg.new_zeros((n, lg.shape[-1]))
            out[i] = lg
        for r in set(rws):
            i = self.rows[r]
            runner.calls[i] += 1
        for r in rws:
            runner.positions[self.rows[r]] += 1
        self.paths = paths
        assert out is not None
        return out

    _cached_index: Tensor


_NEVER = 1 << 40
"""``f`` of :func:`parse_pairs` for a text whose first ``limit`` ids are settled."""


def parse_pairs(trie: TargetTrie, heads: Tensor, head_len: Tensor, node: Tensor, col: Tensor, db: DrafterBytes,
                limit: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The longest-prefix parse (``hsd_core``'s ``LongestPrefixMap.parse``) of many texts at once.

    Text ``i`` is ``heads[node[i], :head_len[node[i]]]`` (bytes, ``heads [N, H]`` padded) followed by
    the bytes of drafter column ``col[i]`` of ``db`` (nothing when ``col[i] < 0``); at most
    ``limit[i]`` ids are read off it. Returns ``ids [P, W]`` (-1 padding), ``n [P]`` (ids read),
    ``f [P]`` and ``fpos [P]``: ``f`` is the first ``j < limit`` at which the rest of the text
    (after the first ``j`` ids) is empty or a proper prefix of a target token, i.e. the first ``f``
    ids are settled and the ``f+1``-th is not (``LongestPrefixMap.settled(text, m)`` iff
    ``f >= m``; :data:`_NEVER` when the first ``limit`` are settled), and ``fpos`` the byte offset
    of that rest. One vectorized step per byte walked (``searchsorted`` over the trie's keys); a
    pair leaves the loop once its ``limit`` ids are read or its text is used up."""
    dev = node.device
    p_n = node.shape[0]
    nkeys = trie.keys.shape[0]
    lh = head_len.index_select(0, node)
    ld = torch.where(col >= 0, db.length.index_select(0, col.clamp(min=0)), torch.zeros_like(col))
    total = lh + ld
    pos = torch.zeros(p_n, dtype=torch.long, device=dev)
    walked = torch.zeros_like(pos)
    st = torch.zeros_like(pos)
    best = torch.full_like(pos, -1)
    blen = torch.zeros_like(pos)
    cnt = torch.zeros_like(pos)
    f = torch.full_like(pos, _NEVER)
    fpos = torch.zeros_like(pos)
    columns: list[Tensor] = []  # the j-th id of every pair (-1: none), allocated as some pair reaches it
    empty = (total == 0) & (limit > 0)
    f[empty] = 0
    act = torch.nonzero((total > 0) & (limit > 0)).flatten()
    hw, dw = max(heads.shape[1], 1), max(db.data.shape[1], 1)
    if heads.shape[1] == 0:
        heads = torch.full((heads.shape[0], 1), -1, dtype=torch.long, device=dev)
    while act.numel():
        at = pos.index_select(0, act) + walked.index_select(0, act)
        end = at >= total.index_select(0, act)
        lha = lh.index_select(0, act)
        hb = heads[node.index_select(0, act), at.clamp(max=hw - 1)]
        dbyte = db.data[col.index_select(0, act).clamp(min=0), (at - lha).clamp(min=0, max=dw - 1)]
        key = st.index_select(0, act) * 256 + torch.where(at < lha, hb, dbyte)
        if nkeys:
            kp = torch.searchsorted(trie.keys, key).clamp(max=nkeys - 1)
            found = (trie.keys.index_select(0, kp) == key) & ~end
            child = torch.where(found, trie.child.index_select(0, kp), torch.full_like(key, -1))
        else:
            found = torch.zeros_like(end)
            child = torch.full_like(key, -1)
        go = act[found]
        if go.numel():
            cg = child[found]
            st[go] = cg
            walked[go] += 1
            tm = trie.term.index_select(0, cg)
            hit = tm >= 0
            best[go[hit]] = tm[hit]
            blen[go[hit]] = walked[go[hit]]
        fin = act[~found]
        if fin.numel():
            # the token starting at pos is decided: the walk left the trie, or the text ended (if
            # there inside a proper prefix of a target token, the rest is not settled)
            in_p = end[~found] & trie.has_child.index_select(0, st.index_select(0, fin))
            newly = fin[in_p & (f.index_select(0, fin) == _NEVER)]
            f[newly] = cnt[newly]
            fpos[newly] = pos[newly]
            b = best.index_select(0, fin)
            if not bool((b >= 0).all()):
                raise ValueError("a byte of a drafted text starts no target token (the longest-prefix map needs "
                                 "every byte to be a target token)")
            c = cnt.index_select(0, fin)
            lo_c, hi_c = int(c.min()), int(c.max())
            while len(columns) <= hi_c:
                columns.append(torch.full((p_n,), -1, dtype=torch.long, device=dev))
            if lo_c == hi_c:
                columns[lo_c][fin] = b
            else:
                for cv in range(lo_c, hi_c + 1):
                    at_c = c == cv
                    columns[cv][fin[at_c]] = b[at_c]
            pos[fin] += blen.index_select(0, fin)
            cnt[fin] += 1
            st[fin] = 0
            walked[fin] = 0
            best[fin] = -1
            blen[fin] = 0
            used_up = pos.index_select(0, fin) >= total.index_select(0, fin)
            short = used_up & (cnt.index_select(0, fin) < limit.index_select(0, fin)) \
                & (f.index_select(0, fin) == _NEVER)
            fs = fin[short]
            f[fs] = cnt[fs]
            fpos[fs] = pos[fs]
        keep = (pos.index_select(0, act) < total.index_select(0, act)) \
            & (cnt.index_select(0, act) < limit.index_select(0, act))
        act = act[keep]
    ids = torch.stack(columns, dim=1) if columns else torch.full((p_n, 1), -1, dtype=torch.long, device=dev)
    return ids, cnt, f, fpos


@dataclass
class MultiRoundResult:
    """One bounded SLRS round with multi-token proposals for rows ``0..R-1``: ``proposals[r]`` (target
    ids), ``conditionals [R, M, Vt]`` (float64; position ``j < len(proposals[r])``: psi of the
    ``j+1``-th proposed id given the first ``j``, ``hsd_core``'s ``PsiLaw.conditional``; zeros
    past the proposal), ``used``, ``evaluations``, ``levels`` as in :class:`RoundResult`."""

    proposals: list[list[int]]
    conditionals: Tensor
    used: list[int]
    evaluations: list[int]
    levels: int


def _pad_bytes(texts: Sequence[bytes], device: torch.device) -> tuple[Tensor, Tensor]:
    width = max((len(t) for t in texts), default=0)
    out = torch.full((len(texts), max(width, 1)), -1, dtype=torch.long)
    for i, t in enumerate(texts):
        if t:
            out[i, :len(t)] = torch.tensor(list(t), dtype=torch.long)
    return out.to(device), torch.tensor([len(t) for t in texts], dtype=torch.long, device=device)


def _join(prefix: Tensor, prefix_len: Tensor, node: Tensor, suffix: Tensor, suffix_len: Tensor,
          cap: Tensor) -> tuple[Tensor, Tensor]:
    """Per entry ``i``: ``prefix[node[i], :prefix_len[node[i]]] + suffix[i, :suffix_len[i]]`` cut
    to ``cap[i]`` ids, as ``[E, W]`` (-1 padding) and the lengths."""
    lu = prefix_len.index_select(0, node)
    wu, ws = prefix.shape[1], suffix.shape[1]
    if not bool((prefix_len > 0).any()):  # no prefix (the root level): the suffix, cut
        n0 = torch.minimum(suffix_len, cap)
        keep = torch.arange(ws, device=node.device).unsqueeze(0) < n0.unsqueeze(1)
        return torch.where(keep, suffix, torch.full_like(suffix, -1)), n0
    p = torch.arange(wu + ws, device=node.device).unsqueeze(0)
    from_u = prefix.index_select(0, node).gather(1, p.clamp(max=wu - 1).expand(node.shape[0], -1))
    from_s = suffix.gather(1, (p - lu.unsqueeze(1)).clamp(min=0, max=ws - 1))
    n = torch.minimum(lu + suffix_len, cap)
    full = torch.where(p < lu.unsqueeze(1), from_u, from_s)
    return torch.where(p < n.unsqueeze(1), full, torch.full_like(full, -1)), n


def _pad_ids(rows: Sequence[Sequence[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), max(width, 1)), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            out[i, :len(r)] = torch.tensor(list(r), dtype=torch.long)
    return out.to(device), torch.tensor([len(r) for r in rows], dtype=torch.long, device=device)


@dataclass
class RoundResult:
    """One bounded SLRS round for rows ``0..R-1``: ``proposal[r]`` (a target id), ``psi [R, Vt]``
    (float64, the law it was drawn from), ``used[r]`` (drafting uniforms read), ``evaluations[r]``
    (drafter contexts evaluated: the root and every expanded node), ``levels`` (forward passes)."""

    proposal: list[int]
    psi: Tensor
    used: list[int]
    evaluations: list[int]
    levels: int


class _EosLast:
    """The column order in which bounded SLRS samples its full-width drafter laws: the ids in
    increasing order with EOS moved to the end, which is ``hsd_core``'s order (its EOS is the last
    id). Inverse-CDF draws and argmax ties depend on the order, so the backend samples in this one
    (the mirror needs it). ``generate`` itself keeps its laws over text-space columns
    (:class:`hsd_torch.generate._Space`), already in this order."""

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
        ``u [R]`` (:func:`hsd_torch.kernels.sample`, unchecked: a drafter's law only chooses
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
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens < 1):
            raise ValueError(f"max_tokens must be None or an int >= 1, got {max_tokens!r}")
        self.max_tokens = max_tokens
        if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 1:
            raise ValueError(f"lookahead must be an int >= 1, got {lookahead!r}")
        if min_path_prob is not None and not 0 < min_path_prob <= 1:
            raise ValueError(f"min_path_prob must be None or in (0, 1], got {min_path_prob!r}")
        if min_path_prob is None and lookahead > 1 and not greedy:
            raise NotImplementedError("bounded SLRS needs min_path_prob > 0 beyond lookahead 1 (psi would "
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
              extend: Callable[[Tensor, Tensor, Tensor], Tensor]) -> RoundResult:
        """``root [R, Vd]``: each row's processed drafter law at its context; ``uniforms[r]``: at
        least ``lookahead`` uniforms (None when greedy); ``extend(parent, tokens, node_row)``: the
        processed laws ``[N, Vd]`` of the next level's nodes (:meth:`TreeCache.extend` followed by
        the drafter's processing)."""
        dev = self.device
        db, trie, k, tau = self.db, self.trie, self.k, self.tau
        r_n = root.shape[0]
        eos_d, eos_t, vt = self.dt.eos_id, self.tt.eos_id, self.vt
        psi = torch.zeros(r_n, vt, dtype=torch.float64, device=dev)
        proposal = [-1] * r_n
        used = [0] * r_n
        evals = [1] * r_n
        laws = root.to(torch.float64)
        node_row = torch.arange(r_n, device=dev)
        path = torch.ones(r_n, dtype=torch.float64, device=dev)
        state = torch.zeros(r_n, dtype=torch.long, device=dev)
        best = torch.full((r_n,), -1, dtype=torch.long, device=dev)
        cur = list(range(r_n))  # the node of each row's own draft in this level (-1: decided)
        nt = db.ids.shape[0]
        levels = 1
        zero = torch.zeros((), dtype=torch.float64, device=dev)
        for depth in range(1, k + 1):
            live = [r for r in range(r_n) if cur[r] >= 0]
            if not live and self.greedy:
                break
            # the rows' own draws: one uniform per drafted token, in hsd_core's column order (psi
            # still needs this level's other nodes when every row's own draft has stopped)
            cur_t = torch.tensor([cur[r] for r in live], dtype=torch.long, device=dev)
            picked = self._draw(laws, cur_t, live, uniforms, depth, used)
            picked_l = picked.tolist()
            pcol_l = db.column.index_select(0, picked).tolist()
            # EOS children: the node's text's longest target prefix, or the target's EOS (root)
            e_prop = torch.where(best >= 0, best, torch.full_like(best, eos_t))
            if not self.greedy:
                psi.view(-1).index_add_(0, node_row * vt + e_prop, path * laws[:, eos_d])
            # every other child (greedy: the drafted one only) stops with a proposal or grows
            want = [(r, cur[r] * nt + c) for r, d, c in zip(live, picked_l, pcol_l) if d != eos_d]
            if self.greedy:
                wn = torch.tensor([cur[r] for r, _ in want], dtype=torch.long, device=dev)
                wc = torch.tensor([key % nt for _, key in want], dtype=torch.long, device=dev)
                chunks = [(wn, wc, 0)]
            elif depth == 1:
                n_nodes = laws.shape[0]
                step = max(1, _CHUNK // max(nt, 1))
                chunks = []
                for a in range(0, n_nodes, step):
                    b = min(n_nodes, a + step)
                    chunks.append((torch.arange(a, b, device=dev).repeat_interleave(nt),
                                   torch.arange(nt, device=dev).repeat(b - a), a * nt))
            else:
                # deeper nodes' texts are proper prefixes of target tokens: a child whose first byte
                # leaves the trie at once stops (settled) with the node's own longest prefix, so its
                # mass is added in one sum; only ids starting with one of the node's child bytes are walked
                text_mass = laws.index_select(1, db.ids).sum(1)
                pn, pc = self._continuing(state)
                cont = torch.zeros_like(text_mass).index_add_(0, pn, laws[pn, db.ids.index_select(0, pc)])
                leave = path * (text_mass - cont).clamp(min=0)
                psi.view(-1).index_add_(0, node_row * vt + best, leave)
                chunks = [(pn, pc, -1)]
            grown: list[tuple[Tensor, Tensor, Tensor, Tensor, Tensor]] = []
            offset = 0
            decided: dict[int, tuple[bool, int, int]] = {}  # row -> (stops, proposal, next index)
            for ci, (pn, pc, first) in enumerate(chunks):
                if pn.numel() == 0:
                    continue
                if depth == 1:  # every node is a root: the walk from the root, computed once per pair of vocabularies
                    prop, end, settled = (x.index_select(0, pc) for x in self.root_walk)
                else:
                    prop, end, settled = walk_pairs(trie, state.index_select(0, pn), best.index_select(0, pn), pc, db,
                                                    pn, state)
                w = path.index_select(0, pn) * laws[pn, db.ids.index_select(0, pc)]
                stop = (settled | (w < tau)) if depth < k else torch.ones_like(settled)
                if not self.greedy:
                    counted = self._psi_counts(stop, settled, w, depth)
                    psi.view(-1).index_add_(0, node_row.index_select(0, pn) * vt + prop, torch.where(counted, w, zero))
                grow = ~stop & (w > 0)
                gidx = torch.cumsum(grow.long(), 0) - 1 + offset
                if self.greedy:
                    loc = list(range(len(want)))
                    rows_here = [r for r, _ in want]
                elif first < 0:  # sparse pairs: find the rows' own children by key
                    keys, perm = torch.sort(pn * nt + pc)
                    wk = torch.tensor([key for _, key in want], dtype=torch.long, device=dev)
                    at = torch.searchsorted(keys, wk).clamp(max=keys.shape[0] - 1)
                    hit_l = (keys.index_select(0, at) == wk).tolist()
                    rows_here, loc = [], []
                    for (r, _), h, a in zip(want, hit_l, perm.index_select(0, at).tolist()):
                        if h:
                            rows_here.append(r)
                            loc.append(a)
                else:
                    rows_here, loc = [], []
                    for r, key in want:
                        if 0 <= key - first < pn.shape[0]:
                            rows_here.append(r)
                            loc.append(key - first)
                if loc:
                    li = torch.tensor(loc, dtype=torch.long, device=dev)
                    for r, s_, pr, gi in zip(rows_here, stop.index_select(0, li).tolist(),
                                             prop.index_select(0, li).tolist(), gidx.index_select(0, li).tolist()):
                        decided[r] = (bool(s_), int(pr), int(gi))
                if bool(grow.any()):
                    grown.append((pn[grow], pc[grow], w[grow], end[grow], prop[grow]))
                    offset += int(grow.sum())
            nxt = [-1] * r_n
            for r, d in zip(live, picked_l):
                if d == eos_d:
                    proposal[r] = int(e_prop[cur[r]])
                    continue
                stops, pr, gi = decided.get(r, (True, int(best[cur[r]]), -1))  # not walked: left the trie
                if stops:
                    proposal[r] = pr
                else:
                    nxt[r] = gi
            cur = nxt
            if not grown or (self.greedy and all(c < 0 for c in cur)):
                break
            parent = torch.cat([g[0] for g in grown])
            tokens = db.ids.index_select(0, torch.cat([g[1] for g in grown]))
            path = torch.cat([g[2] for g in grown])
            state = torch.cat([g[3] for g in grown])
            best = torch.cat([g[4] for g in grown])
            node_row = node_row.index_select(0, parent)
            laws = extend(parent, tokens, node_row).to(torch.float64)
            levels += 1
            for r in node_row.tolist():
                evals[r] += 1
        assert all(p >= 0 for p in proposal), "every row's draft ends in a proposal"
        if self.greedy:
            psi[torch.arange(r_n, device=dev), torch.tensor(proposal, dtype=torch.long, device=dev)] = 1.0
        return RoundResult(proposal, psi, used, evals, levels)

    def _given_prefix(self, same: Tensor, j: int) -> Tensor:
        """Which kept proposals the conditional law at position ``j`` sums: those that agree with
        the drawn proposal on its first ``j`` ids (``same``: the length of their common prefix). A
        hook for the deliberately lossy variant of the tests only (the unconditional marginal)."""
        return same >= j

    def _root_parse(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """:func:`parse_pairs` of every drafter token's text alone (no limit): once per pair of
        vocabularies."""
        key = (id(self.trie), id(self.db))
        hit = BoundedSLRS._root_parses.get(key)
        if hit is None or hit[0] is not self.trie or hit[1] is not self.db:
            nt, dev = self.db.ids.shape[0], self.device
            zeros = torch.zeros(nt, dtype=torch.long, device=dev)
            parsed = parse_pairs(self.trie, torch.full((1, 1), -1, dtype=torch.long, device=dev), zeros[:1], zeros,
                                 torch.arange(nt, device=dev), self.db, torch.full_like(zeros, _NEVER))
            if len(BoundedSLRS._root_parses) > 8:
                BoundedSLRS._root_parses.clear()
            hit = BoundedSLRS._root_parses[key] = (self.trie, self.db, parsed)
        return hit[2]

    def round_multi(self, root: Tensor, uniforms: Sequence[Sequence[float]] | None,
                    extend: Callable[[Tensor, Tensor, Tensor], Tensor], m: Sequence[int]) -> MultiRoundResult:
        """The round with multi-token proposals: as :meth:`round`, with ``m[r]`` (``min(max_tokens,
        budget)``) target ids proposed per row at most, the settled stop on the first ``m[r]`` ids.

        A tree node's text splits into its settled ids ``u`` (final whatever is drafted next) and a
        rest that is empty or a proper prefix of a target token; a child's proposal is ``u`` followed
        by the parse of (rest + the child's bytes) (:func:`parse_pairs`, every child of every node
        walked; the root level's parses are cached per pair of vocabularies). Every stopping child's
        proposal tuple and path mass are kept; once the rows' own proposals are drawn, their
        conditional laws are summed from those (:class:`MultiRoundResult`)."""
        dev = self.device
        db, trie, k, tau = self.db, self.trie, self.k, self.tau
        r_n = root.shape[0]
        eos_d, eos_t, vt = self.dt.eos_id, self.tt.eos_id, self.vt
        m_t = torch.tensor(list(m), dtype=torch.long, device=dev)
        proposals: list[list[int]] = [[] for _ in range(r_n)]
        used = [0] * r_n
        evals = [1] * r_n
        laws = root.to(torch.float64)
        node_row = torch.arange(r_n, device=dev)
        path = torch.ones(r_n, dtype=torch.float64, device=dev)
        settled_ids: list[list[int]] = [[] for _ in range(r_n)]  # per node: its settled ids u
        rests: list[bytes] = [b""] * r_n  # per node: the rest of its text after u
        cur = list(range(r_n))
        nt = db.ids.shape[0]
        levels = 1
        kept: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []  # (row, proposal [E, W], length, mass)
        pos0 = torch.zeros(r_n, vt, dtype=torch.float64, device=dev)  # position 0: every proposal counts

        def keep(rows: Tensor, full: Tensor, flen: Tensor, w: Tensor, known: Tensor) -> None:
            """Add position 0 now; keep for later only the proposals of two ids or more that can
            share the row's first id (``known[row]``: it, once known, else -1)."""
            pos0.view(-1).index_add_(0, rows * vt + full[:, 0], w)
            kn = known.index_select(0, rows)
            same1 = ((kn < 0) | (full[:, 0] == kn)).long()
            on = (flen >= 2) & self._given_prefix(same1, 1)
            if bool(on.any()):
                kept.append((rows[on], full[on], flen[on], w[on]))
        for depth in range(1, k + 1):
            n_nodes = laws.shape[0]
            u_t, u_len = _pad_ids(settled_ids, dev)
            mrem = m_t.index_select(0, node_row) - u_len
            heads, head_len = _pad_bytes(rests, dev)
            all_nodes = torch.arange(n_nodes, device=dev)
            # each row's first proposed id where already known: drawn, or settled on its path
            known = torch.tensor([proposals[r][0] if proposals[r] else
                                  (settled_ids[cur[r]][0] if cur[r] >= 0 and settled_ids[cur[r]] else -1)
                                  for r in range(r_n)], dtype=torch.long, device=dev)
            # EOS children: the node's own text read off, then the target's EOS, cut to m
            e_ids, e_n, _, _ = parse_pairs(trie, heads, head_len, all_nodes, torch.full_like(all_nodes, -1), db, mrem)
            e_ids = torch.cat([e_ids, e_ids.new_full((n_nodes, 1), -1)], dim=1)
            e_ids[all_nodes, e_n] = eos_t
            e_full, e_len = _join(u_t, u_len, all_nodes, e_ids, e_n + 1, m_t.index_select(0, node_row))
            if not self.greedy:
                keep(node_row, e_full, e_len, path * laws[:, eos_d], known)
            live = [r for r in range(r_n) if cur[r] >= 0]
            cur_t = torch.tensor([cur[r] for r in live], dtype=torch.long, device=dev)
            picked = self._draw(laws, cur_t, live, uniforms, depth, used)
            picked_l = picked.tolist()
            pcol_l = db.column.index_select(0, picked).tolist()
            want = {r: cur[r] * nt + c for r, d, c in zip(live, picked_l, pcol_l) if d != eos_d}
            if self.greedy:
                wkeys = list(want.values())
                chunks = [(torch.tensor([x // nt for x in wkeys], dtype=torch.long, device=dev),
                           torch.tensor([x % nt for x in wkeys], dtype=torch.long, device=dev))]
            else:
                step = max(1, _CHUNK_MULTI // max(nt, 1))
                chunks = [(torch.arange(a, min(n_nodes, a + step), device=dev).repeat_interleave(nt),
                           torch.arange(nt, device=dev).repeat(min(n_nodes, a + step) - a))
                          for a in range(0, n_nodes, step)]
            grown: list[tuple[Tensor, Tensor, Tensor, Tensor, Tensor]] = []  # parent, column, mass, f, fpos
            offset = 0
            decided: dict[int, tuple[bool, list[int], int]] = {}  # row -> (stops, proposal, next index)
            for pn, pc in chunks:
                if pn.numel() == 0:
                    continue
                lim = mrem.index_select(0, pn)
                if depth == 1:
                    r_ids, r_n_ids, f, fpos = (x.index_select(0, pc) for x in self._root_parse())
                    ids = torch.where(torch.arange(r_ids.shape[1], device=dev).unsqueeze(0) < lim.unsqueeze(1), r_ids,
                                      torch.full_like(r_ids, -1))
                    n_ids = torch.minimum(r_n_ids, lim)
                else:
                    ids, n_ids, f, fpos = parse_pairs(trie, heads, head_len, pn, pc, db, lim)
                w = path.index_select(0, pn) * laws[pn, db.ids.index_select(0, pc)]
                settled = f >= lim
                stop = (settled | (w < tau)) if depth < k else torch.ones_like(settled)
                full, flen = _join(u_t, u_len, pn, ids, n_ids, m_t.index_select(0, node_row.index_select(0, pn)))
                if not self.greedy:
                    counted = self._psi_counts(stop, settled, w, depth) & (w > 0)
                    keep(node_row.index_select(0, pn)[counted], full[counted], flen[counted], w[counted], known)
                grow = ~stop & (w > 0)
                gidx = torch.cumsum(grow.long(), 0) - 1 + offset
                first = int(pn[0]) * nt + int(pc[0])
                for r, key in want.items():
                    a = key - first if not self.greedy else wkeys.index(key)
                    if 0 <= a < pn.shape[0] and int(pn[a]) * nt + int(pc[a]) == key:
                        decided[r] = (bool(stop[a]), full[a, :int(flen[a])].tolist(), int(gidx[a]))
                if bool(grow.any()):
                    grown.append((pn[grow], pc[grow], w[grow], f[grow], fpos[grow]))
                    offset += int(grow.sum())
            nxt = [-1] * r_n
            for r, d in zip(live, picked_l):
                if d == eos_d:
                    proposals[r] = e_full[cur[r], :int(e_len[cur[r]])].tolist()
                    continue
                stops, prop, gi = decided[r]
                if stops:
                    proposals[r] = prop
                else:
                    nxt[r] = gi
            cur = nxt
            if not grown or (self.greedy and all(c < 0 for c in cur)):
                break
            parent = torch.cat([g[0] for g in grown])
            cols = torch.cat([g[1] for g in grown])
            tokens = db.ids.index_select(0, cols)
            path = torch.cat([g[2] for g in grown])
            f_l = torch.cat([g[3] for g in grown]).tolist()
            fpos_l = torch.cat([g[4] for g in grown]).tolist()
            new_u: list[list[int]] = []
            new_rest: list[bytes] = []
            gids, _, _, _ = parse_pairs(trie, heads, head_len, parent, cols, db, mrem.index_select(0, parent))
            for i, (pa, tok) in enumerate(zip(parent.tolist(), tokens.tolist())):
                text = rests[pa] + (self.dt.bytes_of[tok] or b"")
                new_u.append(settled_ids[pa] + gids[i, :f_l[i]].tolist())
                new_rest.append(text[fpos_l[i]:])
            settled_ids, rests = new_u, new_rest
            node_row = node_row.index_select(0, parent)
            laws = extend(parent, tokens, node_row).to(torch.float64)
            levels += 1
            for r in node_row.tolist():
                evals[r] += 1
        assert all(p for p in proposals), "every row's draft ends in a proposal"
        width = max(len(p) for p in proposals)
        cond = torch.zeros(r_n, width, vt, dtype=torch.float64, device=dev)
        if self.greedy:
            for r, prop in enumerate(proposals):
                for j, t in enumerate(prop):
                    cond[r, j, t] = 1.0
        else:
            x, nx = _pad_ids(proposals, dev)
            flat = cond.view(-1)
            cond[:, 0] = pos0
            for rows, full, flen, w in kept:
                if rows.numel() == 0:
                    continue
                cw = min(full.shape[1], width)
                same = (full[:, :cw] == x.index_select(0, rows)[:, :cw]).long().cumprod(1).sum(1)
                nxr = nx.index_select(0, rows)
                for j in range(1, cw):
                    on = self._given_prefix(same, j) & (flen > j) & (nxr > j)
                    if bool(on.any()):
                        flat.index_add_(0, (rows[on] * width + j) * vt + full[on, j], w[on])
            tot = cond.sum(-1, keepdim=True)
            cond = torch.where(tot > 0, cond / torch.where(tot > 0, tot, torch.ones_like(tot)), cond)
        return MultiRoundResult(proposals, cond, used, evals, levels)


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
    from .generate import _logit_width, _process, _Runner

    tt = TokenText.get(target_tokenizer, target_vocab_size)
    vd = _logit_width(drafter)
    dt = TokenText.get(drafter_tokenizer, vd)
    dev = next(drafter.parameters()).device
    bounded = BoundedSLRS(tt, dt, lookahead, min_path_prob, greedy, dev, max_tokens=1 if m is None else m)
    starts = [dt.start(p) for p in prompts]
    ctx = [starts[i] + dt.encode(p.encode("utf-8")) for i, p in enumerate(prompts)]
    runner = _Runner(drafter, len(prompts), dt.eos_id, "drafter", window=True, n_prefix=[len(s) for s in starts])
    drop = ~dt.text_mask.to(dev)

    def probs(logits: Tensor) -> Tensor:
        return _process(logits, drop, temperature, top_k, top_p)

    with torch.inference_mode():
        blocks = [runner.sync(i, c) for i, c in enumerate(ctx)]
        last = runner.feed(blocks, [len(b) - 1 for b in blocks], None)
        tree = TreeCache(runner, list(range(len(prompts))), ctx, lookahead)
        us = uniforms if uniforms is not None or greedy else [[0.5] * lookahead for _ in prompts]
        if m is None:
            return bounded.round(probs(last), us, lambda p, t, r: probs(tree.extend(p, t, r)))
        return bounded.round_multi(probs(last), us, lambda p, t, r: probs(tree.extend(p, t, r)), [m] * len(prompts))
