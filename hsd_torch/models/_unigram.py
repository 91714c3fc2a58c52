"""A deterministic Unigram-LM trainer (the SentencePiece algorithm, simplified), for
:func:`hsd_torch.models.tiny.train_unigram_byte_fallback`.

Why not ``tokenizers.trainers.UnigramTrainer``: it is not deterministic. It keeps the pre-tokenized
words in a Rust ``HashMap`` (std ``RandomState``, keys drawn per process) and runs the EM over them
in that map's order, so its floating-point sums come out in a different order in every process
(also with ``RAYON_NUM_THREADS=1`` and a fixed ``PYTHONHASHSEED``): the scores differ in their last
bits, near-equal scores swap places, and the ids of the trained tokenizer differ from process to
process (and with them every model built over it).

This trainer does what SentencePiece's does, on a fixed order:

1. seed pieces: every character of the words (required, so any word is segmentable), plus the
   ``seed_factor * n_pieces`` most frequent substrings of 2..``max_piece_length`` characters
   inside a word (ranked by frequency times length, occurring at least twice), with initial
   log-probabilities from their frequencies;
2. EM: ``sub_iterations`` rounds of forward-backward over every word's lattice of pieces (log space,
   weighted by the word's count) and the Bayesian M-step of SentencePiece (``digamma(count) -
   digamma(total)``), dropping non-character pieces with an expected count below 0.5;
3. pruning: keep the characters and the non-character pieces with the largest expected counts,
   ``shrinking_factor`` of the vocabulary per round, until at most ``n_pieces`` remain. (SentencePiece
   ranks by the likelihood lost when a piece is removed; the expected count is the simpler rule.)

Determinism: words and candidates are visited in sorted order, every ranking breaks ties by the
piece string, rankings and the 0.5 threshold compare values rounded to 1e-6 (so that a last-bit
difference, e.g. from another CPU's ``exp``, is unlikely to change a decision), and sums run in a
fixed order (``numpy.bincount``, ``math.fsum``); nothing depends on a hash order, a thread count or
a random draw. The result is a function of ``words`` and the arguments (on one platform:
``tests/torch/models/test_tiny_determinism.py`` compares processes).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def digamma(x: float) -> float:
    """The digamma function for ``x > 0`` (the asymptotic series SentencePiece uses)."""
    result = 0.0
    while x < 7.0:
        result -= 1.0 / x
        x += 1.0
    x -= 0.5
    xx = 1.0 / x
    xx2 = xx * xx
    xx4 = xx2 * xx2
    return (result + math.log(x) + xx2 / 24.0 - 7.0 / 960.0 * xx4 + 31.0 / 8064.0 * xx4 * xx2
            - 127.0 / 30720.0 * xx4 * xx4)


def _key(x: float) -> float:
    """A ranking key that a last-bit difference in ``x`` does not change (but at a rounding edge)."""
    return round(x, 6)


class _Sweep:
    """The lattice edges of all words for one direction of forward-backward, grouped by position
    (the sweep order) and, within a position, by word: one logsumexp per (position, word)."""

    def __init__(self, pos: IntArray, word: IntArray, node_from: IntArray, node_to: IntArray, piece: IntArray,
                 order: IntArray) -> None:
        self.node_from, self.piece = node_from[order], piece[order]
        p, w, to = pos[order], word[order], node_to[order]
        n = len(order)
        new_group = np.ones(n, dtype=bool)
        new_group[1:] = (p[1:] != p[:-1]) | (w[1:] != w[:-1])
        group_start = np.flatnonzero(new_group)
        self.group = np.cumsum(new_group) - 1
        self.group_node = to[group_start]
        cut = np.flatnonzero(np.r_[True, p[1:] != p[:-1]]) if n else np.zeros(0, dtype=np.int64)
        self.steps: list[tuple[int, int, int, int, IntArray]] = []
        for a, b in zip(cut.tolist(), np.r_[cut[1:], n].tolist()):
            ga, gb = int(self.group[a]), int(self.group[b - 1]) + 1
            self.steps.append((a, b, ga, gb, group_start[ga:gb] - a))

    def run(self, value: FloatArray, logp: FloatArray) -> FloatArray:
        """Fill ``value`` (log forward or backward scores per lattice node; the sweep's start
        nodes set by the caller) in sweep order; returns it."""
        for a, b, ga, gb, starts in self.steps:
            x = value[self.node_from[a:b]] + logp[self.piece[a:b]]
            m = np.maximum.reduceat(x, starts)
            g = self.group[a:b] - ga
            s = np.bincount(g, weights=np.exp(x - m[g]), minlength=gb - ga)
            value[self.group_node[ga:gb]] = m + np.log(s)
        return value


def train_unigram(words: Sequence[tuple[str, int]], n_pieces: int, *, max_piece_length: int = 12,
                  seed_factor: int = 8, shrinking_factor: float = 0.75,
                  sub_iterations: int = 2) -> list[tuple[str, float]]:
    """``[(piece, log-probability), ...]``, at most ``n_pieces`` of them, by decreasing score
    (ties by piece), for a Unigram LM over ``words`` (``(word, count)`` pairs, e.g. Metaspace
    pre-tokenized text). Every character of the words is a piece, unless there are more than
    ``n_pieces`` characters (then the most frequent ones). Deterministic (module docstring)."""
    if n_pieces < 1:
        raise ValueError(f"n_pieces must be >= 1, got {n_pieces}")
    words = sorted((w, int(c)) for w, c in words if w and c > 0)
    all_chars: Counter[str] = Counter()
    for w, c in words:
        for ch in w:
            all_chars[ch] += c
    if len(all_chars) > n_pieces:  # only the most frequent characters: split words at the others
        kept = set(sorted(all_chars, key=lambda s: (-all_chars[s], s))[:n_pieces])
        parts: Counter[str] = Counter()
        for w, c in words:
            part = ""
            for ch in w:
                if ch in kept:
                    part += ch
                    continue
                if part:
                    parts[part] += c
                part = ""
            if part:
                parts[part] += c
        words = sorted(parts.items())
    chars: Counter[str] = Counter()
    subs: Counter[str] = Counter()
    for w, c in words:
        for i, ch in enumerate(w):
            chars[ch] += c
            for j in range(i + 2, min(len(w), i + max_piece_length) + 1):
                subs[w[i:j]] += c
    char_list = sorted(chars, key=lambda s: (-chars[s], s))[:n_pieces]
    cands = sorted((s for s, f in subs.items() if f >= 2), key=lambda s: (-subs[s] * len(s), s))
    cands = cands[:max(0, seed_factor * n_pieces - len(char_list))]
    pieces = char_list + cands
    n_all = len(pieces)
    is_char = np.zeros(n_all, dtype=bool)
    is_char[:len(char_list)] = True
    freq = [float(chars[s]) for s in char_list] + [float(subs[s]) for s in cands]
    logp: FloatArray = np.log(np.array(freq)) - math.log(math.fsum(freq))
    index = {s: k for k, s in enumerate(pieces)}

    # the lattice: an edge per (word, start, end) whose substring is a piece; node = offset + position
    starts_l: list[int] = []
    ends_l: list[int] = []
    pieces_l: list[int] = []
    words_l: list[int] = []
    offsets_l: list[int] = []
    n_nodes = 0
    for wi, (w, _) in enumerate(words):
        offsets_l.append(n_nodes)
        n = len(w)
        for i in range(n):
            for j in range(i + 1, min(n, i + max_piece_length) + 1):
                k = index.get(w[i:j])
                if k is not None:
                    starts_l.append(i)
                    ends_l.append(j)
                    pieces_l.append(k)
                    words_l.append(wi)
        n_nodes += n + 1
    offsets = np.array(offsets_l, dtype=np.int64)
    last = offsets + np.array([len(w) for w, _ in words], dtype=np.int64)
    weight = np.array([float(c) for _, c in words])
    start, end = np.array(starts_l, dtype=np.int64), np.array(ends_l, dtype=np.int64)
    piece, word = np.array(pieces_l, dtype=np.int64), np.array(words_l, dtype=np.int64)
    node_start, node_end = offsets[word] + start, offsets[word] + end
    forward_order = np.lexsort((word, end))       # by end position, then word
    backward_order = np.lexsort((word, -start))   # by start position, descending, then word
    alive = np.ones(n_all, dtype=bool)

    def sweeps() -> tuple[_Sweep, _Sweep, IntArray]:
        live = alive[piece]
        fo, bo = forward_order[live[forward_order]], backward_order[live[backward_order]]
        return (_Sweep(end, word, node_start, node_end, piece, fo),
                _Sweep(start, word, node_end, node_start, piece, bo), np.flatnonzero(live))

    def expected_counts() -> FloatArray:
        fw, bw, live = sweeps()
        alpha = np.full(n_nodes, -np.inf)
        alpha[offsets] = 0.0
        alpha = fw.run(alpha, logp)
        beta = np.full(n_nodes, -np.inf)
        beta[last] = 0.0
        beta = bw.run(beta, logp)
        s, e, k, w = node_start[live], node_end[live], piece[live], word[live]
        post = np.exp(alpha[s] + logp[k] + beta[e] - alpha[last][w])
        counts: FloatArray = np.asarray(np.bincount(k, weights=weight[w] * post, minlength=n_all), dtype=np.float64)
        return counts

    while True:
        counts = np.zeros(n_all)
        for _ in range(sub_iterations):
            counts = expected_counts()
            alive &= is_char | (np.round(counts, 6) >= 0.5)
            live = np.flatnonzero(alive).tolist()
            total = digamma(math.fsum(counts[live].tolist()))
            new = np.full(n_all, -np.inf)
            for k in live:
                new[k] = digamma(max(float(counts[k]), 1e-3)) - total
            logp = new
        n_alive = int(alive.sum())
        if n_alive <= n_pieces:
            break
        n_keep = max(n_pieces, int(n_alive * shrinking_factor)) - int((alive & is_char).sum())
        others = np.flatnonzero(alive & ~is_char).tolist()
        others.sort(key=lambda k: (-_key(float(counts[k])), pieces[k]))
        for k in others[max(0, n_keep):]:
            alive[k] = False
            logp[k] = -np.inf
    out = [(pieces[k], float(logp[k])) for k in np.flatnonzero(alive).tolist()]
    out.sort(key=lambda ps: (-_key(ps[1]), ps[0]))
    return out
