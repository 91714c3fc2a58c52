"""What ``generate`` takes from a ``transformers.GenerationConfig`` (the target's own, or the one a
caller passes as ``generation_config=``), and what it refuses.

Honoured: ``eos_token_id`` (an int or a list): a row ends at any of those ids or at the
tokenizer's EOS (:func:`hsd_torch.engine.rounds.end_ids`), and they stay in the target's law;
``min_new_tokens`` and ``stop_strings`` (unless ``generate``'s own arguments of those names are
given: :mod:`hsd_torch.engine.processors`).

Not taken from the config: ``do_sample``, ``temperature``, ``top_k``, ``top_p`` and
``max_new_tokens`` are ``generate``'s own arguments, with its own defaults (sampling at temperature
1, no top-k, no top-p, 64 new tokens), whatever the config says; a config that sets them is not an
error, but they do not apply (pass them to ``generate``). transformers' ``generate`` applies a
top-k of 50 when sampling with none set: ``top_k=50`` gives its law.

Refused (``ValueError`` naming the field, before any work): every field that changes the target's
law or the way a sequence is chosen, which ``generate`` does not implement, so that nothing is
ignored silently: :data:`REFUSED` (repetition penalties, n-gram bans, forced, suppressed or biased
ids, ``min_length`` (a total length, prompt included), typical / epsilon / eta / min-p / top-h
truncation, beams, contrastive search, guidance, DoLa, watermarking, time limits, token healing,
several sequences per prompt; a caller can still pass transformers' processor for most of them as
``logits_processor=``). A value equal to the field's neutral one (``repetition_penalty=1.0``,
``num_beams=1``, ...) is accepted. Fields about outputs, caches and assistants are ignored:
they do not change the law.
"""

from __future__ import annotations

from typing import Any

from ._args import is_int

__all__ = ["REFUSED", "check_generation_config", "end_ids_of"]

REFUSED: dict[str, tuple[object, ...]] = {
    "repetition_penalty": (1, 1.0),
    "encoder_repetition_penalty": (1, 1.0),
    "no_repeat_ngram_size": (0,),
    "encoder_no_repeat_ngram_size": (0,),
    "bad_words_ids": (),
    "force_words_ids": (),
    "constraints": (),
    "sequence_bias": (),
    "suppress_tokens": (),
    "begin_suppress_tokens": (),
    "forced_bos_token_id": (),
    "forced_eos_token_id": (),
    "min_length": (0,),
    "exponential_decay_length_penalty": (),
    "typical_p": (1, 1.0),
    "epsilon_cutoff": (0, 0.0),
    "eta_cutoff": (0, 0.0),
    "min_p": (0, 0.0),
    "top_h": (),
    "num_beams": (1,),
    "num_beam_groups": (1,),
    "diversity_penalty": (0, 0.0),
    "penalty_alpha": (0, 0.0),
    "guidance_scale": (1, 1.0),
    "dola_layers": (),
    "watermarking_config": (),
    "max_time": (),
    "token_healing": (False,),
    "num_return_sequences": (1,),
}
"""The fields ``generate`` refuses when set (not None) to anything but the neutral values listed."""


def check_generation_config(config: Any, where: str) -> None:
    """``ValueError`` naming the first field of :data:`REFUSED` that ``config`` (a
    ``GenerationConfig``, or None: nothing to check) sets to a value that is not neutral; ``where``
    says whose config it is (``"the target's generation_config"``)."""
    if config is None:
        return
    for name, neutral in REFUSED.items():
        value = getattr(config, name, None)
        if value is None or value in neutral or (isinstance(value, (list, tuple, dict)) and not value):
            continue
        raise ValueError(
            f"{where} sets {name}={value!r}, which changes the target's law in a way hsd does not implement "
            "(docs/generate.md, 'What generate takes from a generation config'); generate would otherwise "
            f"ignore it: pass generation_config=GenerationConfig(...) without it (e.g. a copy of the model's "
            f"with {name}=None) to generate from the model's unpenalized law")


def end_ids_of(config: Any) -> list[int]:
    """``config.eos_token_id`` (an int or a list of them; numpy integers too) as a list of ints
    (empty when unset)."""
    e = getattr(config, "eos_token_id", None)
    if e is None:
        return []
    values = [e] if is_int(e) else list(e)
    return [int(x) for x in values if is_int(x)]
