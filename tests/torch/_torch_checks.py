"""Checks shared by the generate suites: a forward-pass counter, a model fingerprint, the
target's own greedy decoding of given ids, the exact law of a one-token SLRS round whose
drafts may propose nothing, and uniforms on a law row's draw boundaries.

Imported as ``from _torch_checks import ...`` (pytest puts this folder on ``sys.path``)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def counting_forwards(*mods: Any) -> Iterator[list[int]]:
    """Counts the forward passes of ``mods`` inside the block in ``count[0]`` (a global pre-hook:
    nothing is written on the models; None entries are skipped)."""
    count = [0]
    watched = {id(m) for m in mods if m is not None}

    def hook(module: Any, args: Any) -> None:
        if id(module) in watched:
            count[0] += 1

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        yield count
    finally:
        handle.remove()


def fingerprint(model: Any) -> str:
    """A digest of everything generate promises not to modify: weights and buffers, requires_grad,
    config, generation config, training mode and the output head's type."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    for name, prm in model.named_parameters():
        h.update(f"{name}:{prm.requires_grad}".encode())
    h.update(model.config.to_json_string().encode())
    h.update(model.generation_config.to_json_string().encode())
    h.update(repr((model.training, type(model.get_output_embeddings()).__name__)).encode())
    return h.hexdigest()


def own_greedy(model: Any, ids: list[int], n: int, pad: int, **kw: Any) -> list[int]:
    """``model.generate(do_sample=False)`` of the context ``ids`` (all attended), ``n`` new tokens at
    most, padding with ``pad``; ``kw`` go to ``generate`` (e.g. ``logits_processor``): the new ids,
    which every method of ``hsd_torch.generate`` must return greedily for that context."""
    x = torch.tensor([ids])
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                             pad_token_id=pad, **kw)
    return [int(i) for i in out[0, len(ids):]]


def holed_round_law(p: torch.Tensor, prop: torch.Tensor, mass: float, divided: bool) -> torch.Tensor:
    """The exact law of the token one round of one-token SLRS emits when a draft proposes nothing
    with probability ``1 - mass`` (the target's own token from ``p`` then) and otherwise proposes
    ``X ~ prop`` (the law given a proposal), verified against ``prop`` (``divided``: the method) or
    against ``mass * prop`` (the lossy variant that forgets to divide); ``proofs/slrs.md``, Lemma 9."""
    ver = prop if divided else mass * prop
    acc = prop * torch.where(ver > 0, torch.clamp(p / ver, max=1.0), torch.ones_like(p))
    res = torch.clamp(p - ver, min=0)
    emitted = acc + (1 - acc.sum()) * res / res.sum()
    return (1 - mass) * p + mass * emitted


def tiny_world_models(toks: dict[str, Any]) -> dict[str, Any]:
    """The tiny world's float64 models over ``toks`` (``byte_bpe``, ``unigram``, ``bpe_fallback``
    tokenizers): the ``models`` fixture of ``tests/torch/conftest.py``, and what
    ``tests/torch/models/test_tiny_determinism.py`` digests in fresh processes."""
    from hsd_torch.models import tiny

    f64 = torch.float64
    return {
        "llama_bpe": tiny.tiny_llama(toks["byte_bpe"], seed=0, dtype=f64),
        "gpt2_uni_pad": tiny.tiny_gpt2(toks["unigram"], seed=1, vocab_size=len(toks["unigram"]) + 32, dtype=f64),
        "gpt2_fb_pad": tiny.tiny_gpt2(toks["bpe_fallback"], seed=2, vocab_size=len(toks["bpe_fallback"]) + 16,
                                      dtype=f64),
        "gpt2_bpe": tiny.tiny_gpt2(toks["byte_bpe"], seed=3, dtype=f64),
    }


def boundary_uniforms(row: Any, g: Any, first: int, extra: int) -> list[float]:
    """Uniforms that sit on a law row's decision boundaries (``row [N]``, non-negative): 0, just below 1,
    1.0 once rounded to float32, the partial sum at each of the first ``first`` positive columns over the
    total and the float32 neighbours of those, then ``extra`` random ones from ``g`` (a NumPy Generator)."""
    import numpy as np

    cs = torch.cumsum(row.double(), dim=-1)
    tot = float(cs[-1])
    out = [0.0, float(np.nextafter(1.0, 0.0)), 1.0 - 2.0 ** -25]
    if tot > 0:
        for c in torch.nonzero(row > 0).squeeze(-1).tolist()[:first]:
            x = np.float32(float(cs[c]) / tot)
            for y in (x, np.nextafter(x, np.float32(0)), np.nextafter(x, np.float32(1))):
                if 0.0 <= float(y) < 1.0:
                    out.append(float(y))
    return out + g.random(extra).tolist()
