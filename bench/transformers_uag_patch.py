"""Monkeypatch for transformers' universal speculative decoding (different tokenizers, do_sample=True).

Verified on transformers 5.25.0 (and 5.24.0 before it) (docs/auditing-transformers.md has the root causes and the audits).

1. ``AssistantToTargetTranslator.get_target_logits`` puts the pruned assistant head's column ``j`` on
   the target id of the ``j``-th overlap id in *ascending assistant-id order*, while
   ``get_target_ids`` maps a draft sampled from column ``j`` through ``assistant_overlap_token_ids[j]``
   (the order of ``tokenizer.get_vocab()``, a hash map). The q of the acceptance test is then not
   the law the drafts were drawn from. Fixed: column ``j`` goes to the target id its drafts get.
2. ``AssistantVocabTranslatorCache.get_translator`` keys translators by the two tokenizers only, but a
   translator prunes the head of the assistant model it was built with: a second assistant model
   gets the first one's translator and an unpruned head (``IndexError`` in ``get_target_ids``).
   Fixed: one translator per (assistant model, tokenizers, target vocab size).
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


def apply_patch() -> None:
    """Install both fixes (idempotent)."""
    if _ORIGINAL:
        return
    _ORIGINAL["get_target_logits"] = cg.AssistantToTargetTranslator.get_target_logits
    _ORIGINAL["get_translator"] = cg.AssistantVocabTranslatorCache.get_translator  # bound classmethod
    cg.AssistantToTargetTranslator.get_target_logits = _get_target_logits  # type: ignore[method-assign]
    cg.AssistantVocabTranslatorCache.get_translator = classmethod(_get_translator)  # type: ignore[method-assign,assignment]


def remove_patch() -> None:
    """Restore transformers' own methods."""
    if not _ORIGINAL:
        return
    cg.AssistantToTargetTranslator.get_target_logits = _ORIGINAL.pop("get_target_logits")  # type: ignore[method-assign]
    cg.AssistantVocabTranslatorCache.get_translator = classmethod(  # type: ignore[method-assign,assignment]
        _ORIGINAL.pop("get_translator").__func__)
