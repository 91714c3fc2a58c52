"""The audits of a sampler against the target's own law: the first tokens
(:mod:`hsd_torch.auditing.first_tokens`), whole sequences, teacher-forced
(:mod:`hsd_torch.auditing.sequences`, with text samplers in :mod:`hsd_torch.auditing.text_sequences`),
recorded engine samples (:mod:`hsd_torch.auditing.samples`), the reference law they test against, and
the zoo of real-world speculative-decoding bugs they must catch (:mod:`hsd_torch.auditing.variants`)."""
