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
  the bounded SLRS of docs/slrs.md, psi computed level by level with one batched drafter pass per
  level; ``max_tokens=m`` (None: the budget) proposes up to m target ids per round, position ``j``
  verified against psi conditioned on the first ``j``. Deeper lookaheads without them are refused
  (``NotImplementedError``: psi would enumerate every drafter path).

The law every method is lossless for is the target's **processed** law: its logits over every id
(with ``mask_textless=True``, ids without text other than EOS and the end ids removed), then
temperature, top-k, top-p (:func:`process_logits`); the drafter's laws are processed the same way
over its ids with text. The machinery the methods share, each in a file named for what it is:

- :mod:`hsd_torch.engine.laws`: processing and the text spaces every law lives on (ids with text in
  ``hsd_core``'s order, EOS last, so no draw needs a permutation and no column is masked);
- :mod:`hsd_torch.engine.runner`: each model's batched KV cache, masks, crops and the drafter's window;
- :mod:`hsd_torch.engine.rounds`: the round loop (draft, verify, advance, settle caches), contexts,
  per-row randomness and statistics; :mod:`hsd_torch.engine.round_state`: what a method may read and
  call (``RoundView``) and what the machinery reads (``EngineState``);
- :mod:`hsd_torch.engine.validation`: every argument check at the boundary, one exception type per kind
  of mistake (each a ``ValueError``, ``TypeError`` or ``NotImplementedError`` as before);
- :mod:`hsd_torch.engine.drafting`: drafting token by token from a drafter law;
- :mod:`hsd_torch.engine.verification`: the target pass and the kernels' decisions (exact match,
  rejection); :mod:`hsd_torch.engine.kernels` and :mod:`hsd_torch.vocab` as before.

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

from hsd_core.methods.resync import Resync

from ..methods import METHODS, Method, make
from ..methods.slem import retokenize
from ..vocab.text import TokenText, check_tokenizer
from ._precision import as_dtype, check_model_dtype
from .genconfig import check_generation_config
from .laws import Processing, check_temperature, process_logits
from .processors import check_logits_processor, check_min_new_tokens, check_stop_strings
from .prompts import Prompts, _as_rows, check_prompts, from_ids, render
from .rounds import GenerateOutput, Generation, RowStats
from .runner import check_model, logit_width, refuse_meta
from .validation import ConflictingArguments, WrongType, as_int, check_seed

__all__ = ["METHODS", "GenerateOutput", "RowStats", "generate", "process_logits", "retokenize"]


@torch.inference_mode()
def generate(
    target: Any,
    drafter: Any = None,
    prompts: str | Sequence[Any] = (),
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
    lookbehind: int | None = None,
    resync: Resync | None = None,
    progress: Callable[[int], None] | None = None,
    min_path_prob: float | None = None,
    proposal_map: str | None = None,
    max_tokens: int | None = 1,
    mask_textless: bool = False,
    generation_config: Any = None,
    streamer: Any = None,
    input_ids: Any = None,
    attention_mask: Any = None,
    logits_processor: Any = None,
    min_new_tokens: int | None = None,
    stop_strings: str | Sequence[str] | None = None,
    dtype: Any = None,
    tree: Any = None, tree_draws: str | None = None, min_confidence: float | None = None,
) -> GenerateOutput:
    """Generate continuations of ``prompts`` from ``target``, lossless for its processed law.

    ``target``, ``drafter``: Hugging Face causal LMs in eval mode, on one device (``drafter`` None
    for ``method="ar"``), with their ``transformers`` tokenizers; ``prompts``: a str (a chat
    template's text too), a conversation or a list of those, or instead ``input_ids`` (and
    ``attention_mask``): the target's context is what transformers feeds (:mod:`hsd_torch.engine.prompts`).
    ``method`` in {"ar", "sd", "tli", "slem", "slrs"} (module docstring); options a method does not use are refused:
    ``lookahead`` (drafts per round, default 4; AR ignores it), ``lookbehind`` (SLEM's, None: 4), ``resync`` (SLEM's,
    SLRS's drafter re-sync, ``hsd_core.methods.Resync``), ``proposal_map="longest_prefix"``, ``min_path_prob`` (bounded
    SLRS, beyond lookahead 1; greedy needs none), ``max_tokens`` (target ids per round, 1; None: the budget); ``tree``
    (SD, TLI, SLEM; ``hsd_core.methods.tree.Static``/``Dynamic``, for lookahead), ``tree_draws``: docs/trees.md;
    ``min_confidence`` (SD, TLI, SLEM paths; None: off): ``hsd_core``'s dynamic draft length (docs/trees.md).
    ``do_sample=False``: greedy (argmax, ties to the lowest id); ``temperature`` (1e-3 to 1e3), ``top_k``, ``top_p``:
    both models' processing (:func:`process_logits`; ``drafter_temperature`` replaces the drafter's, which is free);
    ``seed``: an int, a ``torch.Generator`` or None. ``mask_textless=True`` removes ids without text (not EOS, end
    ids) from the target's law (as ``hsd_core``). ``generation_config`` (None: the target's): end ids,
    ``min_new_tokens`` and ``stop_strings`` are honoured, fields that change the law otherwise are refused
    (:mod:`hsd_torch.engine.genconfig`); ``logits_processor``, ``min_new_tokens``, ``stop_strings``: as transformers
    applies them, at every verified position (:mod:`hsd_torch.engine.processors`). ``streamer`` (one prompt): fed as
    transformers feeds it. ``record_uniforms=True`` fills ``GenerateOutput.uniforms``; ``progress(n)`` is called after
    every round with the rows that finished in it. Numpy integers are ints.

    ``dtype`` (None: whatever the models are in): ``torch.float32``, ``torch.bfloat16`` (also "fp32", "bf16",
    "float16", "float64", ...): the dtype both models must already be in (``ValueError`` otherwise: generate never
    converts them; load them so, e.g. ``real_models.load(name, dtype=torch.bfloat16)``). Laws are float32 softmaxes
    of the logits in any dtype. Greedy with a bfloat16 or float16 target re-decides near ties in float32 from the
    forward's final hidden state (:mod:`hsd_torch.engine._precision`; ``GenerateOutput.near_ties``, ``tie_flips``):
    docs/generate.md, "Reduced precision", states what is then promised.

    Every argument is checked before any work (``docs/generate.md``, "What generate refuses, and
    why"). Returns :class:`GenerateOutput` (lists; ``.tensors()``: transformers' padded tensors).
    The models are never modified; everything runs under ``torch.inference_mode``.
    """
    t_start = time.perf_counter()
    items, ids = _check_rows(prompts, input_ids, attention_mask)
    m, options = _check_options(method, len(items) if ids is None else len(ids), lookahead, max_new_tokens, do_sample,
                                mask_textless, progress, streamer, temperature, top_k, top_p, drafter_temperature,
                                lookbehind, min_path_prob, proposal_map, max_tokens, resync, seed, tree,
                                tree_draws, min_confidence)
    _check_models(target, drafter, target_tokenizer, drafter_tokenizer, m, dtype)
    options.update(_check_extras(target, generation_config, logits_processor, min_new_tokens, stop_strings))
    rendered = _render(items, ids, attention_mask, m, target, target_tokenizer, drafter_tokenizer)
    run = Generation(m, target, drafter if m.needs_drafter else None, rendered, target_tokenizer, drafter_tokenizer,
                     record_uniforms=record_uniforms, **options)
    run.run(progress, streamer)
    return run.output(time.perf_counter() - t_start)


def _check_options(method: str, n_prompts: int, lookahead: Any, max_new_tokens: Any, do_sample: Any,
                   mask_textless: Any, progress: Any, streamer: Any, temperature: Any, top_k: Any, top_p: Any,
                   drafter_temperature: Any, lookbehind: Any, min_path_prob: Any, proposal_map: Any, max_tokens: Any,
                   resync: Any, seed: Any, tree: Any = None, tree_draws: Any = None,
                   min_confidence: Any = None) -> tuple[Method, dict[str, Any]]:
    """The method object (:func:`hsd_torch.methods.make`, which checks its options and gives it its
    ``lookahead``, an int >= 1) and ``Generation``'s keyword options that need no model:
    ``max_new_tokens`` (an int >= 1), ``greedy``, ``mask_textless``, both models' processing
    (``process``, ``d_process``: :class:`hsd_torch.engine.laws.Processing`; ``drafter_temperature`` replaces
    the drafter's temperature) and ``seed``, checked (:func:`hsd_torch.engine.validation.check_seed`; a
    ``torch.Generator`` is drawn from only once the work starts); the flags are checked by :func:`_check_flags`. In this
    order, so the first bad argument is the one reported, and all of it before any model is read."""
    lookahead = as_int("lookahead", lookahead, 1)
    max_new_tokens = as_int("max_new_tokens", max_new_tokens, 1)
    _check_flags(do_sample, mask_textless, progress, streamer, n_prompts)
    process = Processing.checked(temperature, top_k, top_p)
    d_process = process if drafter_temperature is None else process.with_temperature(
        check_temperature(drafter_temperature, "drafter_temperature"))
    m = make(method, lookahead=lookahead, greedy=not do_sample, lookbehind=lookbehind, min_path_prob=min_path_prob,
             proposal_map=proposal_map, max_tokens=max_tokens, resync=resync, tree=tree, tree_draws=tree_draws,
             min_confidence=min_confidence)
    check_seed(seed)
    return m, {"max_new_tokens": max_new_tokens, "greedy": not do_sample, "mask_textless": mask_textless,
               "process": process, "d_process": d_process, "seed": seed}


def _render(items: list[Any], ids: list[list[int]] | None, attention_mask: Any, method: Method, target: Any,
            target_tokenizer: Any, drafter_tokenizer: Any) -> Prompts:
    """The rows' contexts: the checked prompts rendered for the target's tokenizer and, for a
    method that drafts, the drafter's (:func:`hsd_torch.engine.prompts.render`), or the target's ``ids``
    exactly (:func:`hsd_torch.engine.prompts.from_ids`)."""
    if ids is None:
        return render(items, target_tokenizer, drafter_tokenizer if method.needs_drafter else None)
    return from_ids(ids, attention_mask, TokenText.get(target_tokenizer, logit_width(target)))


def _check_extras(target: Any, generation_config: Any, logits_processor: Any, min_new_tokens: Any,
                  stop_strings: Any) -> dict[str, Any]:
    """``Generation``'s ``generation_config`` (:func:`_check_config`), ``processors``,
    ``min_new_tokens`` and ``stop_strings``, checked (:mod:`hsd_torch.engine.processors`); a None minimum
    or stop strings are the generation config's."""
    config = _check_config(target, generation_config)
    return {"generation_config": config, "processors": check_logits_processor(logits_processor),
            "min_new_tokens": check_min_new_tokens(getattr(config, "min_new_tokens", None) if min_new_tokens is None
                                                   else min_new_tokens),
            "stop_strings": check_stop_strings(getattr(config, "stop_strings", None) if stop_strings is None
                                               else stop_strings)}


def _check_rows(prompts: Any, input_ids: Any, attention_mask: Any) -> tuple[list[Any], list[list[int]] | None]:
    """The checked prompts (:func:`hsd_torch.engine.prompts.check_prompts`; none when ``input_ids`` is
    given) and ``input_ids`` as lists of ints (converted once; None without them); ``ValueError``
    for both prompts and ids, or a mask without ids."""
    if input_ids is None:
        if attention_mask is not None:
            raise ConflictingArguments("attention_mask goes with input_ids; with text prompts leave it out")
        return list(check_prompts(prompts)), None
    if not (isinstance(prompts, (tuple, list)) and len(prompts) == 0):
        raise ConflictingArguments("give prompts or input_ids, not both")
    return [], _as_rows(input_ids, "input_ids")


def _check_config(target: Any, config: Any) -> Any:
    """The generation config that applies (``config``, or the target's own when None), checked
    (:func:`hsd_torch.engine.genconfig.check_generation_config`); ``TypeError`` for a config that is not a
    ``transformers.GenerationConfig``."""
    from transformers import GenerationConfig

    if config is None:
        own = getattr(target, "generation_config", None)
        check_generation_config(own, "the target's generation_config")
        return own
    if not isinstance(config, GenerationConfig):
        raise TypeError(f"generation_config must be None or a transformers.GenerationConfig, got {type(config).__name__}")
    check_generation_config(config, "generation_config")
    return config


def _check_flags(do_sample: Any, mask_textless: Any, progress: Any, streamer: Any, n_prompts: int) -> None:
    """``do_sample`` and ``mask_textless`` are bools, ``progress`` None or a callable, ``streamer``
    None or an object with ``put`` and ``end`` (``TypeError``), and with one prompt only
    (``ValueError``: a streamer takes one sequence, as transformers' do)."""
    for name, value in (("do_sample", do_sample), ("mask_textless", mask_textless)):
        if not isinstance(value, bool):
            raise WrongType(f"{name} must be True or False, got {value!r}")
    if progress is not None and not callable(progress):
        raise WrongType(f"progress must be None or a callable taking the number of finished rows, got {progress!r}")
    if streamer is not None:
        if not (callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))):
            raise WrongType(f"streamer must be None or a transformers streamer (put and end), got {type(streamer).__name__}")
        if n_prompts != 1:
            raise ConflictingArguments(f"a streamer takes one sequence (as transformers' streamers do), got {n_prompts} prompts: "
                             "call generate once per prompt to stream, or leave the streamer out")


def _check_models(target: Any, drafter: Any, target_tokenizer: Any, drafter_tokenizer: Any, method: Method,
                  dtype: Any) -> None:
    """The models and tokenizers (:func:`hsd_torch.engine.runner.check_model`,
    :func:`hsd_torch.vocab.text.check_tokenizer`; a drafter is checked only for a method that drafts),
    then their devices: one for both, not the meta device; then ``dtype``
    (:func:`hsd_torch.engine._precision.as_dtype`), which every model checked must already be in
    (:func:`hsd_torch.engine._precision.check_model_dtype`)."""
    needs_drafter = method.needs_drafter
    dev = check_model(target, "target")
    check_tokenizer(target_tokenizer, "target_tokenizer")
    if needs_drafter:
        if drafter is None or drafter_tokenizer is None:
            raise ConflictingArguments(f"method {method.name!r} needs a drafter and a drafter_tokenizer")
        d_dev = check_model(drafter, "drafter")
        check_tokenizer(drafter_tokenizer, "drafter_tokenizer")
        if d_dev != dev:
            raise ValueError(f"the target is on {dev} and the drafter on {d_dev}: put both models on one device")
    refuse_meta(dev, "target")
    want = as_dtype(dtype)
    check_model_dtype(target, "target", want)
    if needs_drafter:
        check_model_dtype(drafter, "drafter", want)
