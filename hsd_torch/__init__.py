"""hsd_torch: the PyTorch backend of hsd (CPU or CUDA), validated output for output against :mod:`hsd_core`.

* :mod:`hsd_torch.kernels`: batched inverse-CDF sampling, rejection verification (SD, TLI) and
  exact-match verification (SLEM) over ``[batch, positions, vocab]`` tensors with explicit
  uniforms; the same decisions as ``hsd_core`` on the same uniforms.
* :mod:`hsd_torch.vocab`: exact byte strings of Hugging Face tokenizer ids and the drafter/target
  :class:`~hsd_torch.vocab.VocabBridge` (intersection index tensors, additive pushforward).
* :mod:`hsd_torch.tiny`: tiny tokenizers (and models) built locally, for tests and quick starts.
* :func:`hsd_torch.generate`: speculative generation (AR, SD, TLI, SLEM, SLRS) over Hugging Face models,
  batched with KV caches. One file per method under :mod:`hsd_torch.methods` (each a mirror of its
  ``hsd_core.methods`` twin; bounded SLRS's psi in :mod:`hsd_torch.methods.slrs`, its public names in
  :mod:`hsd_torch.slrs`), over shared machinery: :mod:`hsd_torch.rounds` (the round loop),
  :mod:`hsd_torch.runner` (each model's KV cache), :mod:`hsd_torch.laws` (processing, text spaces),
  :mod:`hsd_torch.drafting` and :mod:`hsd_torch.verification`. :class:`hsd_torch.CoreModel` presents a
  model and tokenizer as an ``hsd_core`` model for the mirror tests (:mod:`hsd_torch.mirror`).

Install a CPU torch explicitly first (``pip install torch==2.13.0 --index-url
https://download.pytorch.org/whl/cpu``: without the index, Linux gets the CUDA wheel), then
``pip install -e ".[torch]"``; on a GPU machine bring your own CUDA torch.
"""

from . import kernels, slrs, vocab
from .kernels import Verified, exact_match_verify, rejection_verify, sample
from .vocab import Restricted, VocabBridge, token_bytes
from .generate import GenerateOutput, RowStats, generate
from .mirror import CoreModel

__all__ = [
    "CoreModel", "GenerateOutput", "RowStats", "generate",
    "Restricted", "Verified", "VocabBridge", "exact_match_verify", "kernels", "rejection_verify", "sample",
    "slrs", "token_bytes", "vocab",
]
