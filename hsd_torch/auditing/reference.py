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

**Calls.** One call answers every prefix of a draw: the audits teacher-force a draw with **one
call** (``ids`` its new ids, ``prompt_ids`` its context), never one per position; the first-token
audit calls once per prefix it expands (its tree is built before any draw is read), and a named
context bug once more per draw. A provider with a ``many(pairs)`` method (a list of
``(prompt_ids, ids)`` pairs -> the list of their answers, e.g.
:class:`hsd_torch.engines.vllm_audit.VllmLaws`: one engine batch) gets each teacher-forced batch of
draws as one request. :class:`ProvidedLaw` counts the answers (:attr:`ProvidedLaw.calls`: one per draw
or prefix), the rows answered (:attr:`ProvidedLaw.positions`) and the requests made
(:attr:`ProvidedLaw.requests`), and the reports state them. It also keeps the
log-probability of each forced draw's own ids, so the two-sample test's log-likelihoods of draws the
sequence audit already forced cost no call (:meth:`ProvidedLaw.token_logprobs`).
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
        """How many ``(prompt_ids, ids)`` pairs the provider answered (one per draw forced, one per prefix
        of the first-token tree)."""
        self.positions = 0
        """How many rows (one per prefix) its answers held."""
        self.requests = 0
        """How many times the provider was invoked (fewer than :attr:`calls` with ``many``)."""
        self._many: Any = getattr(provider, "many", None)
        self._own: dict[tuple[int, ...], dict[int, float]] = {}  # forced row -> {position: log p(row[p] | row[:p])}

    def usage(self) -> str:
        """``"N calls (M positions)"``, with ``"in R requests"`` where ``many`` batched them: the use so far."""
        batched = f" in {self.requests} requests" if self.requests != self.calls else ""
        return f"{self.calls} call{'s' if self.calls != 1 else ''} ({self.positions} positions){batched}"

    def rows(self, prompt_ids: Sequence[int], ids: Sequence[int]) -> torch.Tensor:
        """The provider's ``[len(ids), width]`` log-probabilities as float64, checked: the shape, no NaN,
        no +inf, and each row a law (its exponentials sum to 1 within 1e-3: raw log-probabilities, not
        logits or processed laws)."""
        return self.rows_many([(prompt_ids, ids)])[0]

    def rows_many(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[torch.Tensor]:
        """:meth:`rows` of each ``(prompt_ids, ids)`` pair, in order: one request of the provider's
        ``many`` when it has one, else one call per pair."""
        clean = [([int(t) for t in p], [int(t) for t in ids]) for p, ids in pairs]
        if not clean:
            return []
        if callable(self._many):
            self.requests += 1
            outs = list(self._many(clean))
            if len(outs) != len(clean):
                raise ValueError(f"the reference law {self.name}'s many() returned {len(outs)} answers for "
                                 f"{len(clean)} pairs")
        else:
            self.requests += len(clean)
            outs = [self.provider(p, ids) for p, ids in clean]
        self.calls += len(clean)
        self.positions += sum(len(ids) for _, ids in clean)
        return [self._checked(out, len(ids)) for out, (_, ids) in zip(outs, clean)]

    def _checked(self, out: Any, n: int) -> torch.Tensor:
        """One answer for ``n`` ids as float64, checked (:meth:`rows`)."""
        a = np.asarray(out.detach().cpu().numpy() if isinstance(out, torch.Tensor) else out)
        if a.shape != (n, self.width):
            raise ValueError(f"the reference law {self.name} returned shape {a.shape} for {n} ids; expected "
                             f"({n}, {self.width}): one row of raw log-probabilities over the target's {self.width} "
                             "logits per generated id")
        if a.dtype.kind != "f":
            raise ValueError(f"the reference law {self.name} returned {a.dtype} values; expected float log-probabilities")
        t = torch.from_numpy(a.astype(np.float64, copy=False))
        if torch.isnan(t).any() or torch.isposinf(t).any():
            raise ValueError(f"the reference law {self.name} returned NaN or +inf log-probabilities")
        mass = torch.logsumexp(t, dim=-1) if n else torch.zeros(0, dtype=torch.float64)
        if mass.numel() and float((mass.exp() - 1).abs().max()) > 1e-3:
            j = int((mass.exp() - 1).abs().argmax())
            raise ValueError(f"the reference law {self.name}'s row {j} sums to {float(mass[j].exp()):.6g} after exp: "
                             "return raw log-probabilities (log_softmax of the logits), one law per row")
        return t

    def forced(self, rows: Sequence[Sequence[int]], at: Sequence[Sequence[int]]) -> torch.Tensor:
        """Teacher forcing as :func:`hsd_torch.auditing.forcing._forced_logits` does it: ``[sum_i len(at[i]),
        width]``, row ``i``'s law after its first ``at[i][j]`` ids for each ``j`` (``at[i]`` increasing
        positions, each below ``len(rows[i])``), one answer per row (all in one request with ``many``)."""
        out = []
        blocks = self.rows_many([(list(r[:a[0]]), list(r[a[0]:a[-1] + 1])) for r, a in zip(rows, at)])
        for r, a, block in zip(rows, at, blocks):
            pos = list(a)
            lo = pos[0]
            got = block[[p - lo for p in pos]]
            own = [p for p in pos if p < len(r)]
            if own:
                lp = torch.log_softmax(got[:len(own)], dim=-1)[torch.arange(len(own)), torch.tensor([r[p] for p in own])]
                self._own.setdefault(tuple(int(t) for t in r), {}).update(zip(own, lp.tolist()))
            out.append(got)
        return torch.cat(out) if out else torch.zeros((0, self.width), dtype=torch.float64)

    def token_logprobs(self, rows: Sequence[Sequence[int]], at: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """For each row, ``log p(row[p] | row[:p])`` (the provider's raw law, renormalized) at each
        position ``p`` of ``at[i]`` (each below ``len(rows[i])``), float64: from the draws already
        forced (:meth:`forced` keeps these), else one provider call per row still missing."""
        keys = [tuple(int(t) for t in r) for r in rows]
        missing = [i for i, (k, a) in enumerate(zip(keys, at)) if any(p not in self._own.get(k, {}) for p in a)]
        if missing:
            self.forced([rows[i] for i in missing], [at[i] for i in missing])
        return [np.array([self._own[k][p] for p in a], dtype=np.float64) for k, a in zip(keys, at)]

    def next_laws(self, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
        """The raw log-law of the next token after each context (``[len(contexts), width]``): the
        provider's first row for ``ids = [0]`` (a row's law does not depend on the id it scores)."""
        return torch.stack([b[0] for b in self.rows_many([(list(c), [0]) for c in contexts])]) if contexts else \
            torch.zeros((0, self.width), dtype=torch.float64)
