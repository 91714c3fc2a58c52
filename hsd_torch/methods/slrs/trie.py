"""Bounded SLRS's proposal map over token byte strings: a byte trie of the target vocabulary
(:class:`TargetTrie`), the drafter tokens' bytes as a padded matrix (:class:`DrafterBytes`), and
the vectorized walks that read target ids off drafted text: :func:`walk_pairs` (the longest target
token prefixing a text, and whether it is settled) and :func:`parse_pairs` (the greedy
longest-prefix parse of many texts at once: ``hsd_core``'s ``LongestPrefixMap.parse``).

Sorted ``node * 256 + byte`` keys and ``searchsorted``: no Python loop over the vocabulary.

Where no target token starts the rest of a text (a byte the target has no token for: the
alphabets differ), the text is *dead* there: its parse ends, no continuation reads more, so the
ids read so far are settled (``hsd_core``'s ``LongestPrefixMap``); a one-token walk of a text that
is dead at once proposes nothing (-1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ...engine._cache import IdentityCache
from ...vocab.text import TokenText

__all__ = ["NEVER", "DrafterBytes", "SuffixParses", "TargetTrie", "join", "pad_bytes", "pad_ids", "parse_pairs",
           "suffix_parses", "walk", "walk_pairs"]


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


NEVER = 1 << 40
"""``f`` of :func:`parse_pairs` for a text whose first ``limit`` ids are settled."""


def _child(trie: TargetTrie, key: Tensor, end: Tensor) -> tuple[Tensor, Tensor]:
    """For trie keys ``node * 256 + byte`` ``[A]`` (``end``: the text is used up there): whether the
    child exists (bool ``[A]``) and the child node (-1: none)."""
    nkeys = trie.keys.shape[0]
    if not nkeys:
        return torch.zeros_like(end), torch.full_like(key, -1)
    kp = torch.searchsorted(trie.keys, key).clamp(max=nkeys - 1)
    found = (trie.keys.index_select(0, kp) == key) & ~end
    return found, torch.where(found, trie.child.index_select(0, kp), torch.full_like(key, -1))


def _write_ids(columns: list[Tensor], rows: Tensor, at: Tensor, ids: Tensor, p_n: int) -> None:
    """``columns[at[i]][rows[i]] = ids[i]``: the ``at[i]``-th id read off text ``rows[i]`` (columns
    ``[P]``, -1 where none, allocated as some text reaches them)."""
    lo_c, hi_c = int(at.min()), int(at.max())
    while len(columns) <= hi_c:
        columns.append(torch.full((p_n,), -1, dtype=torch.long, device=rows.device))
    if lo_c == hi_c:
        columns[lo_c][rows] = ids
        return
    for cv in range(lo_c, hi_c + 1):
        at_c = at == cv
        columns[cv][rows[at_c]] = ids[at_c]


def _head_walks(trie: TargetTrie, heads: Tensor, head_len: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per head ``n`` (``heads [N, H]``, ``head_len [N]``): the trie walk from the root along its
    bytes while they stay in the trie: bytes walked, the trie state reached, the longest target
    token met on the way (lowest id, -1: none) and its length. :func:`parse_pairs`'s first token of
    every text whose head this is starts there."""
    n = head_len.shape[0]
    walked, state, blen = (torch.zeros(n, dtype=torch.long, device=head_len.device) for _ in range(3))
    best = torch.full_like(walked, -1)
    go = torch.nonzero(head_len > 0).flatten()
    for j in range(heads.shape[1]):
        if go.numel() == 0:
            break
        found, child = _child(trie, state.index_select(0, go) * 256 + heads[go, j], torch.zeros_like(go, dtype=torch.bool))
        go, child = go[found], child[found]
        state[go] = child
        walked[go] = j + 1
        tm = trie.term.index_select(0, child)
        best[go[tm >= 0]] = tm[tm >= 0]
        blen[go[tm >= 0]] = j + 1
        go = go[head_len.index_select(0, go) > j + 1]
    return walked, state, best, blen


def parse_pairs(trie: TargetTrie, heads: Tensor, head_len: Tensor, node: Tensor, col: Tensor, db: DrafterBytes,
                limit: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The longest-prefix parse (``hsd_core``'s ``LongestPrefixMap.parse``) of many texts at once.

    Text ``i`` is ``heads[node[i], :head_len[node[i]]]`` (bytes, ``heads [N, H]`` padded) followed by
    the bytes of drafter column ``col[i]`` of ``db`` (nothing when ``col[i] < 0``); at most
    ``limit[i]`` ids are read off it. Returns ``ids [P, W]`` (-1 padding), ``n [P]`` (ids read),
    ``f [P]`` and ``fpos [P]``: ``f`` is the first ``j < limit`` at which the rest of the text
    (after the first ``j`` ids) is empty or a proper prefix of a target token, i.e. the first ``f``
    ids are settled and the ``f+1``-th is not (``LongestPrefixMap.settled(text, m)`` iff
    ``f >= m``; :data:`NEVER` when the first ``limit`` are settled), and ``fpos`` the byte offset
    of that rest. A dead text (module docstring) ends its parse.

    Cost: one vectorized step per byte walked (``searchsorted`` over the trie's keys) while a
    pair's next token starts inside its node's head (the walk through the head itself is taken once
    per node); once it starts inside the drafter token's bytes, the rest of the parse depends on
    that token and offset alone and is read off :func:`suffix_parses` (built once per pair of
    vocabularies)."""
    table = suffix_parses(trie, db)
    return _parse(trie, heads, head_len, node, col, db, limit, torch.zeros_like(col), table)


class SuffixParses:
    """The parse of every suffix of every drafter token's bytes (``db.data[c, o:length[c]]``), unlimited,
    as :func:`parse_pairs` returns it: suffix ``s = start[c] + o`` read ``n[s]`` ids,
    ``flat[at[s] : at[s] + n[s]]``, and has ``f[s]``, ``fpos[s]``. Ragged, and built in chunks of
    :data:`SUFFIX_CHUNK` suffixes: with a large drafter vocabulary against a target with short tokens a
    padded ``[suffixes, longest parse]`` matrix would take hundreds of MB (Gemma's 262,144 ids: 1.97M
    suffixes of up to 39 SmolLM2 ids)."""

    def __init__(self, trie: TargetTrie, db: DrafterBytes) -> None:
        dev = db.length.device
        self.start = db.length.cumsum(0) - db.length
        total = int(db.length.sum())
        cols = torch.repeat_interleave(torch.arange(db.length.shape[0], device=dev), db.length)
        offs = torch.arange(total, device=dev) - self.start.index_select(0, cols)
        none = torch.full((1, 1), -1, dtype=torch.long, device=dev)
        flats: list[Tensor] = []
        ns: list[Tensor] = []
        fs: list[Tensor] = []
        fposs: list[Tensor] = []
        for a in range(0, total, SUFFIX_CHUNK):
            c, o = cols[a:a + SUFFIX_CHUNK], offs[a:a + SUFFIX_CHUNK]
            ids, n, f, fpos = _parse(trie, none, torch.zeros(1, dtype=torch.long, device=dev), torch.zeros_like(c), c, db,
                                     torch.full_like(c, NEVER), o, None)
            flats.append(ids[torch.arange(ids.shape[1], device=dev).unsqueeze(0) < n.unsqueeze(1)].to(torch.int32))
            ns.append(n)
            fs.append(f)
            fposs.append(fpos)
        empty = torch.zeros(0, dtype=torch.long, device=dev)
        self.flat = torch.cat(flats) if flats else empty.to(torch.int32)  # ids, row-major; int32 halves it
        self.n = torch.cat(ns) if ns else empty
        self.f = torch.cat(fs) if fs else empty
        self.fpos = torch.cat(fposs) if fposs else empty
        self.at = self.n.cumsum(0) - self.n


SUFFIX_CHUNK = 1 << 17
"""Suffixes parsed per step when :class:`SuffixParses` is built."""


_SUFFIXES: IdentityCache[SuffixParses] = IdentityCache()


def suffix_parses(trie: TargetTrie, db: DrafterBytes) -> SuffixParses:
    """:class:`SuffixParses` of ``db`` over ``trie``, cached per pair of objects."""
    return _SUFFIXES.get((trie, db), (), lambda: SuffixParses(trie, db))


def _parse(trie: TargetTrie, heads: Tensor, head_len: Tensor, node: Tensor, col: Tensor, db: DrafterBytes,
           limit: Tensor, skip: Tensor, table: SuffixParses | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`parse_pairs`, the drafter bytes of pair ``i`` starting at offset ``skip[i]``; with
    ``table``, a pair whose next token starts in its drafter bytes reads the rest off it."""
    dev = node.device
    p_n = node.shape[0]
    lh = head_len.index_select(0, node)
    ld = torch.where(col >= 0, db.length.index_select(0, col.clamp(min=0)) - skip, torch.zeros_like(col))
    total = lh + ld
    pos = torch.zeros(p_n, dtype=torch.long, device=dev)
    cnt = torch.zeros_like(pos)
    # every pair of a node starts with the same walk through the node's head: taken once per node
    h_walked, h_state, h_best, h_blen = _head_walks(trie, heads, head_len)
    walked, st = h_walked.index_select(0, node), h_state.index_select(0, node)
    best, blen = h_best.index_select(0, node), h_blen.index_select(0, node)
    f = torch.full_like(pos, NEVER)
    fpos = torch.zeros_like(pos)
    dead = torch.zeros(p_n, dtype=torch.bool, device=dev)
    columns: list[Tensor] = []  # the j-th id of every pair (-1: none), allocated as some pair reaches it
    empty = (total == 0) & (limit > 0)
    f[empty] = 0
    act = torch.nonzero((total > 0) & (limit > 0)).flatten()
    if table is not None:
        act = _from_table(table, act, lh, col, pos, cnt, f, fpos, limit, columns, p_n)
    hw, dw = max(heads.shape[1], 1), max(db.data.shape[1], 1)
    if heads.shape[1] == 0:
        heads = torch.full((heads.shape[0], 1), -1, dtype=torch.long, device=dev)
    while act.numel():
        at = pos.index_select(0, act) + walked.index_select(0, act)
        end = at >= total.index_select(0, act)
        lha = lh.index_select(0, act)
        hb = heads[node.index_select(0, act), at.clamp(max=hw - 1)]
        dbyte = db.data[col.index_select(0, act).clamp(min=0),
                        (at - lha + skip.index_select(0, act)).clamp(min=0, max=dw - 1)]
        key = st.index_select(0, act) * 256 + torch.where(at < lha, hb, dbyte)
        found, child = _child(trie, key, end)
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
            newly = fin[in_p & (f.index_select(0, fin) == NEVER)]
            f[newly] = cnt[newly]
            fpos[newly] = pos[newly]
            b = best.index_select(0, fin)
            dead[fin[b < 0]] = True  # nothing after is read, and f stays (a dead text is settled)
            fin, b = fin[b >= 0], b[b >= 0]
        if fin.numel():
            _write_ids(columns, fin, cnt.index_select(0, fin), b, p_n)
            pos[fin] += blen.index_select(0, fin)
            cnt[fin] += 1
            st[fin] = 0
            walked[fin] = 0
            best[fin] = -1
            blen[fin] = 0
            used_up = pos.index_select(0, fin) >= total.index_select(0, fin)
            short = used_up & (cnt.index_select(0, fin) < limit.index_select(0, fin)) \
                & (f.index_select(0, fin) == NEVER)
            fs = fin[short]
            f[fs] = cnt[fs]
            fpos[fs] = pos[fs]
        keep = (pos.index_select(0, act) < total.index_select(0, act)) \
            & (cnt.index_select(0, act) < limit.index_select(0, act)) & ~dead.index_select(0, act)
        act = act[keep]
        if table is not None and fin.numel():
            act = _from_table(table, act, lh, col, pos, cnt, f, fpos, limit, columns, p_n)
    ids = torch.stack(columns, dim=1) if columns else torch.full((p_n, 1), -1, dtype=torch.long, device=dev)
    return ids, cnt, f, fpos


def _from_table(table: SuffixParses, act: Tensor, lh: Tensor, col: Tensor, pos: Tensor, cnt: Tensor, f: Tensor,
                fpos: Tensor, limit: Tensor, columns: list[Tensor], p_n: int) -> Tensor:
    """The active pairs whose next token starts inside their drafter bytes (``pos >= head length``,
    between tokens: their walk state is the root) take the rest of their parse from ``table``
    (ids up to ``limit``, ``f`` and ``fpos`` shifted by what was read before); returns the others."""
    sw = (pos.index_select(0, act) >= lh.index_select(0, act)) & (col.index_select(0, act) >= 0)
    if not bool(sw.any()):
        return act
    pr = act[sw]
    row = table.start.index_select(0, col.index_select(0, pr)) + pos.index_select(0, pr) - lh.index_select(0, pr)
    c0 = cnt.index_select(0, pr)
    rem = limit.index_select(0, pr) - c0
    take = torch.minimum(table.n.index_select(0, row), rem)
    for k in range(int(take.max()) if take.numel() else 0):
        on = take > k
        _write_ids(columns, pr[on], c0[on] + k, table.flat.index_select(0, table.at.index_select(0, row[on]) + k).long(), p_n)
    cnt[pr] = c0 + take
    fs = table.f.index_select(0, row)
    # the suffix's first unsettled count, within the limit (NEVER: none), unless the text's end was
    # already met inside a proper prefix of a target token (f is the first such count)
    setf = (fs < rem) & (f.index_select(0, pr) == NEVER)
    f[pr[setf]] = c0[setf] + fs[setf]
    fpos[pr[setf]] = pos.index_select(0, pr)[setf] + table.fpos.index_select(0, row)[setf]
    return act[~sw]


def pad_bytes(texts: Sequence[bytes], device: torch.device) -> tuple[Tensor, Tensor]:
    """``texts`` as ``[N, W]`` byte values (-1 padding, ``W >= 1``) and their lengths ``[N]`` (int64)."""
    width = max((len(t) for t in texts), default=0)
    out = torch.full((len(texts), max(width, 1)), -1, dtype=torch.long)
    for i, t in enumerate(texts):
        if t:
            out[i, :len(t)] = torch.tensor(list(t), dtype=torch.long)
    return out.to(device), torch.tensor([len(t) for t in texts], dtype=torch.long, device=device)


def join(prefix: Tensor, prefix_len: Tensor, node: Tensor, suffix: Tensor, suffix_len: Tensor,
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


def pad_ids(rows: Sequence[Sequence[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    """``rows`` of ids as ``[N, W]`` (-1 padding, ``W >= 1``) and their lengths ``[N]`` (int64)."""
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), max(width, 1)), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            out[i, :len(r)] = torch.tensor(list(r), dtype=torch.long)
    return out.to(device), torch.tensor([len(r) for r in rows], dtype=torch.long, device=device)
