"""hsd_torch: the PyTorch backend of hsd (CPU or CUDA), validated against :mod:`hsd_core`.

Not implemented yet: the kernels, vocabulary mapping and generation loops arrive with their own
issue. Install with ``pip install -e ".[torch]"`` (bring your own CUDA torch on a GPU machine).
"""

__all__: list[str] = []
