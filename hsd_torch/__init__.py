"""hsd_torch: the PyTorch backend of hsd (CPU or CUDA), validated output for output against :mod:`hsd_core`.

* :mod:`hsd_torch.kernels`: batched inverse-CDF sampling, rejection verification (SD, TLI) and
  exact-match verification (SLEM) over ``[batch, positions, vocab]`` tensors with explicit
  uniforms; the same decisions as ``hsd_core`` on the same uniforms.
* :mod:`hsd_torch.vocab`: exact byte strings of Hugging Face tokenizer ids and the drafter/target
  :class:`~hsd_torch.vocab.VocabBridge` (intersection index tensors, additive pushforward).
* :mod:`hsd_torch.tiny`: tiny tokenizers (and models) built locally, for tests and quick starts.

Install a CPU torch explicitly first (``pip install torch==2.13.0``), then ``pip install -e
".[torch]"``; on a GPU machine bring your own CUDA torch.
"""

from . import kernels, vocab
from .kernels import Verified, exact_match_verify, rejection_verify, sample
from .vocab import Restricted, VocabBridge, token_bytes

__all__ = [
    "Restricted", "Verified", "VocabBridge", "exact_match_verify", "kernels", "rejection_verify", "sample",
    "token_bytes", "vocab",
]
