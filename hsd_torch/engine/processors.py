"""What ``generate`` adds to the target's law and to a row's end beyond temperature, top-k and
top-p: logits processors, a minimum number of new tokens, stop strings (transformers' names).

**Logits processors** (``logits_processor=``, a ``transformers.LogitsProcessorList`` or a list of
callables ``(input_ids [1, L] int64, scores [1, V] float32) -> scores [1, V]``): applied, in
order, to the target's raw logits at **every position a round verifies**, each with that
position's own context as ``input_ids`` (the row's prompt ids, its emitted ids, then the proposals
before that position), before temperature, top-k and top-p, as transformers applies a caller's
processors before its sampling warpers. The processed law at every position is then exactly the
law transformers' ``generate`` samples from for that context (one row, no padding), so every
method stays lossless for it. A processor must be a function of ``(input_ids, scores)`` alone: hsd
calls it on proposals that may be rejected, for positions out of order and several times per
context, so a processor that keeps state between calls (transformers' classifier-free guidance
with its own model cache, Whisper's timestamp rules, SynthID watermarking's context history, Bark's
and Dia's audio-codebook processors) would see a history that never happened; those are refused
(:data:`STATEFUL`), and the rule is stated for the others. The drafter's laws are not processed
(its proposals are free).

**Minimum new tokens** (``min_new_tokens=n``, or the generation config's): the end ids (the
tokenizer's EOS and the config's ``eos_token_id``) get no mass at the first ``n`` new positions
of every row (transformers' ``MinNewTokensLengthLogitsProcessor`` per row), before the caller's
processors, as transformers orders them.

**Stop strings** (``stop_strings=``, a str or a list of str, or the generation config's): a row
ends after the first new token whose text completes one of them, i.e. at the first token where an
occurrence of the string in (prompt text + new text) ends inside that token's text, as
transformers' ``StopStringCriteria`` decides (overhangs at either end count). Texts are the
tokens' bytes (ids without text, special tokens, add none: transformers reads special tokens'
strings, which differs only where a stop string spans a special token). Stopping is a function of
the emitted prefix, like an end id, so the output's law is the target's law of that stopped
sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from hsd_core.processing import StopStrings as StopStrings  # the one implementation (hsd_core: no torch)

from ._args import as_int

__all__ = ["STATEFUL", "StopStrings", "check_logits_processor", "check_stop_strings", "process_target_logits"]

STATEFUL = frozenset({
    "UnbatchedClassifierFreeGuidanceLogitsProcessor", "WhisperTimeStampLogitsProcessor",
    "SynthIDTextWatermarkLogitsProcessor", "AlternatingCodebooksLogitsProcessor",
    "BarkEosPrioritizerLogitsProcessor", "DiaClassifierFreeGuidanceLogitsProcessor",
    "DiaEOSChannelFilterLogitsProcessor", "DiaEOSDelayPatternLogitsProcessor",
    "ClassifierFreeGuidanceLogitsProcessor",
})
"""transformers' processors ``generate`` refuses: they keep state between calls or need a batch
layout (guidance's doubled batch, audio codebooks) that per-position verification does not give."""

Processor = Callable[[Tensor, Tensor], Tensor]


def check_logits_processor(processors: Any) -> list[Processor]:
    """``processors`` (None, a ``LogitsProcessorList`` or a list of callables) as a list;
    ``TypeError`` for a non-callable entry, ``ValueError`` naming a processor of :data:`STATEFUL`."""
    if processors is None:
        return []
    if callable(processors) and not isinstance(processors, (list, tuple)):
        processors = [processors]
    if not isinstance(processors, (list, tuple)):
        raise TypeError(f"logits_processor must be None, a LogitsProcessorList or a list of callables, got "
                        f"{type(processors).__name__}")
    out: list[Processor] = []
    for k, p in enumerate(processors):
        if not callable(p):
            raise TypeError(f"logits_processor[{k}] is not callable ({type(p).__name__})")
        name = type(p).__name__
        if name in STATEFUL:
            raise ValueError(f"logits_processor[{k}] is a {name}, which keeps state between calls or needs a batch "
                             "layout of its own; generate calls processors on proposals that may be rejected and "
                             "per position, so it would act on a history that never happened (docs/generate.md)")
        out.append(p)
    return out


def check_stop_strings(stop_strings: Any) -> list[bytes]:
    """None, a str or a list of non-empty str as UTF-8 byte strings (``TypeError`` /
    ``ValueError`` otherwise)."""
    if stop_strings is None:
        return []
    if isinstance(stop_strings, str):
        stop_strings = [stop_strings]
    if not isinstance(stop_strings, (list, tuple)) or not all(isinstance(s, str) for s in stop_strings):
        raise TypeError("stop_strings must be None, a str or a list of str")
    out = []
    for s in stop_strings:
        if not s:
            raise ValueError("stop_strings holds an empty string, which every text would complete")
        try:
            out.append(s.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError(f"stop string {s!r} has a lone surrogate: no text can contain it") from None
    return out


def check_min_new_tokens(n: Any) -> int:
    """None (0) or an int >= 0."""
    return 0 if n is None else as_int("min_new_tokens", n, 0)


def process_target_logits(logits: Tensor, contexts: Sequence[Sequence[int] | None], positions: Sequence[int],
                          new_before: Sequence[int], processors: Sequence[Processor], min_new_tokens: int,
                          end_ids: Sequence[int]) -> Tensor:
    """``logits [B, P, V]`` (the target's, at each row's verified positions) processed: row ``i``
    (``contexts[i]`` its context before position 0, None for a row not verified this round) at
    positions ``0 .. positions[i] - 1`` (position ``j``'s context: ``contexts[i]`` then the
    proposals, given as ``contexts[i]`` already extended, so the ids before position ``j`` are
    ``contexts[i][:len(contexts[i]) - positions[i] + 1 + j]``) gets the end ids masked where
    ``new_before[i] + j < min_new_tokens``, then each processor in turn (transformers' order: its
    built-in minimum-length processor before a caller's). Returns float32 logits (float64
    for a float64 input): transformers' processors see float32 scores."""
    if not processors and not min_new_tokens:
        return logits
    out = logits if logits.dtype == torch.float64 else logits.float()
    out = out.clone()
    ends = torch.tensor(sorted(set(end_ids)), device=out.device, dtype=torch.long)
    for i, ctx in enumerate(contexts):
        if ctx is None:
            continue
        base = len(ctx) - positions[i] + 1  # ids before position 0
        for j in range(positions[i]):
            if new_before[i] + j < min_new_tokens:
                out[i, j, ends] = float("-inf")
            if processors:
                ids = torch.tensor([list(ctx[:base + j])], dtype=torch.long, device=out.device)
                scores = out[i, j].unsqueeze(0)
                for p in processors:
                    scores = p(ids, scores)
                    if not isinstance(scores, Tensor) or scores.shape != (1, out.shape[-1]):
                        raise ValueError(f"a logits processor ({type(p).__name__}) returned "
                                         f"{getattr(scores, 'shape', type(scores).__name__)}, not scores of shape "
                                         f"(1, {out.shape[-1]})")
                out[i, j] = scores[0].to(out.dtype)
    return out
