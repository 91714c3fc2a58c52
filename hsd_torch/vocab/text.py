"""Text of Hugging Face token ids as bytes, and the one encoding rule both backends share.

:class:`TokenText` wraps a tokenizer (at the width of a model's logits) with

- ``bytes_of[i]``: the byte string id ``i`` adds in the middle of a sequence
  (:func:`hsd_torch.vocab.token_bytes`), ``None`` for ids without text (special tokens, ids of a
  padded embedding, EOS, empty strings);
- ``text_mask [V]``: the ids with text, and EOS: the ids a drafter's law may put mass on, and a
  target's with ``mask_textless=True`` (with the end ids; by default a target's law keeps every
  id: :meth:`hsd_torch.engine.laws.TextSpace.law`);
- :meth:`TokenText.encode`: the **one** encoding rule used for text (a drafter's prompt; the
  target's prompt goes through :meth:`TokenText.encode_prompt`, the same ids for a prompt without
  special-token text), for TLI's re-sync of a token the drafter lacks, for SLEM's drafter context and for SLEM's re-tokenization, by
  :func:`hsd_torch.generate` and by the mirror :class:`hsd_torch.models.mirror.CoreModel` alike. On
  valid UTF-8 it is the tokenizer's own encoding without special tokens (so a SentencePiece
  tokenizer prepends its ``▁`` as it always does: ``decode(encode(x)) == x`` then holds only
  for text starting with a space). Text that is not valid UTF-8 (drafts often end inside a
  character) is split into maximal valid runs, each encoded as above, and single invalid bytes,
  each encoded as the lowest id whose text is exactly that byte. A byte with no such id (SmolLM2
  has none for 0xC0, 0xC1, 0xF5-0xFF and some control characters; a tokenizer without byte
  fallback lacks many) cannot be encoded: :class:`Unencodable`, or, where the text only feeds a
  drafter's context (``free=True``: that context only shapes proposals), the byte is left out.
- ``prefix``: the special ids the tokenizer puts before a text (a BOS), part of every context the
  model sees but not of the text.

Text is text. :meth:`TokenText.encode` reads a special token's text inside a text (a model that
writes ``</s>`` or ``<|im_end|>`` as ordinary bytes, a drafter's text equal to a special token) as
text, never as the special id (``encode_special_tokens`` on a copy of the backend). Prompts are
the exception (:meth:`TokenText.encode_prompt`): the target's context is exactly what transformers
feeds, ``tokenizer(prompt, add_special_tokens=False)``, so a chat template's special tokens are its
special ids; a drafter reads the prompt as text through :meth:`TokenText.encode` (its context only
shapes proposals).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from hsd_core.tokenizers import Unencodable as CoreUnencodable

from ..engine._cache import IdentityCache
from .byte_strings import token_bytes, tokenizer_state_cached

__all__ = ["TokenText", "Unencodable", "check_tokenizer"]

_INVALID = re.compile("([\udc80-\udcff])")


class Unencodable(CoreUnencodable):
    """A text the tokenizer cannot encode: a byte no id's text is, or a piece whose encoding gives
    an id without text (``hsd_core.tokenizers.Unencodable``, a ``ValueError``: the mirror's
    reference methods catch it as theirs). Where a proposal would need it, the text is simply not
    proposed (SLEM proposes no candidate, one-token SLRS maps such a drafter id to no target id,
    bounded SLRS's parse ends before it)."""


def check_tokenizer(tokenizer: Any, role: str) -> None:
    """``tokenizer`` (the argument ``role``, e.g. ``"target_tokenizer"``) is a Hugging Face
    ``transformers`` tokenizer; ``TypeError`` naming ``role`` otherwise, with the fix for a raw
    ``tokenizers.Tokenizer`` (which has no EOS, BOS or special-token map of its own)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase

    if isinstance(tokenizer, Tokenizer):
        raise TypeError(
            f"{role} is a raw tokenizers.Tokenizer; hsd needs a Hugging Face transformers tokenizer (its EOS, BOS "
            "and special tokens): wrap it, e.g. transformers.PreTrainedTokenizerFast(tokenizer_object=tok, "
            "eos_token=..., bos_token=...)")
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        got = "None" if tokenizer is None else type(tokenizer).__name__
        raise TypeError(f"{role} must be a Hugging Face tokenizer (transformers.AutoTokenizer.from_pretrained(...)), "
                        f"got {got}")


class TokenText:
    """The text of a tokenizer's ids, at ``vocab_size`` ids (a model's logit width); ``state``: the
    tokenizer's :func:`hsd_torch.vocab.tokenizer_state` when the caller has just read it."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_id: int | None = None, *, state: Any = None) -> None:
        self.tokenizer = tokenizer
        tb = token_bytes(tokenizer, vocab_size, state=state)
        eos = eos_id if eos_id is not None else getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            raise ValueError("the tokenizer has no eos_token_id")
        self.eos_id: int = int(eos)
        self.vocab_size = vocab_size
        self.bytes_of: list[bytes | None] = [b if b else None for b in tb.by_id]
        self.bytes_of[self.eos_id] = None
        mask = [b is not None for b in self.bytes_of]
        mask[self.eos_id] = True
        self.text_mask = torch.tensor(mask, dtype=torch.bool)
        self.byte_id: dict[int, int] = {}
        for i, b in enumerate(self.bytes_of):
            if b is not None and len(b) == 1 and b[0] not in self.byte_id:
                self.byte_id[b[0]] = i
        # the tokenizers backend that ``tokenizer(s, add_special_tokens=False)`` runs (one Rust call,
        # about 10x faster than the transformers wrapper); None: call the tokenizer itself.
        # ``encode_batch_fast`` (tokenizers >= 0.20) is the same pipeline without the character
        # offsets (all zeros), which the ids do not depend on: 10-40 % faster on a context's text
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend: Any = backend if callable(getattr(backend, "encode", None)) else None
        fast = getattr(backend, "encode_batch_fast", None) if self._backend is not None else None
        self._fast: Any = fast if callable(fast) else None
        self._plain_backend: Any = None  # the backend copy that reads special-token text as text (built once needed)
        specials = sorted({t for t in tb.special.values() if t}, key=len, reverse=True)
        self._special_re = re.compile("(" + "|".join(map(re.escape, specials)) + ")") if specials else None
        with_special = list(tokenizer("a", add_special_tokens=True)["input_ids"])
        plain = list(tokenizer("a", add_special_tokens=False)["input_ids"])
        n = len(with_special) - len(plain)
        self.prefix: list[int] = with_special[:n] if n > 0 and with_special[n:n + len(plain)] == plain else []

    _cache: IdentityCache[TokenText] = IdentityCache(16)

    @classmethod
    def get(cls, tokenizer: Any, vocab_size: int) -> TokenText:
        """``TokenText(tokenizer, vocab_size)``, built once per tokenizer object **and state**
        (:func:`hsd_torch.vocab.tokenizer_state`: its added tokens, normalizer, pre-tokenizer,
        post-processor, decoder, special ids, ..., and a digest of its model's content), so a
        tokenizer changed in place (a BOS template set on its post-processor, tokens added, its
        model swapped for another of the same kind and size) is read again, as a fresh object with
        that state would be: building reads the whole vocabulary (milliseconds at 4k ids, more at
        150k), which a call of ``generate`` must not pay again. The state is read through
        :func:`hsd_torch.vocab.tokenizer_state_cached`: in full (its digest serializes the model:
        20-400 ms on real tokenizers) only when the cheap :func:`hsd_torch.vocab.tokenizer_fingerprint`
        (0.4-5 ms) moves; a change in place that the fingerprint cannot see needs
        :func:`hsd_torch.vocab.forget_tokenizer`. Everything cached per :class:`TokenText` (text spaces, column maps, bridges, tries) follows."""
        state = tokenizer_state_cached(tokenizer)
        return cls._cache.get((tokenizer,), (vocab_size, state), lambda: cls(tokenizer, vocab_size, state=state))

    def has_text(self, i: int) -> bool:
        """Whether id ``i`` is one of the model's ids and has text (``bytes_of[i]`` is not None)."""
        return 0 <= i < self.vocab_size and self.bytes_of[i] is not None

    def _textless(self, ids: Sequence[int]) -> bool:
        return not all(self.has_text(i) for i in ids)

    def _own_ids(self, s: str) -> list[int]:
        """``tokenizer(s, add_special_tokens=False)["input_ids"]``: one call of its tokenizers
        backend when it has one (special tokens parsed, as the tokenizer itself does)."""
        if self._fast is not None:
            return list(self._fast([s], add_special_tokens=False)[0].ids)
        if self._backend is not None:
            return list(self._backend.encode(s, add_special_tokens=False).ids)
        return [int(i) for i in self.tokenizer(s, add_special_tokens=False)["input_ids"]]

    def _encode_plain(self, s: str) -> list[int]:
        """``s`` encoded with special-token text read as text (``encode_special_tokens`` on a copy of
        the backend: the user's tokenizer is not touched; ``split_special_tokens=True`` without one)."""
        if self._backend is None:
            return [int(i) for i in self.tokenizer(s, add_special_tokens=False, split_special_tokens=True)["input_ids"]]
        if self._plain_backend is None:
            from tokenizers import Tokenizer

            copy = Tokenizer.from_str(self._backend.to_str())
            copy.encode_special_tokens = True
            self._plain_backend = copy
        return list(self._plain_backend.encode(s, add_special_tokens=False).ids)

    def _encode_str(self, s: str, free: bool = False) -> list[int]:
        ids = self._own_ids(s)
        if self._textless(ids):
            # a special token's text inside the text (a model writing "</s>" as bytes): read it as text.
            # An encoding with no special id matched no special token, so it is already that encoding
            ids = self._encode_plain(s)
            if self._textless(ids) and self._special_re is not None:
                # the model's own segmentation picks the special piece (a Unigram vocabulary holding
                # "</s>" with the top score): each special token's text as its single-byte ids
                ids = []
                for k, part in enumerate(self._special_re.split(s)):
                    if k % 2 == 0:
                        ids.extend(self._encode_plain(part) if part else [])
                        continue
                    for b in part.encode("utf-8"):
                        if b not in self.byte_id:
                            raise Unencodable(f"the tokenizer has no token for the byte {b:#04x} of {part!r}")
                        ids.append(self.byte_id[b])
        bad = next((i for i in ids if not self.has_text(i)), None)
        if bad is None:
            return ids
        if free:
            return [i for i in ids if self.has_text(i)]
        raise Unencodable(f"encoding {s!r} gave id {bad}, which has no text")

    def encode(self, data: bytes, free: bool = False) -> list[int]:
        """Ids of ``data`` (the rule of the module docstring); no special ids. :class:`Unencodable`
        (a ``ValueError``) when a part of it cannot be encoded; with ``free=True`` (a drafter's
        context) that part is left out instead."""
        if not data:
            return []
        s = data.decode("utf-8", errors="surrogateescape")
        out: list[int] = []
        for part in _INVALID.split(s):
            if not part:
                continue
            if len(part) == 1 and 0xDC80 <= ord(part) <= 0xDCFF:
                b = ord(part) - 0xDC00
                if b in self.byte_id:
                    out.append(self.byte_id[b])
                elif not free:
                    raise Unencodable(f"the tokenizer has no token for the byte {b:#04x}")
            else:
                out.extend(self._encode_str(part, free))
        return out

    def decode(self, ids: Iterable[int]) -> bytes:
        """The concatenated text of ``ids`` (ids without text contribute nothing)."""
        bs = self.bytes_of
        return b"".join(b for b in (bs[i] for i in ids) if b is not None)

    def start(self, prompt: str, parsed: bool = False) -> list[int]:
        """The special ids a context for ``prompt`` starts with: :attr:`prefix`; or, when the
        tokenizer adds no prefix and ``prompt`` encodes to no ids (an empty prompt), its BOS, so
        that the model has something to condition on (as ``model.generate`` does without input
        ids). ``ValueError`` when it has no BOS either. ``parsed=True`` (the target's prompt, read
        by :meth:`encode_prompt`): a prompt whose own ids already begin with the prefix (a chat
        template's text begins with ``<bos>`` or ``<|begin_of_text|>``) gets no second one, as
        ``apply_chat_template`` feeds it."""
        if parsed and self.prefix and self.encode_prompt(prompt)[:len(self.prefix)] == list(self.prefix):
            return []
        if self.prefix or self.encode_prompt(prompt):
            return list(self.prefix)
        bos = getattr(self.tokenizer, "bos_token_id", None)
        if bos is None:
            raise ValueError(
                f"prompt {prompt!r} encodes to no tokens and the tokenizer has neither a special prefix nor a "
                "bos_token_id, so the model has nothing to condition on; give a non-empty prompt or a "
                "tokenizer with a BOS")
        return [int(bos)]

    def encode_prompt(self, prompt: str) -> list[int]:
        """The target's ids for ``prompt`` as transformers feeds them: the tokenizer's own encoding
        without its special prefix, ``tokenizer(prompt, add_special_tokens=False)``, special tokens
        parsed (a chat template's ``<|im_start|>`` is its special id). ``ValueError`` for an id
        outside the model's ``vocab_size`` columns."""
        ids = self._own_ids(prompt)
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"prompt {prompt!r} encodes to id {bad[0]}, outside the model's {self.vocab_size} "
                             "logit columns")
        return ids

    def prompt_ids(self, prompt: str) -> list[int]:
        """The target's context for ``prompt``: :meth:`start` (``parsed=True``) followed by
        :meth:`encode_prompt` (never empty)."""
        return self.start(prompt, parsed=True) + self.encode_prompt(prompt)

    def ids_without_prefix(self, ids: Sequence[int]) -> list[int]:
        """``ids`` with the leading :attr:`prefix` removed."""
        n = len(self.prefix)
        return list(ids[n:])
