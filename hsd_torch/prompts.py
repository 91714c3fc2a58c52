"""Prompts as :func:`hsd_torch.generate` takes them: text, or a conversation rendered by each
tokenizer's own chat template.

A prompt is either

- a ``str``: the target's context is ``tokenizer(prompt, add_special_tokens=False)`` after the
  tokenizer's special prefix (:meth:`hsd_torch.text.TokenText.encode_prompt`; a chat template's
  special tokens are its special ids), and the drafter reads the same text as text; or
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

__all__ = ["Prompts", "check_prompts", "render"]

Conversation = list[dict[str, Any]]


@dataclass(frozen=True)
class Prompts:
    """Each row's prompt, rendered: ``target[i]`` the target's text (special tokens parsed);
    ``drafter[i]`` the drafter's text, whose special tokens are parsed when ``drafter_parsed[i]``
    (its own chat template's rendering) and read as text otherwise."""

    target: list[str]
    drafter: list[str]
    drafter_parsed: list[bool]

    @classmethod
    def of_text(cls, texts: Sequence[str]) -> Prompts:
        """Text prompts: both models read the same text (the drafter as text)."""
        return cls(list(texts), list(texts), [False] * len(texts))


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
