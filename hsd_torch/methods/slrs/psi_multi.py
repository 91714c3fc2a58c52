"""One round of bounded SLRS with multi-token proposals (:class:`MultiTokenRound`): as the
one-token round (:mod:`.psi_one`), with ``m[r]`` target ids proposed per row at most and the
settled stop on the first ``m[r]`` ids.

A tree node's text splits into its settled ids ``u`` (final whatever is drafted next) and a rest
that is empty or a proper prefix of a target token; a child's proposal is ``u`` followed by the
parse of (rest + the child's bytes) (:func:`.trie.parse_pairs`, every child of every node parsed;
the root level's parses are cached per pair of vocabularies; past it, only the children whose
proposal can share the row's first id, or that may grow, are parsed: :meth:`MultiTokenRound.needs_parse`).
Every stopping child's proposal tuple and path mass are kept; once the rows' own proposals are drawn, their conditional laws are
summed from those (:class:`MultiRoundResult`: ``hsd_core``'s ``PsiLaw.conditional``).

A proposal may be empty: the text is dead at once (it starts with a byte no target token starts,
the target lacking it; :func:`.trie.parse_pairs`). It adds nothing to position 0's law, which is
then the law of the first id given that there is one (:func:`conditional_laws`
normalizes it), and that row's round is the target's own token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ._psi_procedure import PsiProcedure
from .trie import DrafterBytes, TargetTrie, join, pad_bytes, pad_ids, parse_pairs


__all__ = ["CHUNK_MULTI", "MultiRoundResult", "MultiTokenRound", "conditional_laws", "parse_needed"]

CHUNK_MULTI = 1 << 20
"""Children (node x drafter id) handled per vectorized step (each child keeps its proposal tuple
until the round ends)."""

Kept = tuple[Tensor, Tensor, Tensor, Tensor]  # (row, proposal [E, W], length, mass)
Grown = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]  # (parent, column, mass, f, fpos)


@dataclass
class MultiRoundResult:
    """One bounded SLRS round with multi-token proposals for rows ``0..R-1``: ``proposals[r]`` (target
    ids), ``conditionals [R, M, Vt]`` (float64; position ``j < len(proposals[r])``: psi of the
    ``j+1``-th proposed id given the first ``j``, ``hsd_core``'s ``PsiLaw.conditional``; zeros
    past the proposal), ``used``, ``evaluations``, ``levels`` as in :class:`.psi_one.RoundResult`."""

    proposals: list[list[int]]
    conditionals: Tensor
    used: list[int]
    evaluations: list[int]
    levels: int


class MultiTokenRound:
    """The round of :meth:`BoundedSLRS.round_multi` (arguments as :class:`.psi_one.OneTokenRound`'s,
    and ``m``). The tree's current level: ``laws``, ``node_row``, ``path``, and per node its settled
    ids and the rest of its text; ``kept``: the stopping children that later positions' conditional
    laws may need; ``pos0 [R, Vt]``: position 0's law (every proposal counts there)."""

    def __init__(self, procedure: PsiProcedure, root: Tensor, uniforms: Sequence[Sequence[float]] | None,
                 extend: Callable[[Tensor, Tensor, Tensor], Tensor], m: Sequence[int],
                 depth: Sequence[int] | None = None) -> None:
        self.p, self.uniforms, self.extend = procedure, uniforms, extend
        dev = self.dev = procedure.device
        r_n = self.r_n = root.shape[0]
        self.cap = torch.tensor([procedure.k] * r_n if depth is None else list(depth), dtype=torch.long, device=dev)
        self.m_t = torch.tensor(list(m), dtype=torch.long, device=dev)
        self.proposals: list[list[int]] = [[] for _ in range(r_n)]
        self.used = [0] * r_n
        self.evals = [1] * r_n
        self.laws = root.to(torch.float64)
        self.node_row = torch.arange(r_n, device=dev)
        self.path = torch.ones(r_n, dtype=torch.float64, device=dev)
        self.settled_ids: list[list[int]] = [[] for _ in range(r_n)]  # per node: its settled ids u
        self.rests: list[bytes] = [b""] * r_n  # per node: the rest of its text after u
        self.cur = list(range(r_n))
        self.levels = 1
        self.kept: list[Kept] = []
        self.pos0 = torch.zeros(r_n, procedure.vt, dtype=torch.float64, device=dev)

    def run(self) -> MultiRoundResult:
        """Every level, then the rows' conditional laws."""
        p, dev, nt = self.p, self.dev, self.p.db.ids.shape[0]
        for depth in range(1, p.k + 1):
            n_nodes = self.laws.shape[0]
            self.u_t, self.u_len = pad_ids(self.settled_ids, dev)
            self.mrem = self.m_t.index_select(0, self.node_row) - self.u_len
            self.heads, self.head_len = pad_bytes(self.rests, dev)
            # each row's first proposed id where already known: drawn, or settled on its path
            known = torch.tensor([self.proposals[r][0] if self.proposals[r] else
                                  (self.settled_ids[self.cur[r]][0] if self.cur[r] >= 0 and
                                   self.settled_ids[self.cur[r]] else -1)
                                  for r in range(self.r_n)], dtype=torch.long, device=dev)
            e_full, e_len = self.eos_children(n_nodes, known)
            live = [r for r in range(self.r_n) if self.cur[r] >= 0]
            cur_t = torch.tensor([self.cur[r] for r in live], dtype=torch.long, device=dev)
            picked = p._draw(self.laws, cur_t, live, self.uniforms, depth, self.used)
            picked_l = picked.tolist()
            pcol_l = p.db.column.index_select(0, picked).tolist()
            want = {r: self.cur[r] * nt + c for r, d, c in zip(live, picked_l, pcol_l) if d != p.dt.eos_id}
            decided, grown = self.children(depth, n_nodes, want, known)
            self.settle_rows(live, picked_l, decided, e_full, e_len)
            if not grown or (p.greedy and all(c < 0 for c in self.cur)):
                break
            self.next_level(grown)
        conditionals = conditional_laws(self.p, self.proposals, self.pos0, self.kept)
        return MultiRoundResult(self.proposals, conditionals, self.used, self.evals, self.levels)

    def keep(self, rows: Tensor, full: Tensor, flen: Tensor, w: Tensor, known: Tensor) -> None:
        """Add position 0 now; keep for later only the proposals of two ids or more that can share
        the row's first id (``known[row]``: it, once known, else -1)."""
        w0 = torch.where(flen > 0, w, torch.zeros_like(w))  # an empty proposal adds nothing (module docstring)
        self.pos0.view(-1).index_add_(0, rows * self.p.vt + full[:, 0].clamp(min=0), w0)
        kn = known.index_select(0, rows)
        same1 = ((kn < 0) | (full[:, 0] == kn)).long()
        on = (flen >= 2) & self.p._given_prefix(same1, 1)
        if bool(on.any()):
            self.kept.append((rows[on], full[on], flen[on], w[on]))

    def eos_children(self, n_nodes: int, known: Tensor) -> tuple[Tensor, Tensor]:
        """EOS children: the node's own text read off, then the target's EOS, cut to ``m``; kept
        (sampling) and returned per node (proposal ``[N, W]``, length)."""
        p, dev = self.p, self.dev
        all_nodes = torch.arange(n_nodes, device=dev)
        e_ids, e_n, _, _ = parse_pairs(p.trie, self.heads, self.head_len, all_nodes, torch.full_like(all_nodes, -1),
                                       p.db, self.mrem)
        e_ids = torch.cat([e_ids, e_ids.new_full((n_nodes, 1), -1)], dim=1)
        e_ids[all_nodes, e_n] = p.tt.eos_id
        e_full, e_len = join(self.u_t, self.u_len, all_nodes, e_ids, e_n + 1, self.m_t.index_select(0, self.node_row))
        if not p.greedy:
            self.keep(self.node_row, e_full, e_len, self.path * self.laws[:, p.dt.eos_id], known)
        return e_full, e_len

    def children(self, depth: int, n_nodes: int, want: dict[int, int], known: Tensor
                 ) -> tuple[dict[int, tuple[bool, list[int], int]], list[Grown]]:
        """Parse every child (greedy: the rows' own only): its proposal, whether it stops (the first
        ``m`` ids settled, below ``tau``, or the last level), kept if it stops; returns, per row, its
        own child's (stops, proposal, index among the next level's nodes), and the growing children."""
        p, dev, nt = self.p, self.dev, self.p.db.ids.shape[0]
        if p.greedy:
            wkeys = list(want.values())
            chunks = [(torch.tensor([x // nt for x in wkeys], dtype=torch.long, device=dev),
                       torch.tensor([x % nt for x in wkeys], dtype=torch.long, device=dev))]
        else:
            step = max(1, CHUNK_MULTI // max(nt, 1))
            chunks = [(torch.arange(a, min(n_nodes, a + step), device=dev).repeat_interleave(nt),
                       torch.arange(nt, device=dev).repeat(min(n_nodes, a + step) - a))
                      for a in range(0, n_nodes, step)]
        grown: list[Grown] = []
        decided: dict[int, tuple[bool, list[int], int]] = {}
        offset = 0
        for pn, pc in chunks:
            if pn.numel() == 0:
                continue
            w = self.path.index_select(0, pn) * self.laws[pn, p.db.ids.index_select(0, pc)]
            ids, n_ids, f, fpos = self.parse(depth, pn, pc, None if p.greedy else self.needs_parse(depth, pn, w, known))
            settled = f >= self.mrem.index_select(0, pn)
            # a child stops when settled, below tau, or at its row's depth cap (min(lookahead, budget))
            stop = settled | (w < p.tau) | (self.cap.index_select(0, self.node_row.index_select(0, pn)) <= depth)
            full, flen = join(self.u_t, self.u_len, pn, ids, n_ids, self.m_t.index_select(0, self.node_row.index_select(0, pn)))
            if not p.greedy:
                counted = p._psi_counts(stop, settled, w, depth) & (w > 0)
                self.keep(self.node_row.index_select(0, pn)[counted], full[counted], flen[counted], w[counted], known)
            grow = ~stop & (w > 0)
            gidx = torch.cumsum(grow.long(), 0) - 1 + offset
            first = int(pn[0]) * nt + int(pc[0])
            for r, key in want.items():
                a = key - first if not p.greedy else wkeys.index(key)
                if 0 <= a < pn.shape[0] and int(pn[a]) * nt + int(pc[a]) == key:
                    decided[r] = (bool(stop[a]), full[a, :int(flen[a])].tolist(), int(gidx[a]))
            if bool(grow.any()):
                grown.append((pn[grow], pc[grow], w[grow], f[grow], fpos[grow]))
                offset += int(grow.sum())
        return decided, grown

    def needs_parse(self, depth: int, pn: Tensor, w: Tensor, known: Tensor) -> Tensor | None:
        """Which children (nodes ``pn``, path masses ``w``) must be parsed (bool), None: all. A
        child of a node whose first id is settled (``u[0]``) proposes ``u[0]`` first whatever its
        bytes; where that is not the row's first id (``known``, once known) its proposal cannot
        share the row's drawn prefix, so it is never kept for a later position, and where it stops
        whatever the parse (path mass below ``tau``, or the row's depth cap) its parse changes
        nothing: it adds ``w`` to position 0 at ``u[0]``, as ``join`` of ``u`` and no parsed id
        gives. Those are most children (at most ``1 / tau`` of a node's may grow). The root level's
        parses are cached; the lossy variants of the tests (a psi that counts by ``settled``, or
        sums every kept proposal whatever its prefix: :meth:`.psi.BoundedSLRS._counts_its_own_psi`)
        need every parse."""
        if depth == 1 or not self.p._counts_its_own_psi():
            return None
        row = self.node_row.index_select(0, pn)
        first = self.u_t[:, 0].index_select(0, pn)  # -1: no settled id
        kn = known.index_select(0, row)
        may_grow = (w >= self.p.tau) & (self.cap.index_select(0, row) > depth)
        return (first < 0) | (kn < 0) | (first == kn) | may_grow

    def parse(self, depth: int, pn: Tensor, pc: Tensor, need: Tensor | None = None
              ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """:func:`.trie.parse_pairs` of (node's rest + column's bytes) for the pairs, at most the
        node's remaining ``m`` ids (the root level: the cached parse of each token alone, cut). With
        ``need`` (bool, :meth:`needs_parse`), only those pairs are parsed; the others read no id
        (ids -1, none read, ``f = -1``: not settled, ``fpos = 0``)."""
        lim = self.mrem.index_select(0, pn)
        if depth != 1:
            return parse_needed(self.p.trie, self.heads, self.head_len, pn, pc, self.p.db, lim, need)
        r_ids, r_n_ids, f, fpos = (x.index_select(0, pc) for x in self.p._root_parse())
        ids = torch.where(torch.arange(r_ids.shape[1], device=self.dev).unsqueeze(0) < lim.unsqueeze(1), r_ids,
                          torch.full_like(r_ids, -1))
        return ids, torch.minimum(r_n_ids, lim), f, fpos

    def settle_rows(self, live: list[int], picked: list[int], decided: dict[int, tuple[bool, list[int], int]],
                    e_full: Tensor, e_len: Tensor) -> None:
        """Each live row's own draft either decides its proposal (EOS, or a stopping child) or moves
        to its next-level node."""
        nxt = [-1] * self.r_n
        for r, d in zip(live, picked):
            if d == self.p.dt.eos_id:
                self.proposals[r] = e_full[self.cur[r], :int(e_len[self.cur[r]])].tolist()
                continue
            stops, prop, gi = decided[r]
            if stops:
                self.proposals[r] = prop
            else:
                nxt[r] = gi
        self.cur = nxt

    def next_level(self, grown: list[Grown]) -> None:
        """The growing children become the next level's nodes (their settled ids and rests), and one
        batched drafter pass gives their laws."""
        p = self.p
        parent = torch.cat([g[0] for g in grown])
        cols = torch.cat([g[1] for g in grown])
        tokens = p.db.ids.index_select(0, cols)
        self.path = torch.cat([g[2] for g in grown])
        f_l = torch.cat([g[3] for g in grown]).tolist()
        fpos_l = torch.cat([g[4] for g in grown]).tolist()
        new_u: list[list[int]] = []
        new_rest: list[bytes] = []
        gids, _, _, _ = parse_pairs(p.trie, self.heads, self.head_len, parent, cols, p.db,
                                    self.mrem.index_select(0, parent))
        for i, (pa, tok) in enumerate(zip(parent.tolist(), tokens.tolist())):
            text = self.rests[pa] + (p.dt.bytes_of[tok] or b"")
            new_u.append(self.settled_ids[pa] + gids[i, :f_l[i]].tolist())
            new_rest.append(text[fpos_l[i]:])
        self.settled_ids, self.rests = new_u, new_rest
        self.node_row = self.node_row.index_select(0, parent)
        self.laws = self.extend(parent, tokens, self.node_row).to(torch.float64)
        self.levels += 1
        for r in self.node_row.tolist():
            self.evals[r] += 1


def parse_needed(trie: TargetTrie, heads: Tensor, head_len: Tensor, pn: Tensor, pc: Tensor, db: DrafterBytes,
                 lim: Tensor, need: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`.trie.parse_pairs` of the pairs (nodes ``pn``, columns ``pc``, at most ``lim`` ids
    each) that ``need`` (bool; None: all) selects; the others read no id (ids -1, none read,
    ``f = -1``: not settled, ``fpos = 0``)."""
    if need is None or bool(need.all()):
        return parse_pairs(trie, heads, head_len, pn, pc, db, lim)
    at = torch.nonzero(need).flatten()
    ids_s, n_s, f_s, fpos_s = parse_pairs(trie, heads, head_len, pn.index_select(0, at), pc.index_select(0, at), db,
                                          lim.index_select(0, at))
    n_p = pn.shape[0]
    ids = torch.full((n_p, max(1, ids_s.shape[1])), -1, dtype=torch.long, device=pn.device)
    ids[at, :ids_s.shape[1]] = ids_s
    n_ids, f, fpos = (torch.zeros(n_p, dtype=torch.long, device=pn.device) for _ in range(3))
    f.fill_(-1)
    return ids, n_ids.index_put_((at,), n_s), f.index_put_((at,), f_s), fpos.index_put_((at,), fpos_s)


def conditional_laws(p: PsiProcedure, proposals: list[list[int]], pos0: Tensor, kept: list[Kept]) -> Tensor:
    """``[R, M, Vt]``: position ``j`` of row ``r``, the law of its ``j+1``-th proposed id
    (``proposals[r]``) given its first ``j``: position 0's law ``pos0 [R, Vt]``, later positions
    summed from the ``kept`` proposals that share them; normalized; greedy: point masses at the
    proposal."""
    dev = pos0.device
    r_n = len(proposals)
    width = max(1, max(len(x) for x in proposals))
    cond = torch.zeros(r_n, width, p.vt, dtype=torch.float64, device=dev)
    if p.greedy:
        for r, prop in enumerate(proposals):
            for j, t in enumerate(prop):
                cond[r, j, t] = 1.0
        return cond
    x, nx = pad_ids(proposals, dev)
    flat = cond.view(-1)
    cond[:, 0] = pos0
    for rows, full, flen, w in kept:
        if rows.numel() == 0:
            continue
        cw = min(full.shape[1], width)
        same = (full[:, :cw] == x.index_select(0, rows)[:, :cw]).long().cumprod(1).sum(1)
        nxr = nx.index_select(0, rows)
        for j in range(1, cw):
            on = p._given_prefix(same, j) & (flen > j) & (nxr > j)
            if bool(on.any()):
                flat.index_add_(0, (rows[on] * width + j) * p.vt + full[on, j], w[on])
    tot = cond.sum(-1, keepdim=True)
    return torch.where(tot > 0, cond / torch.where(tot > 0, tot, torch.ones_like(tot)), cond)
