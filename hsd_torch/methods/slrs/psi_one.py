"""One round of bounded SLRS with one proposed target id (:class:`OneTokenRound`): the draft tree
walked level by level, psi summed over its stopping children, each row's own draft drawn along it.

Per level (depth ``1..k``): the rows' own drafts are drawn from their current nodes' laws; EOS
children add their path mass at the node's proposal; every other child (greedy: the drafted one
only) either stops, adding its mass at its proposal (the longest target token prefixing its text),
or grows into a node of the next level, whose laws come from one batched drafter pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ._psi_procedure import PsiProcedure
from .trie import walk_pairs


__all__ = ["CHUNK", "OneTokenRound", "RoundResult"]

CHUNK = 1 << 22
"""Children (node x drafter id) handled per vectorized step: bounds the memory of one level."""

Chunk = tuple[Tensor, Tensor, int]  # (node [P], drafter column [P], key of the first pair or -1: sparse pairs)
Grown = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]  # (parent, column, path mass, trie state, longest prefix)


@dataclass
class RoundResult:
    """One bounded SLRS round for rows ``0..R-1``: ``proposal[r]`` (a target id; -1 when the row's
    draft starts with bytes no target token starts: no proposal), ``psi [R, Vt]`` (float64, the
    law it was drawn from, given that there is a proposal: rows whose drafts can propose nothing
    are divided by the mass that proposes), ``used[r]`` (drafting uniforms read), ``evaluations[r]``
    (drafter contexts evaluated: the root and every expanded node), ``levels`` (forward passes)."""

    proposal: list[int]
    psi: Tensor
    used: list[int]
    evaluations: list[int]
    levels: int


class OneTokenRound:
    """The round of :meth:`BoundedSLRS.round`: ``root [R, Vd]`` each row's processed drafter law
    at its context, ``uniforms[r]`` at least ``lookahead`` uniforms (None when greedy),
    ``extend(parent, tokens, node_row)`` the processed laws ``[N, Vd]`` of the next level's nodes.
    The tree's current level: ``laws [N, Vd]`` (float64), ``node_row``, ``path`` (mass), ``state``
    (trie state of the node's text), ``best`` (its longest target prefix, -1: none); ``cur[r]``
    the node of row ``r``'s own draft (-1: its proposal is decided)."""

    def __init__(self, procedure: PsiProcedure, root: Tensor, uniforms: Sequence[Sequence[float]] | None,
                 extend: Callable[[Tensor, Tensor, Tensor], Tensor],
                 depth: Sequence[int] | None = None) -> None:
        self.p, self.uniforms, self.extend = procedure, uniforms, extend
        dev = self.dev = procedure.device
        r_n = self.r_n = root.shape[0]
        self.cap = torch.tensor([procedure.k] * r_n if depth is None else list(depth), dtype=torch.long, device=dev)
        self.psi = torch.zeros(r_n, procedure.vt, dtype=torch.float64, device=dev)
        self.proposal = [-1] * r_n
        self.used = [0] * r_n
        self.evals = [1] * r_n
        self.laws = root.to(torch.float64)
        self.node_row = torch.arange(r_n, device=dev)
        self.path = torch.ones(r_n, dtype=torch.float64, device=dev)
        self.state = torch.zeros(r_n, dtype=torch.long, device=dev)
        self.best = torch.full((r_n,), -1, dtype=torch.long, device=dev)
        self.cur = list(range(r_n))
        self.levels = 1
        self.zero = torch.zeros((), dtype=torch.float64, device=dev)

    def run(self) -> RoundResult:
        """Every level, then the result (greedy: psi is the point mass at the proposal)."""
        p, greedy, nt = self.p, self.p.greedy, self.p.db.ids.shape[0]
        eos_d = p.dt.eos_id
        for depth in range(1, p.k + 1):
            live = [r for r in range(self.r_n) if self.cur[r] >= 0]
            if not live and greedy:
                break
            # the rows' own draws: one uniform per drafted token, in hsd_core's column order (psi
            # still needs this level's other nodes when every row's own draft has stopped)
            cur_t = torch.tensor([self.cur[r] for r in live], dtype=torch.long, device=self.dev)
            picked = p._draw(self.laws, cur_t, live, self.uniforms, depth, self.used)
            picked_l = picked.tolist()
            pcol_l = p.db.column.index_select(0, picked).tolist()
            e_prop = self.eos_children()
            want = [(r, self.cur[r] * nt + c) for r, d, c in zip(live, picked_l, pcol_l) if d != eos_d]
            decided, grown = self.children(depth, self.chunks(depth, want), want)
            self.settle_rows(live, picked_l, decided, e_prop)
            if not grown or (greedy and all(c < 0 for c in self.cur)):
                break
            self.next_level(grown)
        # a row whose draft starts with bytes no target token starts (the target lacks a byte) proposes
        # nothing (-1): its round is the target's own token, and psi is the law given a proposal
        if not greedy:
            self.psi = p._given_a_proposal(self.psi)
        if greedy:
            rows = [r for r, x in enumerate(self.proposal) if x >= 0]
            idx = torch.tensor([self.proposal[r] for r in rows], dtype=torch.long, device=self.dev)
            self.psi[torch.tensor(rows, dtype=torch.long, device=self.dev), idx] = 1.0
        return RoundResult(self.proposal, self.psi, self.used, self.evals, self.levels)

    def eos_children(self) -> Tensor:
        """EOS children stop with the node's text's longest target prefix, or the target's EOS (at
        the root): their mass is added to psi there; returns that proposal per node."""
        e_prop = torch.where(self.best >= 0, self.best, torch.full_like(self.best, self.p.tt.eos_id))
        if not self.p.greedy:
            vt = self.p.vt
            self.psi.view(-1).index_add_(0, self.node_row * vt + e_prop, self.path * self.laws[:, self.p.dt.eos_id])
        return e_prop

    def chunks(self, depth: int, want: list[tuple[int, int]]) -> list[Chunk]:
        """The (node, drafter column) pairs this level walks. Greedy: the rows' own children only.
        Depth 1: every pair, in chunks of :data:`CHUNK`. Deeper: a node's text is a proper prefix of a
        target token, so a child whose first byte leaves the trie stops (settled) with the node's own
        longest prefix: their mass is added here in one sum, and only the others are walked."""
        p, dev, nt = self.p, self.dev, self.p.db.ids.shape[0]
        if p.greedy:
            wn = torch.tensor([self.cur[r] for r, _ in want], dtype=torch.long, device=dev)
            wc = torch.tensor([key % nt for _, key in want], dtype=torch.long, device=dev)
            return [(wn, wc, 0)]
        if depth == 1:
            n_nodes = self.laws.shape[0]
            step = max(1, CHUNK // max(nt, 1))
            return [(torch.arange(a, min(n_nodes, a + step), device=dev).repeat_interleave(nt),
                     torch.arange(nt, device=dev).repeat(min(n_nodes, a + step) - a), a * nt)
                    for a in range(0, n_nodes, step)]
        text_mass = self.laws.index_select(1, p.db.ids).sum(1)
        pn, pc = p._continuing(self.state)
        cont = torch.zeros_like(text_mass).index_add_(0, pn, self.laws[pn, p.db.ids.index_select(0, pc)])
        leave = self.path * (text_mass - cont).clamp(min=0)
        has = self.best >= 0  # a node with no target prefix: its leaving children propose nothing
        self.psi.view(-1).index_add_(0, self.node_row * p.vt + self.best.clamp(min=0), torch.where(has, leave, self.zero))
        return [(pn, pc, -1)]

    def children(self, depth: int, chunks: list[Chunk], want: list[tuple[int, int]]
                 ) -> tuple[dict[int, tuple[bool, int, int]], list[Grown]]:
        """Walk the pairs: each child's proposal, whether it stops (settled, below ``tau``, or the
        last level), its mass added to psi if it stops; returns, per row whose own child was walked,
        (stops, proposal, index among the next level's nodes), and the growing children."""
        p = self.p
        grown: list[Grown] = []
        decided: dict[int, tuple[bool, int, int]] = {}
        offset = 0
        for pn, pc, first in chunks:
            if pn.numel() == 0:
                continue
            if depth == 1:  # every node is a root: the walk from the root, computed once per pair of vocabularies
                prop, end, settled = (x.index_select(0, pc) for x in p.root_walk)
            else:
                prop, end, settled = walk_pairs(p.trie, self.state.index_select(0, pn), self.best.index_select(0, pn),
                                                pc, p.db, pn, self.state)
            w = self.path.index_select(0, pn) * self.laws[pn, p.db.ids.index_select(0, pc)]
            # a child stops when settled, below tau, or at its row's depth cap (min(lookahead, budget))
            stop = settled | (w < p.tau) | (self.cap.index_select(0, self.node_row.index_select(0, pn)) <= depth)
            if not p.greedy:
                counted = p._psi_counts(stop, settled, w, depth) & (prop >= 0)  # -1: no proposal (a dead text)
                self.psi.view(-1).index_add_(0, self.node_row.index_select(0, pn) * p.vt + prop.clamp(min=0),
                                             torch.where(counted, w, self.zero))
            grow = ~stop & (w > 0)
            gidx = torch.cumsum(grow.long(), 0) - 1 + offset
            rows_here, loc = self.own_children(pn, pc, first, want)
            if loc:
                li = torch.tensor(loc, dtype=torch.long, device=self.dev)
                for r, s_, pr, gi in zip(rows_here, stop.index_select(0, li).tolist(),
                                         prop.index_select(0, li).tolist(), gidx.index_select(0, li).tolist()):
                    decided[r] = (bool(s_), int(pr), int(gi))
            if bool(grow.any()):
                grown.append((pn[grow], pc[grow], w[grow], end[grow], prop[grow]))
                offset += int(grow.sum())
        return decided, grown

    def own_children(self, pn: Tensor, pc: Tensor, first: int, want: list[tuple[int, int]]
                     ) -> tuple[list[int], list[int]]:
        """The rows whose own child (key ``node * nt + column`` in ``want``) is among the pairs, and
        its index there: by position (greedy; dense chunks starting at key ``first``) or by key."""
        if self.p.greedy:
            return [r for r, _ in want], list(range(len(want)))
        rows_here: list[int] = []
        loc: list[int] = []
        if first < 0:  # sparse pairs: find the rows' own children by key
            nt = self.p.db.ids.shape[0]
            keys, perm = torch.sort(pn * nt + pc)
            wk = torch.tensor([key for _, key in want], dtype=torch.long, device=self.dev)
            at = torch.searchsorted(keys, wk).clamp(max=keys.shape[0] - 1)
            hit_l = (keys.index_select(0, at) == wk).tolist()
            for (r, _), h, a in zip(want, hit_l, perm.index_select(0, at).tolist()):
                if h:
                    rows_here.append(r)
                    loc.append(a)
            return rows_here, loc
        for r, key in want:
            if 0 <= key - first < pn.shape[0]:
                rows_here.append(r)
                loc.append(key - first)
        return rows_here, loc

    def settle_rows(self, live: list[int], picked: list[int], decided: dict[int, tuple[bool, int, int]],
                    e_prop: Tensor) -> None:
        """Each live row's own draft either decides its proposal (EOS, or a stopping child; a child
        not walked left the trie: the node's own longest prefix) or moves to its next-level node."""
        nxt = [-1] * self.r_n
        for r, d in zip(live, picked):
            if d == self.p.dt.eos_id:
                self.proposal[r] = int(e_prop[self.cur[r]])
                continue
            stops, pr, gi = decided.get(r, (True, int(self.best[self.cur[r]]), -1))
            if stops:
                self.proposal[r] = pr
            else:
                nxt[r] = gi
        self.cur = nxt

    def next_level(self, grown: list[Grown]) -> None:
        """The growing children become the next level's nodes; one batched drafter pass gives their laws."""
        parent = torch.cat([g[0] for g in grown])
        tokens = self.p.db.ids.index_select(0, torch.cat([g[1] for g in grown]))
        self.path = torch.cat([g[2] for g in grown])
        self.state = torch.cat([g[3] for g in grown])
        self.best = torch.cat([g[4] for g in grown])
        self.node_row = self.node_row.index_select(0, parent)
        self.laws = self.extend(parent, tokens, self.node_row).to(torch.float64)
        self.levels += 1
        for r in self.node_row.tolist():
            self.evals[r] += 1
