"""A reference law taken from an engine instead of a Hugging Face target: :class:`ProvidedLaw`.

An engine's numerics (bf16, fused kernels, its own processing) differ from transformers' float32
law, so a high-powered audit against transformers can reject a correct engine. A **law provider**
is any callable

    laws(prompt_ids: list[int], ids: list[int]) -> numpy.ndarray of shape [len(ids), V]

returning the engine's RAW next-token log-probabilities (before temperature, top-k, top-p: the
audits apply the claimed processing themselves) at each position of ``ids``: row ``j`` is the law
of ``ids[j]`` given ``prompt_ids + ids[:j]``; ``V`` is the target's logit width (for vLLM: its
full-vocabulary ``prompt_logprobs`` of prompt + continuation). :class:`ProvidedLaw` wraps one for
the audits' teacher forcing (:func:`hsd_torch.auditing.sequences.audit_sequences` and
:func:`hsd_torch.auditing.first_tokens.audit_generate` take it as ``reference=``): it checks every answer's shape and
values and hands the rows on as float64 logits (log-probabilities are logits: the softmax of a row
is the law it gives).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["LawProvider", "ProvidedLaw"]

LawProvider = Callable[[list[int], list[int]], Any]


class ProvidedLaw:
    """A law provider (module docstring) checked against the target's logit ``width``; ``name``
    says in reports which reference it is (e.g. ``"vllm 0.32.0 prompt_logprobs"``)."""

    def __init__(self, provider: LawProvider, width: int, name: str | None = None) -> None:
        if not callable(provider):
            raise TypeError(f"reference must be a callable (prompt_ids, ids) -> [len(ids), V] log-probabilities, got "
                            f"{type(provider).__name__}")
        self.provider, self.width = provider, int(width)
        self.name = name or str(getattr(provider, "__qualname__", "") or type(provider).__name__)
        self.calls = 0

    def rows(self, prompt_ids: Sequence[int], ids: Sequence[int]) -> torch.Tensor:
        """The provider's ``[len(ids), width]`` log-probabilities as float64, checked: the shape, no NaN,
        no +inf, and each row a law (its exponentials sum to 1 within 1e-3: raw log-probabilities, not
        logits or processed laws)."""
        self.calls += 1
        out = self.provider([int(t) for t in prompt_ids], [int(t) for t in ids])
        a = np.asarray(out.detach().cpu().numpy() if isinstance(out, torch.Tensor) else out)
        if a.shape != (len(ids), self.width):
            raise ValueError(f"the reference law {self.name} returned shape {a.shape} for {len(ids)} ids; expected "
                             f"({len(ids)}, {self.width}): one row of raw log-probabilities over the target's {self.width} "
                             "logits per generated id")
        if a.dtype.kind != "f":
            raise ValueError(f"the reference law {self.name} returned {a.dtype} values; expected float log-probabilities")
        t = torch.from_numpy(a.astype(np.float64, copy=False))
        if torch.isnan(t).any() or torch.isposinf(t).any():
            raise ValueError(f"the reference law {self.name} returned NaN or +inf log-probabilities")
        mass = torch.logsumexp(t, dim=-1) if len(ids) else torch.zeros(0, dtype=torch.float64)
        if mass.numel() and float((mass.exp() - 1).abs().max()) > 1e-3:
            j = int((mass.exp() - 1).abs().argmax())
            raise ValueError(f"the reference law {self.name}'s row {j} sums to {float(mass[j].exp()):.6g} after exp: "
                             "return raw log-probabilities (log_softmax of the logits), one law per row")
        return t

    def forced(self, rows: Sequence[Sequence[int]], at: Sequence[Sequence[int]]) -> torch.Tensor:
        """Teacher forcing as :func:`hsd_torch.auditing.forcing._forced_logits` does it: ``[sum_i len(at[i]),
        width]``, row ``i``'s law after its first ``at[i][j]`` ids for each ``j`` (``at[i]`` increasing
        positions, each below ``len(rows[i])``), one provider call per row."""
        out = []
        for r, a in zip(rows, at):
            pos = list(a)
            lo = pos[0]
            block = self.rows(list(r[:lo]), list(r[lo:pos[-1] + 1]))
            out.append(block[[p - lo for p in pos]])
        return torch.cat(out) if out else torch.zeros((0, self.width), dtype=torch.float64)

    def next_laws(self, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
        """The raw log-law of the next token after each context (``[len(contexts), width]``): the
        provider's first row for ``ids = [0]`` (a row's law does not depend on the id it scores)."""
        return torch.stack([self.rows(list(c), [0])[0] for c in contexts]) if contexts else \
            torch.zeros((0, self.width), dtype=torch.float64)
