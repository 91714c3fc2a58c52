"""The target's next-token law after an engine's sampling processing, exactly, in float64 (NumPy only).

Serving engines turn a model's raw logits into the law they sample from with a chain of stages
(temperature, top-k, top-p, min-p, repetition / presence / frequency penalties, logit bias, bad
words, allowed token ids, a minimum number of new tokens), and they end a draw at an end id, at the
budget or at a stop string. The stages do not commute (min-p before or after top-p, penalties
before or after temperature, top-k that keeps ties or exactly k ids), so a reference law names the
engine whose order it follows. This module computes that law for three engines' documented orders
(:data:`ORDERS`), each stage written once (:func:`keep_top_k`, :func:`keep_top_p`, ...) and
composed by :func:`vllm_logits`, :func:`llama_cpp_logits` and :func:`transformers_logits`:

``"vllm"``, vLLM's V1 sampler
    ``vllm/v1/sample/sampler.py``, ``Sampler`` (its class docstring lists the steps) with
    ``Sampler.apply_logits_processors`` and ``Sampler.sample``: allowed token ids (the others -inf);
    bad words (``vllm/v1/sample/ops/bad_words.py``, ``apply_bad_words``: a word's last id is banned
    when its other ids end the **output**); the non-argmax-invariant logits processors, min_tokens
    (the stop ids -inf while fewer than ``min_tokens`` ids are out) and logit bias (added); the
    penalties (``vllm/v1/sample/ops/penalties.py``, ``apply_all_penalties``: repetition over the
    ids of the prompt **and** the output, a positive logit divided, another multiplied; frequency
    times the output count and presence once, over the **output** only); greedy takes the argmax
    here; temperature (division); the argmax-invariant processors, min-p (``builtin.py``,
    ``MinPLogitsProcessor``: ids whose probability is below ``min_p`` times the largest removed);
    then top-k (ids below the k-th largest logit removed: ties at the k-th kept) and top-p on the
    top-k law renormalized (``ops/topk_topp_sampler.py``, ``apply_top_k_top_p``).
``"llama.cpp"``, llama.cpp's sampler chain
    ``common/sampling.cpp``, ``common_sampler_init``: a logit-bias sampler first, then the chain
    ``params.samplers`` (the default of ``common/common.h``: penalties, DRY, top-n-sigma, top-k,
    typical-p, top-p, min-p, XTC, temperature; this module models penalties, top-k, top-p, min-p and
    temperature, the others being off), then ``dist``. Penalties (``src/llama-sampler.cpp``,
    ``llama_sampler_penalties_apply``) act on the ids the sampler accepted, counted over the last
    ``penalty_last_n`` of them (the server pushes the prompt's ids in too): a logit ``<= 0``
    multiplied by the repetition penalty, else divided, then ``count * frequency + presence``
    subtracted. Top-k keeps **exactly** k ids (a sort: ties at the k-th id are broken by the sort, so
    a law with such a tie is not determined: :class:`AmbiguousLawError`). Top-p, min-p and top-k
    act on the **untempered** law: temperature comes last.
``"transformers"``, transformers' ``generate``
    ``transformers/generation/utils.py``, ``GenerationMixin._get_logits_processor``: sequence bias
    (one-id sequences: a logit bias), repetition penalty (over prompt and output), bad words (over
    prompt and output), ``min_new_tokens``; then the warpers temperature, top-k (ties kept), top-p,
    min-p. transformers has no presence / frequency penalty and no allowed-ids list: those are
    refused for this order.

Every order's top-p keeps, in order of decreasing probability, the ids whose preceding mass is
below ``top_p`` (always the first); where tied probabilities straddle that boundary the engines'
sorts decide which of them is kept, and the law is refused (:class:`AmbiguousLawError`), as it is
for llama.cpp's top-k. Greedy (``do_sample`` false) is the point law at the argmax of the processed
logits, the lowest id among tied maxima (``torch.argmax``'s rule; llama.cpp's is its sort's).

Seeds do not enter the law: each seed gives one independent draw from it. **Stop strings** make the
law one over text: a draw ends after the first new token whose text completes a stop string
(:class:`StopStrings`), with finish reason ``"stop"``; the ids up to and including that token are
what the engine returns (vLLM and llama.cpp look for a stop string in the output text only,
transformers' ``StopStringCriteria`` in prompt and output: :func:`stop_text_prefix`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["ORDERS", "AmbiguousLawError", "StopStrings", "add_logit_bias", "ban_bad_words", "greedy_law",
           "keep_allowed", "keep_min_p", "keep_top_k", "keep_top_p", "llama_cpp_logits", "next_law", "penalize",
           "processed_logits", "softmax", "stop_text_prefix", "transformers_logits", "vllm_logits"]

F64 = npt.NDArray[np.float64]

from .samples import ORDERS as ORDERS  # the engines whose processor order a law may follow (module docstring)

NEG = -math.inf


class AmbiguousLawError(ValueError):
    """The processed law is not determined by the settings: tied ids straddle a top-p boundary (or a
    llama.cpp top-k boundary), and which of them an engine keeps depends on its sort."""


def softmax(x: F64) -> F64:
    """``softmax`` of float64 logits ``x [V]`` (``-inf`` entries get probability exactly 0)."""
    m = float(np.max(x))
    if not math.isfinite(m):
        raise ValueError("every logit is -inf: the processing removed every id")
    e = np.exp(x - m)
    out: F64 = e / e.sum()
    return out


def keep_allowed(x: F64, allowed: Collection[int] | None) -> F64:
    """``x`` with every id outside ``allowed`` at ``-inf`` (None: unchanged)."""
    if allowed is None:
        return x
    out = np.full_like(x, NEG)
    idx = np.asarray(sorted(allowed), dtype=np.int64)
    out[idx] = x[idx]
    return out


def ban_bad_words(x: F64, bad_words: Sequence[Sequence[int]], history: Sequence[int]) -> F64:
    """``x`` with the last id of each bad word at ``-inf`` where its other ids end ``history`` (a
    one-id word: always); ``history`` is the output (vLLM) or prompt and output (transformers)."""
    if not bad_words:
        return x
    out = x.copy()
    h = list(history)
    for word in bad_words:
        head = list(word[:-1])
        if len(head) <= len(h) and (not head or h[len(h) - len(head):] == head):
            out[word[-1]] = NEG
    return out


def add_logit_bias(x: F64, bias: Mapping[int, float]) -> F64:
    """``x`` plus ``bias[id]`` at each biased id (``-inf`` stays ``-inf``)."""
    if not bias:
        return x
    out = x.copy()
    for i, b in bias.items():
        out[int(i)] += float(b)
    return out


def penalize(x: F64, repeated: Collection[int], counts: Mapping[int, int], repetition: float, presence: float,
             frequency: float) -> F64:
    """``x`` with the repetition penalty at the ``repeated`` ids (a positive logit divided by it, another
    multiplied: vLLM's, llama.cpp's and transformers' common rule), then ``frequency * count + presence``
    subtracted at each id of ``counts`` (ids with a count > 0)."""
    out = x.copy()
    if repetition != 1.0 and repeated:
        idx = np.asarray(sorted(repeated), dtype=np.int64)
        v = out[idx]
        out[idx] = np.where(v > 0, v / repetition, v * repetition)
    if presence or frequency:
        for i, c in counts.items():
            if c > 0:
                out[int(i)] -= frequency * c + presence
    return out


def keep_top_k(x: F64, k: int | None, ties: str = "keep") -> F64:
    """``x`` keeping the ids whose logit is at least the k-th largest; ``ties="keep"`` keeps every id tied
    with the k-th (vLLM, transformers), ``"exact"`` keeps exactly k ids (llama.cpp), refusing a tie across
    the boundary among ids of positive probability (:class:`AmbiguousLawError`). None, or ``k`` at least the number of finite logits:
    unchanged."""
    finite = int(np.isfinite(x).sum())
    if k is None or k >= finite:
        return x
    kth = float(np.sort(x)[::-1][k - 1])
    if ties == "exact" and int((x > kth).sum()) + int((x == kth).sum()) > k and softmax(x)[x == kth][0] > 0:
        raise AmbiguousLawError(f"top-k {k}: ids tied at the {k}-th logit straddle the boundary; an engine that keeps "
                                "exactly k ids decides among them by its sort")
    return np.where(x >= kth, x, NEG)


def keep_top_p(x: F64, p: float | None) -> F64:
    """``x`` keeping, in order of decreasing probability, the ids whose preceding mass is below ``p``
    (always the largest); :class:`AmbiguousLawError` where tied probabilities straddle that boundary.
    None or ``p >= 1``: unchanged."""
    if p is None or p >= 1.0:
        return x
    probs = softmax(x)
    order = np.argsort(-probs, kind="stable")
    sp = probs[order]
    before = np.concatenate(([0.0], np.cumsum(sp)[:-1]))
    keep_sorted = before < p
    keep_sorted[0] = True
    m = int(keep_sorted.sum())
    if m < len(sp) and sp[m - 1] == sp[m] and sp[m] > 0:
        raise AmbiguousLawError(f"top-p {p}: ids of equal probability {sp[m]:.6g} straddle the boundary; which of "
                                "them an engine keeps depends on its sort")
    out = np.full_like(x, NEG)
    kept = order[:m]
    out[kept] = x[kept]
    return out


def keep_min_p(x: F64, min_p: float | None) -> F64:
    """``x`` keeping the ids whose probability is at least ``min_p`` times the largest (vLLM's
    ``probs < min_p * max`` removed; llama.cpp's logit form ``logit >= max + log(min_p)`` is the same
    set in exact arithmetic). None or 0: unchanged."""
    if not min_p:
        return x
    probs = softmax(x)
    return np.where(probs >= min_p * float(probs.max()), x, NEG)


def greedy_law(x: F64) -> F64:
    """The point law at the argmax of ``x`` (the lowest id among tied maxima)."""
    out = np.zeros_like(x)
    out[int(np.argmax(x))] = 1.0
    return out


def _get(s: Any, name: str, default: Any) -> Any:
    v = getattr(s, name, default)
    return default if v is None and default is not None else v


def _bias(s: Any) -> dict[int, float]:
    return {int(k): float(v) for k, v in dict(_get(s, "logit_bias", {}) or {}).items()}


def _counts(ids: Iterable[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for i in ids:
        out[int(i)] = out.get(int(i), 0) + 1
    return out


def _end_mask(x: F64, n_out: int, min_tokens: int, end_ids: Collection[int]) -> F64:
    if n_out >= min_tokens or not end_ids:
        return x
    out = x.copy()
    out[np.asarray(sorted(end_ids), dtype=np.int64)] = NEG
    return out


def vllm_logits(logits: Sequence[float] | F64, s: Any, prompt_ids: Sequence[int], output_ids: Sequence[int],
                end_ids: Collection[int]) -> tuple[F64, bool]:
    """vLLM V1's processed logits (module docstring, ``"vllm"``) of ``logits [V]`` for settings ``s``
    (a :class:`hsd_core.samples.Sampling`) after ``prompt_ids`` and ``output_ids``; ``end_ids``: the stop
    ids min_tokens holds back. Returns ``(logits, greedy)``: greedy when ``s.do_sample`` is false (the
    logits then stop before temperature)."""
    x = np.array(logits, dtype=np.float64)
    x = keep_allowed(x, _get(s, "allowed_token_ids", None))
    x = ban_bad_words(x, _get(s, "bad_words_ids", ()), output_ids)
    x = _end_mask(x, len(output_ids), int(_get(s, "min_tokens", 0)), end_ids)
    x = add_logit_bias(x, _bias(s))
    x = penalize(x, set(prompt_ids) | set(output_ids), _counts(output_ids), float(_get(s, "repetition_penalty", 1.0)),
                 float(_get(s, "presence_penalty", 0.0)), float(_get(s, "frequency_penalty", 0.0)))
    if not s.do_sample:
        return x, True
    x = x / float(s.temperature)
    x = keep_min_p(x, _get(s, "min_p", None))
    x = keep_top_k(x, s.top_k, "keep")
    return keep_top_p(x, s.top_p), False


def llama_cpp_logits(logits: Sequence[float] | F64, s: Any, prompt_ids: Sequence[int], output_ids: Sequence[int],
                     end_ids: Collection[int]) -> tuple[F64, bool]:
    """llama.cpp's sampler chain (module docstring, ``"llama.cpp"``): logit bias, penalties over the last
    ``s.penalty_last_n`` ids of prompt and output (None: all of them), top-k (exactly k), top-p, min-p,
    temperature. Refuses (``ValueError``) settings llama.cpp's server does not have: allowed token ids,
    bad words as ids, min_tokens. Returns ``(logits, greedy)``."""
    for name, off in (("allowed_token_ids", None), ("bad_words_ids", ()), ("min_tokens", 0)):
        if _get(s, name, off) not in (off, None, (), []):
            raise ValueError(f"{name} is not a llama.cpp sampler setting: no llama.cpp-order law for it")
    x = np.array(logits, dtype=np.float64)
    x = add_logit_bias(x, _bias(s))
    hist = list(prompt_ids) + list(output_ids)
    n = _get(s, "penalty_last_n", None)
    window = hist if n is None or n < 0 else (hist[len(hist) - n:] if n else [])
    c = _counts(window)
    x = penalize(x, set(c), c, float(_get(s, "repetition_penalty", 1.0)), float(_get(s, "presence_penalty", 0.0)),
                 float(_get(s, "frequency_penalty", 0.0)))
    if not s.do_sample:
        return x, True
    x = keep_top_k(x, s.top_k, "exact")
    x = keep_top_p(x, s.top_p)
    x = keep_min_p(x, _get(s, "min_p", None))
    return x / float(s.temperature), False


def transformers_logits(logits: Sequence[float] | F64, s: Any, prompt_ids: Sequence[int], output_ids: Sequence[int],
                        end_ids: Collection[int]) -> tuple[F64, bool]:
    """transformers' ``generate`` processors (module docstring, ``"transformers"``): sequence bias,
    repetition penalty and bad words over prompt and output, ``min_new_tokens``, then temperature, top-k
    (ties kept), top-p, min-p. Refuses (``ValueError``) presence / frequency penalties and allowed token
    ids, which transformers does not have. Returns ``(logits, greedy)``."""
    for name, off in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("allowed_token_ids", None)):
        if _get(s, name, off) not in (off, None):
            raise ValueError(f"{name} is not a transformers generate setting: no transformers-order law for it")
    x = np.array(logits, dtype=np.float64)
    hist = list(prompt_ids) + list(output_ids)
    x = add_logit_bias(x, _bias(s))
    x = penalize(x, set(hist), {}, float(_get(s, "repetition_penalty", 1.0)), 0.0, 0.0)
    x = ban_bad_words(x, _get(s, "bad_words_ids", ()), hist)
    x = _end_mask(x, len(output_ids), int(_get(s, "min_tokens", 0)), end_ids)
    if not s.do_sample:
        return x, True
    x = x / float(s.temperature)
    x = keep_top_k(x, s.top_k, "keep")
    x = keep_top_p(x, s.top_p)
    return keep_min_p(x, _get(s, "min_p", None)), False


_ORDER_FNS = {"vllm": vllm_logits, "llama.cpp": llama_cpp_logits, "transformers": transformers_logits}


def processed_logits(logits: Sequence[float] | F64, s: Any, prompt_ids: Sequence[int], output_ids: Sequence[int],
                     end_ids: Collection[int]) -> tuple[F64, bool]:
    """The processed logits in the order ``s.order`` names (default ``"vllm"``): ``(logits, greedy)``."""
    order = _get(s, "order", None) or "vllm"
    if order not in _ORDER_FNS:
        raise ValueError(f"unknown processor order {order!r}; one of {', '.join(ORDERS)}")
    return _ORDER_FNS[order](logits, s, prompt_ids, output_ids, end_ids)


def next_law(logits: Sequence[float] | F64, s: Any, prompt_ids: Sequence[int], output_ids: Sequence[int],
             end_ids: Collection[int]) -> F64:
    """The law ``[V]`` (float64, summing to 1) an engine following ``s.order`` samples the next id from,
    given the raw ``logits [V]`` of the target after ``prompt_ids`` + ``output_ids``: the softmax of
    :func:`processed_logits`, or its argmax's point law when greedy."""
    x, greedy = processed_logits(logits, s, prompt_ids, output_ids, end_ids)
    return greedy_law(x) if greedy else softmax(x)


def stop_text_prefix(order: str, prompt_text: bytes) -> bytes:
    """The text before the output in which a stop string may begin: the prompt's for transformers
    (``StopStringCriteria`` reads the whole sequence), none for vLLM and llama.cpp (output text only)."""
    return prompt_text if order == "transformers" else b""


class StopStrings:
    """Where a row's new tokens complete a stop string: the first new token whose text completes an
    occurrence of one (an occurrence that ends inside that token's text; overhangs at either end count).
    ``tail[i]``: the last bytes of row ``i``'s text so far, as many as an occurrence can reach back
    (seeded with the text before the output: :func:`stop_text_prefix`)."""

    def __init__(self, stops: Sequence[bytes], prompt_texts: Sequence[bytes]) -> None:
        self.stops = list(stops)
        self.keep = max((len(s) for s in self.stops), default=1) - 1
        self.tail = [self._trim(t) for t in prompt_texts]

    def _trim(self, b: bytes) -> bytes:
        return b[len(b) - self.keep:] if self.keep and len(b) > self.keep else (b if self.keep else b"")

    def first_stop(self, i: int, pieces: Sequence[bytes]) -> int | None:
        """The index of the first of row ``i``'s new tokens (their texts ``pieces``) that completes
        a stop string, or None; the row's tail moves past the tokens read (up to that one)."""
        if not self.stops:
            return None
        tail = self.tail[i]
        for j, piece in enumerate(pieces):
            before = len(tail)
            text = tail + piece
            for s in self.stops:
                start = max(0, before - len(s) + 1)  # an occurrence found from here ends inside this piece
                if piece and text.find(s, start) >= 0:
                    self.tail[i] = self._trim(text)
                    return j
            tail = self._trim(text)
        self.tail[i] = tail
        return None
