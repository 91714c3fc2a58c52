"""The mirror: a Hugging Face model and tokenizer presented as an :mod:`hsd_core` model.

:class:`CoreModel` lets the reference methods (``hsd_core.methods.AR/SD/TLI/SLEM``) run over the
very models :func:`hsd_torch.generate` runs, so that, fed the uniforms the backend consumed
(``GenerateOutput.uniforms`` through ``hsd_core.rand.UniformRand``), the reference must emit the
same tokens.

The mapping to ``hsd_core``'s toy world (``hsd_core.vocab.Vocabulary``: token strings, every
character a single-character token, EOS out of band with the last id):

- **Text is bytes.** A token's string is its byte string (:attr:`TokenText.bytes_of`) read as
  latin-1, one character per byte, so core text is the latin-1 reading of UTF-8 bytes
  (``prompt.encode("utf-8").decode("latin-1")``) and any byte sequence, partial UTF-8 included,
  is a string. The alphabet rule holds when every byte that occurs in a token is itself a
  single-byte token: true for byte-level BPE (256 byte tokens) and for byte fallback
  (``<0x00>..<0xFF>``); :class:`CoreModel` checks it and raises ``ValueError`` otherwise. The two
  models' alphabets may differ (SmolLM2 has no token for 21 bytes Gemma has): the references'
  string-level methods then propose nothing for a text the target cannot encode and leave out of
  the drafter's context what it cannot encode (:meth:`CoreTokenizer.encode_free`), as the backend
  does.
- **Ids.** Core ids are the tokenizer's ids that have text, in increasing order, then EOS; ids
  without text (special tokens, a padded embedding's extra ids) have no core id, and the backend
  gives them probability 0 (:func:`hsd_torch.engine.entry.process_logits`). The order is kept, so
  argmax ties mean the same on both sides, and the vocabulary names, for a string several ids share,
  the id the tokenizer writes it as (:meth:`~hsd_torch.vocab.TokenBytes.written_ids`, the bridge's rule:
  ``Vocabulary(..., written=...)``).
- **Encoding.** ``encode``/``decode`` are :class:`TokenText`'s (the rule both sides share; for
  SentencePiece tokenizers ``decode(encode(x))`` gains the ``▁`` space the tokenizer prepends,
  which costs acceptance, never correctness). The tokenizer's special prefix (a BOS) is put
  before every context by :meth:`CoreModel.next_probs`, not into core contexts (for a prompt that
  encodes to no ids and a tokenizer without prefix, its BOS: ``CoreModel(..., prompt=...)``).
- **Laws.** ``next_probs`` runs the model on the full context (no cache, batch 1) and returns the
  processed law (same :func:`process_logits`, same temperature / top-k / top-p) as float64.
  The backend's batched, cached forward passes agree with it up to float rounding, so the two
  can differ only where a uniform falls within rounding of a decision boundary.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from hsd_core.vocab import Vocabulary

from ..engine.laws import TextSpace, process_logits, space_law
from ..engine.rounds import end_ids
from ..engine.runner import logit_width, max_positions, model_device, window_view
from ..vocab.byte_strings import token_bytes
from ..vocab.text import TokenText

__all__ = ["CoreModel", "CoreTokenizer", "target_greedy", "target_two_token_law"]


class CoreTokenizer:
    """An ``hsd_core`` tokenizer over core ids (see the module docstring)."""

    def __init__(self, text: TokenText) -> None:
        self.text = text
        self.hf_ids: list[int] = [i for i, b in enumerate(text.bytes_of) if b is not None] + [text.eos_id]
        self.core_id: dict[int, int] = {h: c for c, h in enumerate(self.hf_ids)}
        strings = [b.decode("latin-1") for b in (text.bytes_of[i] for i in self.hf_ids[:-1]) if b is not None]
        eos = "<eos>"
        while eos in strings:
            eos = "<" + eos + ">"
        missing = sorted({c for s in strings for c in s} - set(strings))
        if missing:
            raise ValueError(f"bytes {[hex(ord(c)) for c in missing]} occur in tokens but are not single-byte "
                             "tokens: the tokenizer has no byte-level alphabet or byte fallback")
        written = {b.decode("latin-1"): self.core_id[i]
                   for b, i in token_bytes(text.tokenizer, text.vocab_size).written_ids((text.eos_id,)).items()
                   if i in self.core_id}
        self._vocab = Vocabulary(strings, eos, written=written)

    @property
    def vocab(self) -> Vocabulary:
        return self._vocab

    def to_core(self, hf_ids: Iterable[int]) -> list[int]:
        """Core ids of Hugging Face ids (``KeyError`` for an id without text)."""
        return [self.core_id[int(i)] for i in hf_ids]

    def to_hf(self, core_ids: Iterable[int]) -> list[int]:
        return [self.hf_ids[int(i)] for i in core_ids]

    def encode(self, text: str) -> list[int]:
        """Core ids of core text (:meth:`TokenText.encode`: :class:`~hsd_torch.vocab.text.Unencodable`
        for a byte the tokenizer has no token for)."""
        return self.to_core(self.text.encode(text.encode("latin-1")))

    def encode_free(self, text: str) -> list[int]:
        """As :meth:`encode`, leaving out what the tokenizer cannot encode (``free=True``: the
        backend's drafter context; ``hsd_core.tokenizers.encode_free`` calls it)."""
        return self.to_core(self.text.encode(text.encode("latin-1"), free=True))

    def decode(self, ids: Iterable[int]) -> str:
        return self.text.decode(self.to_hf(ids)).decode("latin-1")


def core_text(s: str) -> str:
    """A Python str as core text: its UTF-8 bytes read as latin-1."""
    return s.encode("utf-8").decode("latin-1")


class CoreModel:
    """``model`` + ``tokenizer`` as an ``hsd_core.models.Model`` (float64 ``next_probs``).

    ``temperature``, ``top_k``, ``top_p`` give the processed law (as :func:`hsd_torch.generate`
    uses). ``prompt``: the prompt the reference will run, so that every context starts as the
    backend's does (:meth:`TokenText.start`: the tokenizer's prefix, or its BOS for a prompt that
    encodes to no ids); without it, the prefix. ``window=True`` (for a drafter): contexts longer
    than the model's positions are seen through the backend's sliding window
    (:func:`hsd_torch.engine.runner.window_view`). ``evaluations`` counts forward passes (cached per
    context).
    """

    def __init__(self, model: Any, tokenizer: Any, *, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, prompt: str | None = None, window: bool = False) -> None:
        self.model = model
        self.text = TokenText(tokenizer, logit_width(model))
        self.start: list[int] = self.text.start(prompt) if prompt is not None else list(self.text.prefix)
        self.max_pos = max_positions(model.config) if window else None
        self._tokenizer = CoreTokenizer(self.text)
        self._process: dict[str, Any] = {"temperature": float(temperature), "top_k": top_k, "top_p": top_p}
        self._cache: dict[tuple[int, ...], npt.NDArray[np.float64]] = {}
        if TextSpace.text(self.text, torch.device("cpu")).ids != self._tokenizer.hf_ids:  # pragma: no cover
            raise AssertionError("the core ids differ from generate's text space")
        self.evaluations = 0

    @property
    def vocab(self) -> Vocabulary:
        return self._tokenizer.vocab

    @property
    def tokenizer(self) -> CoreTokenizer:
        return self._tokenizer

    def next_probs(self, context_ids: Sequence[int]) -> npt.NDArray[np.float64]:
        """The processed law after ``prefix + context`` over core ids (EOS last), float64."""
        ctx = tuple(int(i) for i in context_ids)
        hit = self._cache.get(ctx)
        if hit is not None:
            return hit
        ids = self.start + self._tokenizer.to_hf(ctx)
        if self.max_pos is not None:
            ids = window_view(ids, len(self.start), self.max_pos)
        if not ids:
            raise ValueError("empty context and no BOS: the model has nothing to condition on")
        dev = model_device(self.model)
        with torch.inference_mode():
            logits = self.model(input_ids=torch.tensor([ids], dtype=torch.long, device=dev)).logits[0, -1]
            space = TextSpace.text(self.text, dev)
            probs = space_law(logits, space, ~self.text.text_mask.to(dev), **self._process)
            law = probs.to(torch.float64).cpu().numpy().copy()
        if probs.dtype != torch.float64:
            law = law / law.sum()  # a float32 law, summed in float64, is 1 only to about 1e-7
        self._cache[ctx] = law
        self.evaluations += 1
        return law


def target_greedy(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int, *, mask_textless: bool = True
                  ) -> list[int]:
    """The target's own greedy decoding, ``model.generate(do_sample=False)``, of ``prompt`` as
    :func:`hsd_torch.generate` encodes it (:meth:`TokenText.prompt_ids`): the new ids, ending after
    an end id. With ``mask_textless=True`` (this helper's default: the mirror's setting) the ids
    that ``generate(mask_textless=True)`` removes from every law (no text, not EOS nor an end id)
    are suppressed; with False nothing is. Every method of :func:`hsd_torch.generate` with
    ``do_sample=False`` and the same ``mask_textless`` must return exactly these (the greedy
    identity the tests and ``bench/gpu_check_generate.py`` check)."""
    text = TokenText.get(tokenizer, logit_width(model))
    ends = end_ids(getattr(model, "generation_config", None), text)
    suppress = [i for i, ok in enumerate(text.text_mask.tolist()) if not ok and i not in ends] if mask_textless else []
    ids = torch.tensor([text.prompt_ids(prompt)], device=model_device(model))
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens, suppress_tokens=suppress or None,
                             pad_token_id=text.eos_id)
    new: list[int] = out[0, ids.shape[1]:].tolist()
    return new


def target_two_token_law(model: Any, tokenizer: Any, prompt: str, *, temperature: float = 1.0,
                         top_k: int | None = None, top_p: float | None = None) -> dict[tuple[int, ...], float]:
    """The exact law of the first two new ids of :func:`hsd_torch.generate` with this target (any
    method: they are all lossless for it), by enumeration over the target's own forward passes:
    ``{(t1, t2): P}``, and ``{(eos,): P}`` where the first id is EOS (the sequence ends). The
    processed law of :func:`process_logits` (with ``temperature``, ``top_k``, ``top_p``), in
    float64. One forward pass per first id with mass: for tests with a small support (top-k)."""
    text = TokenText.get(tokenizer, logit_width(model))
    ids = text.prompt_ids(prompt)
    dev = model_device(model)
    mask = text.text_mask.to(dev)

    def law_after(ctx: list[int]) -> torch.Tensor:
        logits = model(torch.tensor([ctx], device=dev)).logits[0, -1]
        return process_logits(logits, mask, temperature, top_k, top_p).double()

    law: dict[tuple[int, ...], float] = {}
    with torch.inference_mode():
        p1 = law_after(ids)
        for t1 in torch.nonzero(p1).flatten().tolist():
            if t1 == text.eos_id:
                law[(t1,)] = float(p1[t1])
                continue
            p2 = law_after(ids + [t1])
            for t2 in torch.nonzero(p2).flatten().tolist():
                law[(t1, t2)] = float(p1[t1] * p2[t2])
    return law
