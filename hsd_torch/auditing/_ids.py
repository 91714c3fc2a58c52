"""Helpers both audits share (:mod:`hsd_torch.auditing.first_tokens`,
:mod:`hsd_torch.auditing.sequences`): a target's end ids, its logit width, and a sampler's output
checked as a list of its ids."""

from __future__ import annotations

from typing import Any

import torch

from hsd_core.seqaudit import as_ids

from ..engine.genconfig import end_ids_of


def _eos_ids(target: Any, tokenizer: Any) -> frozenset[int]:
    """The tokenizer's EOS and the target's ``generation_config.eos_token_id`` (the end set of
    :func:`hsd_torch.engine.rounds.end_ids`, before its cut to the model's logits)."""
    e = getattr(tokenizer, "eos_token_id", None)
    return frozenset(([] if e is None else [int(e)]) + end_ids_of(getattr(target, "generation_config", None)))


def _width(model: Any) -> int:
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "weight"):
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


def _as_ids(out: Any, what: str, width: int | None) -> list[int]:
    """``out`` (a list, tuple, numpy array or tensor of target ids) as a list of Python ints
    (:func:`hsd_core.seqaudit.as_ids`, tensors flattened first); with ``width``, ``ValueError`` for
    an id outside ``[0, width)``, the target's ids (None: any int, for a caller that reports such
    ids itself). ``what`` starts the message ("sample_fn('x', 7) returned", "prompt_ids has")."""
    items = as_ids(out.flatten().tolist() if isinstance(out, torch.Tensor) else out, what)
    if width is not None:
        for t in items:
            if not 0 <= t < width:
                raise ValueError(f"{what} id {t}, outside the target's {width} ids")
    return items
