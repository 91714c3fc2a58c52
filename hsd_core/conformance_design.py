"""The conformance kit's design: its checkpoints as data, their weights and their exact logits (NumPy only).

:mod:`hsd_core.conformance` holds the references computed from them (and re-exports this module's names).

The kit (``hsd conformance kit --out DIR``, :mod:`hsd_torch.conformance`) holds four tiny Llama
checkpoints whose weights are **built on purpose**, so that their next-token laws are known by
construction and computed here in float64 (three in closed form, ``target_pos`` by a float64 forward):

* ``target``: byte-level BPE (GPT-2's byte alphabet, ``Ġ`` for a space, ``Ċ`` for a newline);
* ``drafter``: the target's tokenizer, another table (a drafter that disagrees with the target);
* ``drafter_sp``: a SentencePiece-style tokenizer (``▁`` for a space, byte fallback ``<0x0A>`` for a
  newline) whose pieces split some of the target's words otherwise (``" cat"`` is ``▁ca`` + ``t``),
  for cross-vocabulary methods (TLI);
* ``target_pos``: the target's tokenizer, a target whose law depends on **position ids** and on the
  ids of the context (below), for the bugs of an engine's cache and positions.

**The construction.** One decoder layer, hidden size :data:`HIDDEN`, head_dim :data:`HEAD_DIM`. Token
``i``'s embedding is ``c * e_i`` (a one-hot of scale :data:`EMBED_SCALE`); q, k, gate, up and down
projections are zero, so attention weighs the positions of the context uniformly and the MLP adds 0.
The value projection reads the BOS coordinate and the output projection writes it to the last hidden
coordinate (the *clock*): after the layer the residual at a position is ``c * e_last + (CLOCK * b / n)
* e_clock``, ``n`` the number of ids up to it (BOS included) and ``b`` the number of BOS among them.
The final RMSNorm divides by ``rms = sqrt((c^2 + clock^2) / d + eps)`` and the untied head's column
``i`` holds the designed logits row ``L[i, :]`` (scaled by ``rms`` without the clock), its clock
column ``-EOS_RISE`` at EOS. So the logits after a context are ``L[last, :] * s`` plus
``-EOS_RISE * b / n * s`` at EOS, with ``s = rms_0 / rms`` within 1.3e-4 of 1: a bigram table whose
EOS mass **rises with position** (the law depends on where a token stands, as engines' per-position
state does). Drafters have no clock.

**The table** (:data:`TARGET_ROWS`, over a dozen *live* ids; every other id has logit
:data:`DEAD`, probability exactly 0 in float64 and float32): a peaked row (`` the``), exact ties
(`` sat``: four ids of 1/4; `` ``: two of 1/2), a near tie (`` on``: logits 0 and 2^-12), EOS mass
early (``a``: 1/2 before the clock), the top-p boundary of :data:`TOP_P` just inside (`` cat``: the
third id's preceding mass 0.799) and just outside (`` dog``: 0.801), and a drafter table that
disagrees (:data:`DRAFTER_ROWS`: each row half the target's, half its rotation).

**The positional target** (``target_pos``). The same layer, plus a *previous-token head*: every
embedding also holds :data:`CONST` at a constant coordinate; query head :data:`POS_HEAD` and its KV
head read it into the first :data:`POS_PAIRS` rotary pairs (q: ``(a, 0)``, k: ``a (cos t_i, sin t_i)``
per pair ``i`` of angle ``t_i``), so after Hugging Face Llama's rotary embedding (pair ``i`` is
coordinates ``i`` and ``i + 32``, turned by ``position * ROPE_THETA ** (-2i / 64)``) a query scores the
key ``D`` positions back ``POS_SCORE * sum_i cos((D - 1) t_i)``: at least ``0.97 * POS_SCORE`` more at
``D = 1`` than at any other ``D`` up to 60. Its value carries the key's id as a slot (one per live id
but BOS and EOS) that the output projection writes to a coordinate of its own and the head turns
into :data:`COPY_BONUS` on that id: the law after a context is ``POS_ROWS[last]`` (six words, flat,
EOS after a word; with the clock) with the **id two back** raised by about ``COPY_BONUS`` (probability
about 0.57 instead of 0.15). So an engine whose position ids run on after a rejection makes the head
miss the previous id, and one that leaves a rejected column in its cache at the correction's position
gives the head two previous ids: both change a law by a TV of 0.3-0.5 (the target above is blind to
both: its q and k are zero, and one column more moves its clock by O(1/n^2)). No closed form:
:meth:`KitModel.logits` is :func:`forward64`, a float64 NumPy forward of the stored weights in
``LlamaForCausalLM``'s order (RMSNorm, rotary, grouped-query causal attention, SiLU MLP, head),
checked against transformers' forward and, on the other roles, against their closed form
(``tests/torch/conformance/test_kit.py``). No GGUF export (llama.cpp permutes q and k of llama GGUF
files; not verified here).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["BOS", "CLOCK", "CONST", "COPY_BONUS", "DEAD", "DRAFTER_ROWS", "EMBED_SCALE", "EOS", "EOS_RISE", "HEAD_DIM",
           "HIDDEN", "KitModel", "PAD", "POS_HEAD", "POS_PAIRS", "POS_ROWS", "POS_SCORE", "ROLES", "ROPE_THETA", "SPECIALS",
           "SP_ROWS", "TARGET_ROWS", "TOP_P", "UNK", "byte_alphabet", "forward64", "kit_model"]

F64 = npt.NDArray[np.float64]
F32 = npt.NDArray[np.float32]

HIDDEN = 512
"""Hidden size: at least the vocabulary plus the clock coordinate (the embeddings are one-hot)."""
HEAD_DIM = 64
"""Attention head size: vLLM's CPU attention refuses 16; 64 is what every engine's kernels take."""
HEADS, KV_HEADS, INTERMEDIATE, LAYERS = 8, 2, 128, 1
EMBED_SCALE = 16.0
"""``c``: the scale of the one-hot embeddings (so that RMSNorm's eps is negligible)."""
RMS_EPS = 1e-6
CLOCK = 0.25
"""The clock's value after a context of one BOS (it decays as ``1 / n``)."""
EOS_RISE = 1.5
"""The target's EOS logit is lowered by ``EOS_RISE * b / n``: EOS mass rises with the position."""
DEAD = -1.0e4
"""The logit of an id outside a row's live set: ``exp(DEAD)`` is exactly 0 in float64 and float32."""
TOP_P = 0.8
"""The top-p whose boundary the rows `` cat`` (just inside) and `` dog`` (just outside) straddle."""
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
UNK, BOS, EOS, PAD = 0, 1, 2, 3
ROLES = ("target", "drafter", "drafter_sp", "target_pos")
ROPE_THETA = 10000.0
"""The rotary base (``rope_theta`` in ``config.json``): pair ``i`` of a head turns by ``pos * ROPE_THETA **
(-2 i / HEAD_DIM)`` (Hugging Face Llama's convention: pair ``i`` is coordinates ``i`` and ``i + HEAD_DIM / 2``)."""
POS_HEAD = 4
"""``target_pos``: the query head of the previous-token head (it reads KV head 1; heads 0-3 read KV head 0)."""
POS_PAIRS = 4
"""``target_pos``: the rotary pairs the previous-token head's q and k use (the fastest four)."""
POS_SCORE = 25.0
"""``target_pos``: the previous-token head's attention score of a key ``D`` positions back is ``POS_SCORE *
sum_{i < POS_PAIRS} cos((D - 1) theta_i)``: largest at ``D = 1`` by at least ``0.97 * POS_SCORE`` over every
other ``D`` up to 60 (the softmax leaves less than ``e^-24`` a key elsewhere)."""
CONST = 4.0
"""``target_pos``: the embeddings' constant coordinate (every id's), which q and k read."""
COPY_BONUS = 2.0
"""``target_pos``: the logit the previous-token head adds to the id two back (the id before the last)."""

# Rows: the text of the last id -> {text of the next id: probability} ("</s>" is EOS). Probabilities
# become logits log(p); an explicit logit is written as ("logit", value).
TARGET_ROWS: dict[str, dict[str, Any]] = {
    "<s>": {" the": .4, " cat": .2, " dog": .2, "a": .1, "b": .1},
    " the": {" cat": .9, " dog": .09, "</s>": .01},  # peaked
    " cat": {" sat": .5, " on": .299, ".": .2, " the": .001},  # top-p 0.8: "." just inside (0.799 before it)
    " dog": {" sat": .5, " on": .301, ".": .19, " the": .009},  # top-p 0.8: "." just outside (0.801)
    " sat": {" on": .25, ".": .25, "\n": .25, " the": .25},  # flat: an exact four-way tie
    " on": {" the": ("logit", 0.0), "a": ("logit", 2.0 ** -12), "b": ("logit", -1.0), "</s>": ("logit", -1.0)},
    "a": {"</s>": .5, "b": .3, "s": .2},  # EOS mass early
    "b": {"ab": .6, "a": .4},
    "ab": {".": .7, "</s>": .3},
    "s": {".": .6, " ": .4},
    ".": {"\n": .5, "</s>": .5},
    "\n": {" the": .6, "</s>": .4},
    " ": {"a": .5, "b": .5},  # an exact tie of two
}
"""The target's designed rows (module docstring)."""


def _rotated(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each row half its own law, half that law moved one place along the row's ids: the same
    support, other masses (a drafter that disagrees with the target, but not everywhere)."""
    out: dict[str, dict[str, Any]] = {}
    for ctx, row in rows.items():
        keys = list(row)
        p = _row_probs(row)
        out[ctx] = {k: .5 * p[j] + .5 * p[j - 1] for j, k in enumerate(keys)}
    return out


def _row_probs(row: Mapping[str, Any]) -> list[float]:
    logits = [v[1] if isinstance(v, tuple) else math.log(v) for v in row.values()]
    m = max(logits)
    e = [math.exp(x - m) for x in logits]
    return [x / sum(e) for x in e]


_POS_WORDS = (" the", " cat", " dog", " sat", " on", ".")
POS_ROWS: dict[str, dict[str, Any]] = {"<s>": {w: 1 / 6 for w in _POS_WORDS},
                                       **{w: {**{x: .15 for x in _POS_WORDS}, "</s>": .1} for w in _POS_WORDS}}
"""``target_pos``'s bigram rows: flat over six words (and EOS after a word), so that what the
previous-token head adds (:data:`COPY_BONUS` to the id two back) decides much of each law."""

DRAFTER_ROWS = _rotated(TARGET_ROWS)
"""The same-vocabulary drafter's rows: each target row half itself, half rotated."""

SP_ROWS: dict[str, dict[str, Any]] = {
    ctx.replace(" cat", " ca") if ctx == " cat" else ctx: {k.replace(" cat", " ca"): v for k, v in row.items()}
    for ctx, row in DRAFTER_ROWS.items() if ctx != " cat"}
SP_ROWS[" ca"] = {"t": 1.0}
SP_ROWS["t"] = dict(DRAFTER_ROWS[" cat"])
"""The SentencePiece-style drafter's rows: the drafter's, with `` cat`` written `` ca`` + ``t``."""

_BPE_WORDS = (" the", " cat", " dog", " sat", " on", "ab")
_SP_WORDS = (" the", " ca", " dog", " sat", " on", "ab")
_SP_CHARS = ("▁", "a", "b", "s", ".", "t", "h", "e", "c", "d", "o", "g", "n")


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte 0..255 (``Ġ`` for a space, ``Ċ`` for a newline): the
    printable Latin-1 bytes stand for themselves, the others map to 256, 257, ... in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def _left_merges(tokens: list[str], words: list[list[str]]) -> list[tuple[str, str]]:
    """The merges that build each word of ``words`` (its pieces) left to right, one piece at a time; each
    new token is appended to ``tokens`` (in place) as its merge is made."""
    merges: list[tuple[str, str]] = []
    for pieces in words:
        cur = pieces[0]
        for nxt in pieces[1:]:
            if cur + nxt not in tokens:
                merges.append((cur, nxt))
                tokens.append(cur + nxt)
            cur = cur + nxt
    return merges


def _bpe_vocab() -> tuple[list[str], list[tuple[str, str]]]:
    alpha = byte_alphabet()
    tokens = list(SPECIALS) + alpha
    merges = _left_merges(tokens, [[alpha[b] for b in word.encode()] for word in _BPE_WORDS])
    return tokens, merges


def _sp_vocab() -> tuple[list[str], list[tuple[str, str]]]:
    tokens = list(SPECIALS) + [f"<0x{b:02X}>" for b in range(256)] + list(_SP_CHARS)
    merges = _left_merges(tokens, [list(word.replace(" ", "▁")) for word in _SP_WORDS])
    return tokens, merges


def _bpe_text(tok: str) -> bytes:
    inv = {c: b for b, c in enumerate(byte_alphabet())}
    return bytes(inv[c] for c in tok)


def _sp_text(tok: str) -> bytes:
    if len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
        return bytes([int(tok[3:5], 16)])
    return tok.replace("▁", " ").encode()


@dataclass(frozen=True)
class KitModel:
    """One kit checkpoint as data: its ``kind`` (``"byte_bpe"`` or ``"sentencepiece"``), tokens as its
    tokenizer writes them, merges, each id's text (bytes; specials: none), its rows and whether it has
    the clock. :attr:`weights` are the float32 tensors the checkpoint stores (HF names);
    :meth:`logits` the float64 logits a forward of those weights gives after a context."""

    role: str
    kind: str
    tokens: tuple[str, ...]
    merges: tuple[tuple[str, str], ...]
    rows: Mapping[str, Mapping[str, Any]]
    clock: bool
    pos_head: bool = False
    texts: tuple[bytes, ...] = field(init=False)
    _memo: dict[tuple[int, ...], F64] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        conv = _bpe_text if self.kind == "byte_bpe" else _sp_text
        object.__setattr__(self, "texts", tuple(b"" if i < len(SPECIALS) else conv(t)
                                                for i, t in enumerate(self.tokens)))
        object.__setattr__(self, "_memo", {})

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @cached_property
    def id_of_text(self) -> dict[str, int]:
        """The id of each row text (``"<s>"`` and ``"</s>"``: BOS, EOS): where several ids have the text,
        the **last** one, a piece rather than its byte-fallback ``<0xNN>`` (``"a"``, not ``<0x61>``),
        which is the id the kit's tokenizer encodes the text into (``tests/torch/conformance``)."""
        out: dict[str, int] = {"<s>": BOS, "</s>": EOS}
        for i in range(len(SPECIALS), len(self.tokens)):  # later ids (pieces, merges) win over byte fallbacks
            out[self.texts[i].decode("utf-8", "replace")] = i
        for ctx, row in self.rows.items():  # a live text must be one id: the longest written form
            for text in [ctx, *row]:
                if text not in out:
                    raise AssertionError(f"{self.role}: row text {text!r} has no id")
        return out

    @cached_property
    def live_ids(self) -> tuple[int, ...]:
        """The ids the rows put mass on or condition on (BOS and EOS included), increasing."""
        ids = {self.id_of_text[t] for ctx, row in self.rows.items() for t in [ctx, *row]}
        return tuple(sorted(ids))

    @cached_property
    def table(self) -> F64:
        """``[V, V]`` float64: row ``i`` the designed logits after id ``i`` (:data:`DEAD` outside its live set;
        a row no table entry names: all :data:`DEAD`, a uniform law never reached from live ids)."""
        v = self.vocab_size
        t = np.full((v, v), DEAD)
        for ctx, row in self.rows.items():
            i = self.id_of_text[ctx]
            for text, val in row.items():
                t[i, self.id_of_text[text]] = val[1] if isinstance(val, tuple) else math.log(val)
        return t

    @cached_property
    def copy_slots(self) -> tuple[int, ...]:
        """``target_pos``: the ids the previous-token head carries, slot ``j`` for the ``j``-th (the live
        ids but BOS and EOS, increasing); empty for the other roles."""
        return tuple(i for i in self.live_ids if i not in (BOS, EOS)) if self.pos_head else ()

    @cached_property
    def weights(self) -> dict[str, F32]:
        """The checkpoint's tensors (HF Llama names, float32): embeddings, the layer's projections (zero
        but value and output; ``target_pos``: also q and k of the previous-token head), norms (ones) and
        the head; the same bytes on every build."""
        v, d = self.vocab_size, HIDDEN
        c = np.float32(EMBED_SCALE)
        const = CONST if self.pos_head else 0.0
        rms0 = math.sqrt((float(c) ** 2 + const ** 2) / d + RMS_EPS)
        w: dict[str, F32] = {"model.embed_tokens.weight": (np.eye(v, d, dtype=np.float32) * c).astype(np.float32)}
        if self.pos_head:
            w["model.embed_tokens.weight"][:, _CONST_AT] = np.float32(const)
        p = "model.layers.0."
        w[p + "input_layernorm.weight"] = np.ones(d, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(d, np.float32)
        for name, shape in (("self_attn.q_proj", (HEADS * HEAD_DIM, d)), ("self_attn.k_proj", (KV_HEADS * HEAD_DIM, d)),
                            ("self_attn.v_proj", (KV_HEADS * HEAD_DIM, d)), ("self_attn.o_proj", (d, HEADS * HEAD_DIM)),
                            ("mlp.gate_proj", (INTERMEDIATE, d)), ("mlp.up_proj", (INTERMEDIATE, d)),
                            ("mlp.down_proj", (d, INTERMEDIATE))):
            w[p + name + ".weight"] = np.zeros(shape, np.float32)
        head = np.zeros((v, d), np.float32)
        head[:, :v] = (self.table.T * (rms0 / float(c))).astype(np.float32)
        if self.clock:
            g0 = float(c) / rms0  # the normed BOS coordinate the value projection reads
            w[p + "self_attn.v_proj.weight"][0, BOS] = np.float32(1.0)
            w[p + "self_attn.o_proj.weight"][d - 1, 0] = np.float32(CLOCK / g0)
            head[EOS, d - 1] = np.float32(-EOS_RISE * rms0 / CLOCK)
        if self.pos_head:
            self._previous_token_head(w, head, rms0)
        w["model.norm.weight"] = np.ones(d, np.float32)
        w["lm_head.weight"] = head
        return w

    @cached_property
    def weights64(self) -> dict[str, F64]:
        """:attr:`weights` as float64 (the values the checkpoint stores, widened)."""
        return {k: v.astype(np.float64) for k, v in self.weights.items()}

    def _previous_token_head(self, w: dict[str, F32], head: F32, rms0: float) -> None:
        """Write ``target_pos``'s previous-token head into ``w`` and ``head`` (module docstring): query
        head :data:`POS_HEAD` and its KV head read the constant coordinate, rotated so that their score
        peaks one position back; the value carries the id's slot, the output writes it to the slot's
        coordinate, the head turns that into :data:`COPY_BONUS` on the id."""
        d, hd, half = HIDDEN, HEAD_DIM, HEAD_DIM // 2
        c = float(EMBED_SCALE)
        slots = self.copy_slots
        if self.vocab_size + len(slots) + 2 > d or len(slots) > hd:
            raise AssertionError("target_pos: the hidden size has no room for its copy coordinates")
        gk, g0 = CONST / rms0, c / rms0  # the normed constant and token coordinates
        amp = math.sqrt(POS_SCORE * math.sqrt(hd))
        theta = ROPE_THETA ** (-np.arange(POS_PAIRS) * 2.0 / hd)
        kv = POS_HEAD // (HEADS // KV_HEADS)
        p = "model.layers.0.self_attn."
        q, k, val, o = (w[p + n + "_proj.weight"] for n in "qkvo")
        for i in range(POS_PAIRS):
            q[POS_HEAD * hd + i, _CONST_AT] = np.float32(amp / gk)
            k[kv * hd + i, _CONST_AT] = np.float32(amp * math.cos(theta[i]) / gk)
            k[kv * hd + half + i, _CONST_AT] = np.float32(amp * math.sin(theta[i]) / gk)
        for j, t in enumerate(slots):
            val[kv * hd + j, t] = np.float32(1.0 / g0)
            o[_copy_at(j), POS_HEAD * hd + j] = np.float32(1.0)
            head[t, _copy_at(j)] = np.float32(COPY_BONUS * rms0)

    def logits(self, context: Sequence[int]) -> F64:
        """``[V]`` float64: the logits a float64 forward of :attr:`weights` gives after ``context`` (BOS
        first, as the kit's prompts are), from the construction's closed form (module docstring);
        ``target_pos``: from :func:`forward64` of its weights (memoized per context)."""
        if not context:
            raise ValueError("a context needs at least one id (BOS first)")
        if self.pos_head:
            key = tuple(int(t) for t in context)
            if key not in self._memo:
                self._memo[key] = forward64(self.weights64, key)[-1]
            return self._memo[key]
        w = self.weights
        d, c = HIDDEN, float(EMBED_SCALE)
        last = int(context[-1])
        x = np.zeros(d)
        x[last] = c
        if self.clock:
            p = "model.layers.0.self_attn."
            g0 = c / math.sqrt(c * c / d + RMS_EPS)
            b = sum(1 for t in context if t == BOS)
            x[d - 1] += float(w[p + "o_proj.weight"][d - 1, 0]) * float(w[p + "v_proj.weight"][0, BOS]) * g0 * b / len(context)
        h = x / math.sqrt(float(np.mean(x * x)) + RMS_EPS)
        out: F64 = w["lm_head.weight"].astype(np.float64) @ h
        return out

    def text(self, ids: Sequence[int]) -> bytes:
        """The text of ``ids`` (specials add nothing)."""
        return b"".join(self.texts[int(i)] for i in ids)


_CONST_AT = HIDDEN - 2
"""``target_pos``: the embeddings' constant coordinate (the clock is the last one)."""


def _copy_at(slot: int) -> int:
    """``target_pos``: the residual coordinate the previous-token head writes slot ``slot`` to."""
    return HIDDEN - 3 - slot


def _rms_norm(x: F64, weight: F64) -> F64:
    out: F64 = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS) * weight
    return out


def _rotary(x: F64, positions: F64) -> F64:
    """Hugging Face Llama's rotary embedding of ``x [n, heads, HEAD_DIM]`` at ``positions [n]``: pair
    ``i`` (coordinates ``i`` and ``i + HEAD_DIM/2``) turned by ``position * ROPE_THETA ** (-2i / HEAD_DIM)``."""
    half = HEAD_DIM // 2
    ang = positions[:, None] * ROPE_THETA ** (-np.arange(half) * 2.0 / HEAD_DIM)[None, :]
    cos = np.cos(np.concatenate([ang, ang], axis=-1))[:, None, :]
    sin = np.sin(np.concatenate([ang, ang], axis=-1))[:, None, :]
    turned = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    out: F64 = x * cos + turned * sin
    return out


def forward64(weights: Mapping[str, npt.NDArray[Any]], ids: Sequence[int]) -> F64:
    """``[len(ids), V]`` float64: the logits of the kit's one-layer Llama (``weights``: HF names, as
    :attr:`KitModel.weights`) at each position of ``ids``, computed in float64 as ``LlamaForCausalLM``
    computes them: RMSNorm, grouped-query causal attention with the rotary embedding
    (:func:`_rotary`, positions ``0 .. len(ids)-1``), SiLU MLP, final RMSNorm, head."""
    x0 = np.asarray(ids, dtype=np.int64)
    n, hd = len(x0), HEAD_DIM
    p = "model.layers.0."
    W = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    x = W["model.embed_tokens.weight"][x0]
    h = _rms_norm(x, W[p + "input_layernorm.weight"])
    pos = np.arange(n, dtype=np.float64)
    q = _rotary((h @ W[p + "self_attn.q_proj.weight"].T).reshape(n, HEADS, hd), pos)
    k = _rotary((h @ W[p + "self_attn.k_proj.weight"].T).reshape(n, KV_HEADS, hd), pos)
    v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(n, KV_HEADS, hd)
    group = HEADS // KV_HEADS
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
    s = np.where(np.tril(np.ones((n, n), dtype=bool))[None], s, -np.inf)
    a = np.exp(s - s.max(axis=-1, keepdims=True))
    a /= a.sum(axis=-1, keepdims=True)
    x = x + np.einsum("hqk,khd->qhd", a, v).reshape(n, HEADS * hd) @ W[p + "self_attn.o_proj.weight"].T
    h = _rms_norm(x, W[p + "post_attention_layernorm.weight"])
    g = h @ W[p + "mlp.gate_proj.weight"].T
    x = x + (g / (1.0 + np.exp(-g)) * (h @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
    out: F64 = _rms_norm(x, W["model.norm.weight"]) @ W["lm_head.weight"].T
    return out


@lru_cache(maxsize=None)
def kit_model(role: str) -> KitModel:
    """The kit's checkpoint ``role`` (:data:`ROLES`) as data (one shared object per role: do not
    change its arrays)."""
    if role == "target":
        t, m = _bpe_vocab()
        return KitModel("target", "byte_bpe", tuple(t), tuple(m), TARGET_ROWS, True)
    if role == "drafter":
        t, m = _bpe_vocab()
        return KitModel("drafter", "byte_bpe", tuple(t), tuple(m), DRAFTER_ROWS, False)
    if role == "drafter_sp":
        t, m = _sp_vocab()
        return KitModel("drafter_sp", "sentencepiece", tuple(t), tuple(m), SP_ROWS, False)
    if role == "target_pos":
        t, m = _bpe_vocab()
        return KitModel("target_pos", "byte_bpe", tuple(t), tuple(m), POS_ROWS, True, pos_head=True)
    raise ValueError(f"unknown kit role {role!r}; one of {', '.join(ROLES)}")
