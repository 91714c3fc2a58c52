"""The conformance kit's exact references (NumPy only: the laws an engine must sample).

The kit's design, its checkpoints as data (:class:`KitModel`, :func:`kit_model`: ``target``,
``drafter``, ``drafter_sp`` and the positional ``target_pos``), their weights and exact logits are
:mod:`hsd_core.conformance_design` (its module docstring is the construction); this module re-exports
its names, so ``hsd_core.conformance`` is the one import for both.

**References** (float64): :func:`next_law` (after any processing of :mod:`hsd_core.processing`, in a
named engine's order), :func:`sequence_law` (the law of whole short draws with their finish reasons,
stop strings included), :func:`length_law` and :func:`position_laws` (where EOS comes, each position
alone), and :func:`expected_acceptance` (hsd_core's exact engine over the kit's laws as explicit
models: :func:`toy_models`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .conformance_design import (
    BOS, CLOCK, CONST, COPY_BONUS, DEAD, DRAFTER_ROWS, EMBED_SCALE, EOS, EOS_RISE, HEAD_DIM, HEADS, HIDDEN, INTERMEDIATE,
    KV_HEADS, LAYERS, PAD, POS_HEAD, POS_PAIRS, POS_ROWS, POS_SCORE, RMS_EPS, ROLES, ROPE_THETA, SP_ROWS, SPECIALS,
    TARGET_ROWS, TOP_P, UNK, KitModel, byte_alphabet, forward64, kit_model,
)
from .processing import StopStrings, next_law as processed_law, stop_text_prefix
from .samples import Sampling

__all__ = ["BOS", "CLOCK", "CONST", "COPY_BONUS", "DEAD", "DRAFTER_ROWS", "EMBED_SCALE", "EOS", "EOS_RISE", "HEAD_DIM",
           "HEADS", "HIDDEN", "INTERMEDIATE", "KV_HEADS", "KitModel", "LAYERS", "PAD", "POS_HEAD", "POS_PAIRS", "POS_ROWS",
           "POS_SCORE", "RMS_EPS", "ROLES", "ROPE_THETA", "SPECIALS", "SP_ROWS", "TARGET_ROWS", "TOP_P", "UNK",
           "byte_alphabet", "expected_acceptance", "forward64", "kit_model", "length_law", "next_law", "position_laws",
           "sequence_law", "toy_ids", "toy_models"]

F64 = npt.NDArray[np.float64]


def _plain(max_new_tokens: int) -> Sampling:
    return Sampling(True, 1.0, None, None, max_new_tokens)


def next_law(model: KitModel, prompt_ids: Sequence[int], output_ids: Sequence[int] = (),
             sampling: Sampling | None = None, end_ids: Collection[int] = (EOS,)) -> F64:
    """``[V]`` float64: the law of the next id after ``prompt_ids`` + ``output_ids`` under ``sampling``
    (None: temperature 1, nothing else) in its named order (:func:`hsd_core.processing.next_law`)."""
    s = sampling or _plain(1)
    return processed_law(model.logits(list(prompt_ids) + list(output_ids)), s, prompt_ids, output_ids, end_ids)


def sequence_law(model: KitModel, prompt_ids: Sequence[int], sampling: Sampling,
                 end_ids: Collection[int] = (EOS,)) -> dict[tuple[int, ...], tuple[float, str]]:
    """The law of a whole draw: ``{ids: (probability, finish_reason)}`` over every sequence of new ids
    the engine may return under ``sampling`` (``max_new_tokens`` of it): ``"stop"`` where the last id
    is an end id or completes a stop string of ``sampling.stop`` (searched in the text the order names:
    :func:`hsd_core.processing.stop_text_prefix`), ``"length"`` at the budget. Enumerated over ids of
    positive probability; float64."""
    order = sampling.order or "vllm"
    stops = [s.encode() for s in sampling.stop]
    prefix = stop_text_prefix(order, model.text(prompt_ids))
    out: dict[tuple[int, ...], tuple[float, str]] = {}
    ends = set(end_ids)

    def grow(seq: tuple[int, ...], prob: float) -> None:
        law = next_law(model, prompt_ids, seq, sampling, end_ids)
        for t in np.flatnonzero(law > 0):
            nxt, p = seq + (int(t),), prob * float(law[t])
            stopped = int(t) in ends
            if not stopped and stops:
                st = StopStrings(stops, [prefix])
                stopped = st.first_stop(0, [model.texts[i] for i in nxt]) == len(nxt) - 1
            if stopped:
                out[nxt] = (p, "stop")
            elif len(nxt) >= sampling.max_new_tokens:
                out[nxt] = (p, "length")
            else:
                grow(nxt, p)

    grow((), 1.0)
    return out


def length_law(law: Mapping[tuple[int, ...], tuple[float, str]]) -> dict[int, float]:
    """The law of the number of new ids (where the draw ends) from a :func:`sequence_law`."""
    out: dict[int, float] = {}
    for seq, (p, _) in law.items():
        out[len(seq)] = out.get(len(seq), 0.0) + p
    return out


def position_laws(law: Mapping[tuple[int, ...], tuple[float, str]]) -> list[dict[int, float]]:
    """For each position ``j``, the law of the id there (``-1``: the draw ended before it) from a
    :func:`sequence_law`: each position alone, where engines keep state per position."""
    n = max((len(s) for s in law), default=0)
    out: list[dict[int, float]] = [{} for _ in range(n)]
    for seq, (p, _) in law.items():
        for j in range(n):
            t = seq[j] if j < len(seq) else -1
            out[j][t] = out[j].get(t, 0.0) + p
    return out


def toy_ids(km: KitModel) -> list[int]:
    """The kit ids a toy vocabulary of ``km`` holds, increasing: every id whose text is valid UTF-8 on
    its own (not the lone bytes 0x80-0xFF, which no row reaches), one id per text -- a piece rather than
    a byte-fallback ``<0xNN>`` of the same byte, as the kit's tokenizer encodes that text. The whole
    vocabulary, not only the live ids: which ids the two vocabularies share decides TLI's intersection
    (the target's BPE holds the merge steps `` c`` and `` ca`` that the SentencePiece drafter proposes).
    Every live id is among them (``AssertionError`` otherwise)."""
    chosen: dict[str, tuple[int, bool]] = {}
    for i in range(len(SPECIALS), km.vocab_size):
        try:
            text = km.texts[i].decode("utf-8")
        except UnicodeDecodeError:
            continue
        if not text:
            continue
        fallback = km.kind == "sentencepiece" and km.tokens[i].startswith("<0x")
        if text not in chosen or (chosen[text][1] and not fallback):
            chosen[text] = (i, fallback)
    ids = sorted(i for i, _ in chosen.values())
    missing = set(km.live_ids) - set(ids) - {BOS, EOS}
    if missing:
        raise AssertionError(f"{km.role}: live ids {sorted(missing)} have no place in the toy vocabulary")
    return ids


def toy_models(prompt_ids: Sequence[int], sampling: Sampling | None = None,
               drafter_sampling: Sampling | None = None, target: str = "target") -> tuple[Any, Any, Any, str]:
    """The kit as ``hsd_core`` explicit models for one prompt: ``(target, drafter, drafter_sp,
    prompt_text)``: vocabularies of every id's text (:func:`toy_ids`; plus any single character their
    words need, which gets probability 0), longest-match tokenizers, and float64 laws from :func:`next_law` (the
    target processed by ``sampling``, the drafters by ``drafter_sampling``; None: their raw laws), the
    kit's BOS implied before every context. ``prompt_text`` (the prompt without BOS) encodes back to
    ``prompt_ids`` (``ValueError`` otherwise). ``target``: the kit role of the target (``"target"`` or
    ``"target_pos"``)."""
    from .models import FunctionModel
    from .tokenizers import LongestMatchTokenizer
    from .vocab import Vocabulary

    if not prompt_ids or prompt_ids[0] != BOS:
        raise ValueError("a kit prompt starts with BOS (id 1)")
    built = []
    if target not in ("target", "target_pos"):
        raise ValueError(f"target must be 'target' or 'target_pos', got {target!r}")
    for role, s in ((target, sampling), ("drafter", drafter_sampling), ("drafter_sp", drafter_sampling)):
        km = kit_model(role)
        live = toy_ids(km)
        strings = [km.texts[i].decode() for i in live]
        chars = sorted({ch for t in strings for ch in t} - set(strings))
        vocab = Vocabulary(strings + chars)
        tok = LongestMatchTokenizer(vocab)
        to_kit = {j: i for j, i in enumerate(live)}
        built.append((km, s, vocab, tok, to_kit, live))
    km0 = built[0][0]
    text = km0.text(prompt_ids[1:]).decode()
    models = []
    for km, s, vocab, tok, to_kit, live in built:
        enc = tok.encode(text)
        if km.role == target and [to_kit.get(j) for j in enc] != list(prompt_ids[1:]):
            raise ValueError(f"the prompt's text {text!r} does not encode back to its ids under longest match")
        cols = live + [EOS]

        def law(ctx: tuple[int, ...], km: KitModel = km, s: Sampling | None = s, to_kit: dict[int, int] = to_kit,
                cols: list[int] = cols, n0: int = len(enc)) -> list[float]:
            if any(j not in to_kit for j in ctx):
                raise ValueError(f"{km.role}: context {ctx} holds a character outside the kit's live ids")
            ids = [BOS] + [to_kit[j] for j in ctx]
            full = next_law(km, ids[:1 + n0], ids[1 + n0:], s)
            outside = np.ones(len(full), bool)
            outside[cols] = False
            rest = float(full[outside].sum())
            if rest != 0.0:
                raise ValueError(f"{km.role}: {rest} of the law's mass is on ids outside the live set")
            # the toy order: live ids, the extra characters (probability 0), EOS last
            return [float(full[i]) for i in cols[:-1]] + [0.0] * (len(vocab) - len(cols)) + [float(full[EOS])]

        models.append(FunctionModel(vocab, tok, law))
    return models[0], models[1], models[2], text


def expected_acceptance(prompt_ids: Sequence[int], method: str = "sd", lookahead: int = 3, max_new_tokens: int = 3,
                        sampling: Sampling | None = None, drafter_sampling: Sampling | None = None,
                        target: str = "target") -> dict[str, float]:
    """The exact expected acceptance of a speculative method over the kit, from ``hsd_core``'s exact
    engine (:func:`hsd_core.exact.analyze` over :func:`toy_models`): ``method`` ``"sd"`` (the
    same-vocabulary drafter) or ``"tli"`` (the SentencePiece-style drafter), ``lookahead`` drafts a
    round, ``max_new_tokens`` new ids, ``target`` the kit role of the target. Returns ``first_acceptance`` (the probability that the first
    round accepts its first proposal), ``tokens_per_call`` (expected ids per target forward) and
    ``expected_tokens``; also ``closed_form`` (hsd_core's one-position formula, ``sum min(p, q)``)."""
    from .acceptance import closed_form_acceptance
    from .exact import analyze
    from .methods.base import State
    from .methods.sd import SD
    from .methods.tli import TLI

    tm, drafter, drafter_sp, text = toy_models(prompt_ids, sampling, drafter_sampling, target)
    m: Any = SD(lookahead) if method == "sd" else TLI(lookahead) if method == "tli" else None
    if m is None:
        raise ValueError(f"method must be 'sd' or 'tli', got {method!r}")
    d = drafter if method == "sd" else drafter_sp
    a = analyze(m, tm, d, text, max_new_tokens)
    cf = closed_form_acceptance(m, tm, d, State(text, (), max_new_tokens))
    return {"first_acceptance": float(a.first_acceptance), "tokens_per_call": float(a.tokens_per_call),
            "expected_tokens": float(a.expected_tokens), "closed_form": float(cf) if cf is not None else math.nan}
