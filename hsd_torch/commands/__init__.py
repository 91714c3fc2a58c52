"""What hsd_torch adds to the ``hsd`` command (registered under the ``hsd.commands`` and
``hsd.audit_impls`` entry points): ``hsd generate`` (:mod:`hsd_torch.commands.generate`), ``hsd audit
--impl transformers|hsd_torch|vllm`` (:mod:`hsd_torch.commands.audit`) and engine samples
(:mod:`hsd_torch.commands.engine`), with their shared options (:mod:`hsd_torch.commands.args`)."""
