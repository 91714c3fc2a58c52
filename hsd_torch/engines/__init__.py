"""Adapters for serving engines that run in their own environments (hsd never imports them):
:mod:`hsd_torch.engines.vllm_audit` drives vLLM through :mod:`hsd_torch.engines.vllm_worker`."""
