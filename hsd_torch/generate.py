"""Speculative generation over Hugging Face causal LMs: ``hsd_torch.generate``.

Methods (names as in :mod:`hsd_core.methods`; each round is one target forward pass), one file
each under :mod:`hsd_torch.methods`, each opening with its ``hsd_core`` twin's glossary and steps:

- ``"ar"`` (:mod:`~hsd_torch.methods.ar`): one token from the target's processed law per round.
- ``"sd"`` (:mod:`~hsd_torch.methods.sd`): same-tokenizer speculative decoding, ``min(lookahead,
  budget)`` drafts from the drafter's processed law, rejection verification.
- ``"tli"`` (:mod:`~hsd_torch.methods.tli`): token-level intersection: drafts from the drafter's
  processed law restricted to the shared strings, each verified against the pushforward onto
  target ids of exactly the law it was drawn from; the drafter re-synced token by token.
- ``"slem"`` (:mod:`~hsd_torch.methods.slem`): ``lookahead`` drafter tokens, their text
  re-tokenized for the target after its context (look-behind ``lookbehind``, :func:`retokenize`),
  exact-match verification.
- ``"slrs"`` (:mod:`~hsd_torch.methods.slrs`): at ``lookahead=1`` (default ``proposal_map``) the
  paper's one-token SLRS, verified against psi(t), the drafter's mass on the ids whose text's first
  target id is t; with ``proposal_map="longest_prefix"`` and ``min_path_prob=tau`` (any lookahead)
  the bounded SLRS of issue 11, psi computed level by level with one batched drafter pass per
  level; ``max_tokens=m`` (None: the budget) proposes up to m target ids per round, position ``j``
  verified against psi conditioned on the first ``j``. Deeper lookaheads without them are refused
  (``NotImplementedError``: psi would enumerate every drafter path).

The law every method is lossless for is the target's **processed** law (:func:`process_logits`:
ids without text other than EOS removed, then temperature, top-k, top-p); the drafter's laws are
processed the same way. The machinery the methods share, each in a file named for what it is:

- :mod:`hsd_torch.laws`: processing and the text spaces every law lives on (ids with text in
  ``hsd_core``'s order, EOS last, so no draw needs a permutation and no column is masked);
- :mod:`hsd_torch.runner`: each model's batched KV cache, masks, crops and the drafter's window;
- :mod:`hsd_torch.rounds`: the round loop (draft, verify, advance, settle caches), contexts,
  per-row randomness and statistics;
- :mod:`hsd_torch.drafting`: drafting token by token from a drafter law;
- :mod:`hsd_torch.verification`: the target pass and the kernels' decisions (exact match,
  rejection); :mod:`hsd_torch.kernels` and :mod:`hsd_torch.vocab` as before.

Where the work happens. The tensor work (softmax, cumulative sums, draws, gathers, pushforwards,
residuals) runs on the models' device; the small decisions (which draft passes, where a row stops,
what it emits) are made on the host from a few values read back (the same code the public kernels
run). Validity is read off those values too: each draft's law is checked by the mass its draw
reads (SD and SLRS raise ``ValueError`` on a NaN or empty one; TLI and SLEM stop drafting that
row), and the target's by the total of the law each emitted token is drawn from (a NaN or infinite
logit makes its whole softmax row NaN, which shows there: ``ValueError``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .laws import process_logits
from .methods import METHODS, make
from .methods.slem import retokenize
from .rounds import GenerateOutput, Generation, RowStats
from .runner import model_device

__all__ = ["METHODS", "GenerateOutput", "RowStats", "generate", "process_logits", "retokenize"]


@torch.inference_mode()
def generate(
    target: Any,
    drafter: Any = None,
    prompts: str | Sequence[str] = (),
    *,
    target_tokenizer: Any,
    drafter_tokenizer: Any = None,
    method: str = "tli",
    lookahead: int = 4,
    max_new_tokens: int = 64,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | torch.Generator | None = 0,
    drafter_temperature: float | None = None,
    record_uniforms: bool = False,
    lookbehind: int = 4,
    progress: Callable[[int], None] | None = None,
    min_path_prob: float | None = None,
    proposal_map: str | None = None,
    max_tokens: int | None = 1,
) -> GenerateOutput:
    """Generate continuations of ``prompts`` from ``target``, lossless for its processed law.

    ``target``, ``drafter``: Hugging Face causal LMs in eval mode on one device (``drafter`` may be
    None for ``method="ar"``); ``prompts``: a str or a list of str, encoded by each tokenizer with
    its own special prefix (a BOS; an empty prompt starts from the BOS) and no other special
    token. ``method`` in {"ar", "sd", "tli", "slem", "slrs"} (module docstring; "slrs" beyond
    ``lookahead=1`` needs ``proposal_map="longest_prefix"`` and ``min_path_prob``, the bounded
    procedure's probability stop; greedy needs no stop; ``max_tokens``: bounded SLRS's proposed target ids per
    round, verified against psi conditioned on the ones before, None: up to the budget); ``lookahead``: drafts
    per round; ``lookbehind``: SLEM's re-tokenization
    look-behind (SLRS uses 0); ``do_sample=False``: greedy (argmax, ties to the lowest id), no randomness;
    ``temperature``, ``top_k``, ``top_p``: the processing of both models' laws
    (:func:`process_logits`; ``drafter_temperature``, if given, replaces ``temperature`` for the
    drafter: its processing is free, the target's defines the law); ``seed``: an int, a ``torch.Generator`` (one int is drawn from it)
    or None (fresh entropy). ``record_uniforms=True`` fills ``GenerateOutput.uniforms``.
    ``progress``, if given, is called after every round with the number of rows that finished in
    it (for a progress bar).

    Returns :class:`GenerateOutput`. The models are never modified (no attribute, weight, config
    or generation config is written); everything runs under ``torch.inference_mode``.
    """
    t_start = time.perf_counter()
    m = make(method, lookahead=lookahead, greedy=not do_sample, lookbehind=lookbehind, min_path_prob=min_path_prob,
             proposal_map=proposal_map, max_tokens=max_tokens)
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    _check_arguments(target, drafter, prompts, drafter_tokenizer, m.name,
                     lookahead=lookahead, max_new_tokens=max_new_tokens, lookbehind=lookbehind, do_sample=do_sample,
                     temperature=temperature, top_k=top_k, top_p=top_p, drafter_temperature=drafter_temperature,
                     needs_drafter=m.needs_drafter)
    process = {"temperature": float(temperature), "top_k": top_k, "top_p": top_p}
    d_process = dict(process, temperature=float(temperature if drafter_temperature is None else drafter_temperature))
    run = Generation(m, target, drafter if m.needs_drafter else None, prompts, target_tokenizer, drafter_tokenizer,
                     lookahead=lookahead, max_new_tokens=max_new_tokens, greedy=not do_sample, process=process,
                     d_process=d_process, seed=seed, record_uniforms=record_uniforms)
    while not all(run.finished):
        run.round(progress)
    return run.output(time.perf_counter() - t_start)


def _check_arguments(target: Any, drafter: Any, prompts: list[Any], drafter_tokenizer: Any, method: str, *,
                     lookahead: Any, max_new_tokens: Any, lookbehind: Any, do_sample: Any, temperature: Any,
                     top_k: Any, top_p: Any, drafter_temperature: Any, needs_drafter: bool) -> None:
    """``generate``'s arguments beyond the method's options, checked before any work
    (``TypeError`` / ``ValueError`` naming the argument). ``drafter`` is None for a method without one."""
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise TypeError("prompts must be a str or a non-empty list of str")
    if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 1:
        raise ValueError(f"lookahead must be an int >= 1, got {lookahead!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if isinstance(lookbehind, bool) or not isinstance(lookbehind, int) or lookbehind < 0:
        raise ValueError(f"lookbehind must be an int >= 0, got {lookbehind!r}")
    if not isinstance(do_sample, bool):
        raise TypeError(f"do_sample must be True or False, got {do_sample!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be None or in (0, 1], got {top_p!r}")
    for role, model in (("target", target), ("drafter", drafter)):
        if model is not None and getattr(model, "training", False):
            raise ValueError(f"the {role} is in training mode (dropout would make its law random); "
                             "call .eval() on it first (generate never changes the models itself)")
    if needs_drafter and (drafter is None or drafter_tokenizer is None):
        raise ValueError(f"method {method!r} needs a drafter and a drafter_tokenizer")
    dev = model_device(target)
    if needs_drafter and model_device(drafter) != dev:
        raise ValueError(f"the target is on {dev} and the drafter on {model_device(drafter)}: put both models on "
                         "one device")
    if drafter_temperature is not None and not drafter_temperature > 0:
        raise ValueError(f"drafter_temperature must be > 0, got {drafter_temperature!r}")
