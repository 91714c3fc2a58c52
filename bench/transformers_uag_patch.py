"""Monkeypatch for transformers' universal speculative decoding (different tokenizers, do_sample=True),
and for the assistant's cache in its assisted generation across tokenizers (greedy too, 5.25).

Verified on transformers 5.25.0 and 5.24.0 (docs/auditing-transformers.md has the root causes and the audits).

1. ``AssistantToTargetTranslator.get_target_logits`` puts the pruned assistant head's column ``j`` on
   the target id of the ``j``-th overlap id in *ascending assistant-id order*, while
   ``get_target_ids`` maps a draft sampled from column ``j`` through ``assistant_overlap_token_ids[j]``
   (the order of ``tokenizer.get_vocab()``, a hash map). The q of the acceptance test is then not
   the law the drafts were drawn from. Fixed: column ``j`` goes to the target id its drafts get.
2. ``AssistantVocabTranslatorCache.get_translator`` keys translators by the two tokenizers only, but a
   translator prunes the head of the assistant model it was built with: a second assistant model
   gets the first one's translator and an unpruned head (``IndexError`` in ``get_target_ids``).
   Fixed: one translator per (assistant model, tokenizers, target vocab size).
3. (5.25) ``UniversalSpeculativeDecodingGenerator`` and, for greedy, ``AssistedCandidateGeneratorDifferentTokenizers``
   roll the assistant's KV cache back by ``_last_ids_length``, which they set from the length of the
   *target* ids, minus the length of the *assistant* input ids: two tokenizations of one text. Where
   the assistant's ids are the longer, entries of rejected drafts stay in the cache, or all of its
   input is cached and the assistant's ``generate`` gets none (``IndexError: index is out of bounds
   for dimension with size 0``, or a ``RuntimeError`` in attention). Not a loss (the q of the test is
   the law of the drafts either way; greedy keeps the target's tokens), a crash. Fixed: the cache is
   cut to 5.24.0's size, in assistant ids.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from transformers.generation import candidate_generator as cg

_ORIGINAL: dict[str, Any] = {}
_BY_MODEL: weakref.WeakKeyDictionary[Any, dict[tuple[int, int, int, bool], Any]] = weakref.WeakKeyDictionary()


def _get_target_logits(self: Any, assistant_logits: torch.Tensor) -> torch.Tensor:
    overlap = getattr(self, "assistant_overlap_token_ids", None)
    if not self.assistant_prune_lm_head or overlap is None:
        return _ORIGINAL["get_target_logits"](self, assistant_logits)  # type: ignore[no-any-return]
    # pruned column j -> assistant id overlap[j] -> target id: the map get_target_ids applies to drafts
    target_ids = self._assistant_to_target_input_ids[overlap].to(assistant_logits.device)
    out = torch.full((*assistant_logits.shape[:-1], self.target_vocab_size), self.FILTER_VALUE,
                     dtype=assistant_logits.dtype, device=assistant_logits.device)
    out[..., target_ids] = assistant_logits
    return out


def _get_translator(cls: Any, target_tokenizer: Any, assistant_tokenizer: Any, target_vocab_size: int,
                    assistant_model: Any = None, assistant_prune_lm_head: bool = False) -> Any:
    if assistant_model is None:
        return _ORIGINAL["get_translator"](target_tokenizer, assistant_tokenizer, target_vocab_size,
                                           assistant_model, assistant_prune_lm_head)
    # the translator holds both tokenizers, so their ids stay unique while the entry lives
    per_model = _BY_MODEL.setdefault(assistant_model, {})
    key = (id(target_tokenizer), id(assistant_tokenizer), int(target_vocab_size), bool(assistant_prune_lm_head))
    if key not in per_model:
        per_model[key] = cg.AssistantToTargetTranslator(target_tokenizer, assistant_tokenizer, target_vocab_size,
                                                         assistant_model, assistant_prune_lm_head)
    return per_model[key]


def _keep_cache(self: Any, input_ids: torch.Tensor, keep: int, extra: int = 0) -> None:
    """Make 5.25's crop (``_last_ids_length - len(input_ids) + extra`` entries) leave ``keep`` entries."""
    cache = self.assistant_kwargs.get("cache")
    if cache is not None:
        self._last_ids_length = input_ids.shape[-1] + cache.get_seq_length() - keep - extra


def _usd_update_past_and_masks(self: Any, assistant_input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> bool:
    if self._prev_assistant_ids is not None:
        # _prepare_assistant_input_ids has cut the rejected drafts off _prev_assistant_ids: keep them less one
        _keep_cache(self, assistant_input_ids, self._prev_assistant_ids.shape[-1] - 1)
    return _ORIGINAL["usd_update"](self, assistant_input_ids, *args, **kwargs)  # type: ignore[no-any-return]


def _uag_update_past_and_masks(self: Any, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> bool:
    # greedy across tokenizers (USD's own method, above, calls this one through super())
    if not isinstance(self, cg.UniversalSpeculativeDecodingGenerator) and args and isinstance(args[0], int):
        _keep_cache(self, input_ids, input_ids.shape[-1] - 2 - args[0], extra=args[0])  # 5.24.0's size
    return _ORIGINAL["uag_update"](self, input_ids, *args, **kwargs)  # type: ignore[no-any-return]


def apply_patch(*, cache_only: bool = False) -> None:
    """Install the fixes (idempotent); ``cache_only``: fix 3 alone (transformers' own USD law, without
    5.25's crash: what a benchmark of the installed release can still run)."""
    if _ORIGINAL:
        return
    usd, uag = cg.UniversalSpeculativeDecodingGenerator, cg.AssistedCandidateGeneratorDifferentTokenizers
    _ORIGINAL["usd_update"] = usd._update_past_and_masks
    _ORIGINAL["uag_update"] = uag._update_past_and_masks  # inherited: deleted again, not put back, below
    usd._update_past_and_masks = _usd_update_past_and_masks  # type: ignore[method-assign]
    uag._update_past_and_masks = _uag_update_past_and_masks  # type: ignore[method-assign]
    if cache_only:
        return
    _ORIGINAL["get_target_logits"] = cg.AssistantToTargetTranslator.get_target_logits
    _ORIGINAL["get_translator"] = cg.AssistantVocabTranslatorCache.get_translator  # bound classmethod
    cg.AssistantToTargetTranslator.get_target_logits = _get_target_logits  # type: ignore[method-assign]
    cg.AssistantVocabTranslatorCache.get_translator = classmethod(_get_translator)  # type: ignore[method-assign,assignment]


def remove_patch() -> None:
    """Restore transformers' own methods."""
    if not _ORIGINAL:
        return
    cg.UniversalSpeculativeDecodingGenerator._update_past_and_masks = _ORIGINAL.pop("usd_update")  # type: ignore[method-assign]
    _ORIGINAL.pop("uag_update")
    if "_update_past_and_masks" in vars(cg.AssistedCandidateGeneratorDifferentTokenizers):
        del cg.AssistedCandidateGeneratorDifferentTokenizers._update_past_and_masks
    if "get_target_logits" in _ORIGINAL:
        cg.AssistantToTargetTranslator.get_target_logits = _ORIGINAL.pop("get_target_logits")  # type: ignore[method-assign]
        cg.AssistantVocabTranslatorCache.get_translator = classmethod(  # type: ignore[method-assign,assignment]
            _ORIGINAL.pop("get_translator").__func__)
