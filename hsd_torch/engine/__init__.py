"""The generation engine: :func:`hsd_torch.generate` (:mod:`hsd_torch.engine.entry`), the round loop,
each model's runner, the laws, drafting and verification, the kernels, and what ``generate`` takes
from transformers' conventions (processors, generation config, prompts). The methods themselves are
in :mod:`hsd_torch.methods`."""
