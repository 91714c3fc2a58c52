"""Prompts as :func:`hsd_torch.generate` takes them: text, or a conversation rendered by each
tokenizer's own chat template.

A prompt is either

- a ``str``: the target's context is ``tokenizer(prompt, add_special_tokens=False)`` after the
  tokenizer's special prefix (:meth:`hsd_torch.vocab.text.TokenText.encode_prompt`; a chat template's
  special tokens are its special ids), and the drafter reads the same text as text; or
- given ids (``generate(input_ids=..., attention_mask=...)``, transformers' convention): each row's
  target context is exactly its ids where the mask is 1 (one run of ones per row: left or right
  padding), and the drafter reads their decoded text as text; or
- a **conversation**, a list of messages (mappings with ``"role"`` and ``"content"``, as
  ``tokenizer.apply_chat_template`` takes them): the target's text is its tokenizer's chat
  template applied with ``add_generation_prompt=True``, fed as ``apply_chat_template`` feeds it;
  the drafter's is its own tokenizer's rendering of the same messages, special tokens parsed, when
  it has a chat template, else the target's text, read as text.

The drafter's context only shapes proposals, so what it sees never changes the output's law
(proofs/README.md: a drafter's context is free); the target's context is exactly what transformers
would feed for the same prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Prompts", "check_prompts", "from_ids", "render", "target_context"]

Conversation = list[dict[str, Any]]


@dataclass(frozen=True)
class Prompts:
    """Each row's prompt, rendered: ``target[i]`` the target's text (special tokens parsed);
    ``drafter[i]`` the drafter's text, whose special tokens are parsed when ``drafter_parsed[i]``
    (its own chat template's rendering) and read as text otherwise."""

    target: list[str]
    drafter: list[str]
    drafter_parsed: list[bool]
    target_ids: list[list[int]] | None = None
    """Given ids (``generate(input_ids=...)``): each row's target context exactly, in place of its
    text's encoding (``target`` is then their decoded text, which the drafter reads as text)."""

    @classmethod
    def of_text(cls, texts: Sequence[str]) -> Prompts:
        """Text prompts: both models read the same text (the drafter as text)."""
        return cls(list(texts), list(texts), [False] * len(texts))


def target_context(text: Any, prompt: str) -> list[int]:
    """The target's context for a text prompt: the one rule :func:`hsd_torch.generate`,
    :func:`hsd_torch.auditing.first_tokens.audit_generate` and
    :func:`hsd_torch.auditing.sequences.audit_sequences` share.
    ``text`` is the target's :class:`hsd_torch.vocab.text.TokenText`; the ids are its special prefix (a
    BOS), unless the prompt's own ids already begin with it (a chat template's text starting with
    ``<bos>``: no second one, as ``apply_chat_template`` feeds it), then
    ``tokenizer(prompt, add_special_tokens=False)`` (special tokens parsed); an empty prompt with no
    prefix gets the BOS (:meth:`~hsd_torch.vocab.text.TokenText.start`). Never empty; ``ValueError`` when
    there is nothing to condition on or an id falls outside the model's logit columns."""
    ids: list[int] = text.prompt_ids(prompt)
    return ids


def _is_conversation(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(m, Mapping) for m in x)


def _check_text(i: int, p: str) -> None:
    try:
        p.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"prompt {i} ({p!r}) is not text UTF-8 can encode: it has a lone surrogate "
                         f"{p[e.start]!r} at character {e.start} (half of a surrogate pair; decode the text "
                         "it came from with errors='replace', or remove it)") from None


def _check_conversation(i: int, conv: Sequence[Mapping[str, Any]]) -> Conversation:
    out: Conversation = []
    for j, m in enumerate(conv):
        if "role" not in m or "content" not in m:
            raise ValueError(f"prompt {i}, message {j}: a chat message needs a 'role' and a 'content' "
                             f"(as apply_chat_template takes it), got keys {sorted(map(str, m))}")
        if not isinstance(m["role"], str):
            raise TypeError(f"prompt {i}, message {j}: 'role' must be a str, got {type(m['role']).__name__}")
        if isinstance(m["content"], str):
            _check_text(i, m["content"])
        out.append(dict(m))
    return out


def check_prompts(prompts: Any) -> list[str | Conversation]:
    """``prompts`` as a non-empty list whose items are each a str or a conversation (a non-empty
    list of message mappings); a single str or a single conversation is one prompt. ``TypeError``
    for anything else; ``ValueError`` naming the prompt for a lone surrogate (no tokenizer can
    encode it) or a message without a role or content."""
    if isinstance(prompts, str) or _is_conversation(prompts):
        prompts = [prompts]
    elif isinstance(prompts, (bytes, bytearray, Mapping)) or not hasattr(prompts, "__iter__"):
        raise TypeError("prompts must be a str, a conversation (a list of chat messages) or a non-empty list of "
                        f"those, got {type(prompts).__name__}")
    items = list(prompts)
    if not items:
        raise TypeError("prompts must be a str, a conversation or a non-empty list of those, got an empty list")
    out: list[str | Conversation] = []
    for i, p in enumerate(items):
        if isinstance(p, str):
            _check_text(i, p)
            out.append(p)
        elif _is_conversation(p):
            out.append(_check_conversation(i, p))
        else:
            raise TypeError(f"prompt {i} must be a str or a conversation (a non-empty list of chat messages, dicts "
                            f"with 'role' and 'content'), got {type(p).__name__}")
    return out


def _chat(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _render(tokenizer: Any, conv: Conversation, i: int, role: str) -> str:
    try:
        text = tokenizer.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
    except Exception as e:  # a template's own error (e.g. roles that must alternate): say which prompt
        raise ValueError(f"prompt {i}: the {role}'s chat template could not render this conversation: "
                         f"{type(e).__name__}: {e}") from e
    if not isinstance(text, str):
        raise TypeError(f"prompt {i}: the {role}'s apply_chat_template(tokenize=False) returned "
                        f"{type(text).__name__}, not a str")
    _check_text(i, text)
    return text


def render(items: Sequence[str | Conversation], target_tokenizer: Any, drafter_tokenizer: Any = None) -> Prompts:
    """The rows' texts (module docstring). A conversation with a target tokenizer that has no chat
    template is refused (``ValueError``: render the text yourself, transformers would refuse it
    too)."""
    target: list[str] = []
    drafter: list[str] = []
    parsed: list[bool] = []
    for i, p in enumerate(items):
        if isinstance(p, str):
            target.append(p)
            drafter.append(p)
            parsed.append(False)
            continue
        if not _chat(target_tokenizer):
            raise ValueError(f"prompt {i} is a conversation, but the target's tokenizer has no chat template "
                             "(tokenizer.chat_template is None): give the prompt as text, or set a chat template")
        t = _render(target_tokenizer, p, i, "target")
        target.append(t)
        if drafter_tokenizer is not None and _chat(drafter_tokenizer):
            drafter.append(_render(drafter_tokenizer, p, i, "drafter"))
            parsed.append(True)
        else:
            drafter.append(t)
            parsed.append(False)
    return Prompts(target, drafter, parsed)


def from_ids(input_ids: Any, attention_mask: Any, text: Any) -> Prompts:
    """Rows of target ids as prompts (module docstring): ``input_ids`` a 2-D integer tensor or a
    list of lists of ints ``[B, L]``, ``attention_mask`` None (every id counts) or the same shape
    of 0 and 1 with one run of ones per row; ``text`` the target's
    :class:`hsd_torch.vocab.text.TokenText` (ids must be within its ``vocab_size`` logit columns).
    ``TypeError`` / ``ValueError`` naming the row otherwise."""
    rows = _as_rows(input_ids, "input_ids")
    masks = _as_rows(attention_mask, "attention_mask") if attention_mask is not None else None
    out: list[list[int]] = []
    for i, row in enumerate(rows):
        ids = row
        if masks is not None:
            if i >= len(masks) or len(masks[i]) != len(row) or len(masks) != len(rows):
                raise ValueError(f"attention_mask must have input_ids' shape; row {i} differs")
            m = masks[i]
            if any(v not in (0, 1) for v in m):
                raise ValueError(f"attention_mask row {i} has values other than 0 and 1")
            ones = [j for j, v in enumerate(m) if v == 1]
            if ones and ones[-1] - ones[0] + 1 != len(ones):
                raise ValueError(f"attention_mask row {i} has a hole (a 0 between ones): give one run of ones per "
                                 "row (left or right padding), as a batch of prompts has")
            ids = [row[j] for j in ones]
        if not ids:
            raise ValueError(f"input_ids row {i} has no id (its mask is all 0): the target needs at least one id "
                             "to condition on")
        bad = [t for t in ids if not 0 <= t < text.vocab_size]
        if bad:
            raise ValueError(f"input_ids row {i} has id {bad[0]}, outside the target's {text.vocab_size} logit columns")
        out.append(ids)
    decoded = [text.decode(ids).decode("utf-8", errors="replace") for ids in out]
    return Prompts(decoded, decoded, [False] * len(out), target_ids=out)


def _as_rows(x: Any, name: str) -> list[list[int]]:
    """A 2-D integer tensor or a non-empty list of lists of ints as lists (``TypeError`` /
    ``ValueError`` naming ``name``)."""
    import numpy as np
    import torch

    if isinstance(x, torch.Tensor):
        if x.dim() != 2 or x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name} must be a 2-D integer tensor [batch, length], got {x.dim()}-D {x.dtype}")
        rows: list[list[int]] = x.tolist()
    elif isinstance(x, (list, tuple)) and x and all(isinstance(r, (list, tuple)) for r in x):
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for r in x for v in r):
            raise TypeError(f"{name} must hold ints")
        rows = [[int(v) for v in r] for r in x]
    else:
        raise TypeError(f"{name} must be a 2-D integer tensor or a non-empty list of lists of ints, got "
                        f"{type(x).__name__}")
    if not rows:
        raise ValueError(f"{name} has no rows")
    return rows
