"""Reduced precision in ``generate``: the ``dtype`` argument, and greedy decisions that do not hang
on the rounding of one forward pass.

Greedy under bfloat16 or float16. A model in reduced precision computes its logits in that precision,
and two forward passes that differ only in how many positions they hold (AR's one position against
a verification pass over a context and four drafts) round differently: the logits of one position
differ by a few units in the last place (a bfloat16 logit near 20 moves in steps of 0.125, and two
ids often tie exactly). An argmax between near-equal logits can then differ between AR and a
speculative method, although both are exact for the law their own forward computed. So at every
verified position of a greedy run with a reduced-precision target, :class:`NearTies` takes the
final hidden state the forward computed (the head's input, ``hidden_states[-1]``), and where
several ids come within ``tau`` of the top logit (``tau = 2**-4 * max(|top|, 1)``, about 8 to 16
units in the last place of a bfloat16 logit) it recomputes those ids' logits in float32 from that
hidden state and the head's weights, and decides among them in float32. What is left to differ is
the rounding inside the forward before the head (the hidden state), which moves the float32
logits far less; those positions are counted (``GenerateOutput.near_ties``, and ``tie_flips`` where the
float32 decision differs from the reduced-precision one) and the contract in docs/generate.md
says what is promised. Sampling is unchanged: its law is the float32 softmax of the logits of the
verification forward that computed each position (``hsd_torch.engine.laws``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["REDUCED", "NearTies", "as_dtype", "check_model_dtype", "model_dtype", "nan_hint"]

_NAMES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16, "fp64": torch.float64, "float64": torch.float64}
REDUCED = (torch.bfloat16, torch.float16)

TAU = 2.0 ** -4
"""Candidates of the float32 re-check: ids whose logit is within ``TAU * max(|top|, 1)`` of the top."""

MAX_CANDIDATES = 64
"""A position with more candidates than this is not re-checked (a flat row, such as the zeros of a
row not fed this round, is not a near tie between a few ids)."""


def as_dtype(value: Any) -> torch.dtype | None:
    """``generate``'s ``dtype``: None, a floating ``torch.dtype`` or one of the names "fp32",
    "float32", "bf16", "bfloat16", "fp16", "float16", "fp64", "float64"; ``ValueError`` otherwise."""
    if value is None:
        return None
    if isinstance(value, torch.dtype) and value in _NAMES.values():
        return value
    if isinstance(value, str) and value.lower() in _NAMES:
        return _NAMES[value.lower()]
    raise ValueError(f"dtype must be None, torch.float32, torch.bfloat16, torch.float16, torch.float64 or one of "
                     f"{', '.join(map(repr, _NAMES))}, got {value!r}")


def model_dtype(model: Any) -> torch.dtype:
    """The dtype of a model's floating parameters (the first one's; float32 if it has none)."""
    for p in model.parameters():
        if p.dtype.is_floating_point:
            dt: torch.dtype = p.dtype
            return dt
    return torch.float32


def check_model_dtype(model: Any, role: str, dtype: torch.dtype | None) -> None:
    """``ValueError`` when ``dtype`` is given and some floating parameter of ``model`` is in another
    dtype (generate never converts the models it is given: load them in the dtype asked)."""
    if dtype is None:
        return
    other = sorted({str(p.dtype) for p in model.parameters() if p.dtype.is_floating_point and p.dtype != dtype})
    if other:
        raise ValueError(f"the {role}'s weights are {', '.join(other)}, not the dtype={dtype} asked: load it in that dtype "
                         f"(from_pretrained(..., dtype={dtype}), real_models.load(name, dtype={dtype})) or pass "
                         f"{role}.to({dtype}); generate never converts the models it is given")


def nan_hint(model: Any) -> str:
    """What to add to a NaN error for ``model``: for a float16 model, that float16's range ends at
    65504 (Gemma's activations pass it) and bfloat16 or float32 do not overflow there."""
    if model_dtype(model) == torch.float16:
        return ("; the model runs in float16, whose range ends at 65504 (Gemma's activations overflow it): load it in "
                "torch.bfloat16 or torch.float32")
    return ""


class NearTies:
    """The float32 re-check of greedy decisions between near-equal logits of a reduced-precision
    model (module docstring). ``head``: the model's output embedding (a linear map; its weight
    ``[V, H]`` and bias are read, not changed); ``softcap``: the config's
    ``final_logit_softcapping`` (Gemma 2), applied as the model applies it."""

    def __init__(self, model: Any) -> None:
        head = model.get_output_embeddings()
        self.weight: Tensor = head.weight
        self.bias: Tensor | None = getattr(head, "bias", None)
        cap = getattr(model.config, "final_logit_softcapping", None)
        self.softcap = float(cap) if cap else None
        self.scale = getattr(model.config, "logit_scale", None)  # Cohere's, a factor on the logits
        self.usable = not isinstance(self.scale, (int, float)) or self.scale == 1

    def apply(self, logits: Tensor, hidden: Tensor) -> tuple[Tensor, list[int], list[int]]:
        """``logits [B, W, V]`` (reduced precision) as float32, with the near-tied ids of each
        position replaced by their float32 logits from ``hidden [B, W, H]`` (the head's input at
        the same positions); and per row the number of positions re-checked and of those whose
        argmax (ties to the lowest id) changed."""
        x = logits.float()
        b, w = x.shape[0], x.shape[1]
        top = x.max(dim=-1).values
        tau = TAU * top.abs().clamp_min(1.0)
        cand = x >= (top - tau).unsqueeze(-1)
        count = cand.sum(dim=-1)
        tied = (count >= 2) & (count <= MAX_CANDIDATES) & torch.isfinite(top)
        checked, flips = [0] * b, [0] * b
        if not self.usable or not bool(tied.any()):
            return x, checked, flips
        cand &= tied.unsqueeze(-1)
        rows, pos, ids = cand.nonzero(as_tuple=True)
        before = x.argmax(dim=-1)
        h = hidden[rows, pos].float()
        vals = (h * self.weight[ids].float()).sum(dim=-1)
        if self.bias is not None:
            vals = vals + self.bias[ids].float()
        if self.softcap is not None:
            vals = torch.tanh(vals / self.softcap) * self.softcap
        x[rows, pos, ids] = vals
        after = x.argmax(dim=-1)
        for r, p in tied.nonzero().tolist():
            checked[r] += 1
            flips[r] += int(before[r, p] != after[r, p])
        return x, checked, flips
