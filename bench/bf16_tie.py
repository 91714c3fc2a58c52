"""Where hsd's greedy and transformers' greedy part under bfloat16, and why (bench/RESULTS.md, the
Qwen2.5-Coder section: "Greedy identity in bfloat16").

    HF_HUB_OFFLINE=1 python bench/bf16_tie.py [--prompt 3] [--new 10]

Runs hsd's AR greedy and ``target.generate(do_sample=False)`` on one of ``bench/generate.py``'s
HumanEval prompts with Qwen2.5-Coder-1.5B-Instruct in bfloat16 (the ``real-qwen`` extra), prints both
outputs, hsd's count of near ties re-decided in float32 and of flips, and at the first position
where the outputs differ: the bfloat16 logits of the top 3 ids and the float32 head's logits for
them over the same forward's final hidden state (what hsd's re-check compares,
docs/generate.md, "Reduced precision"). One thread.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=3, help="index among generate.py's 4 HumanEval prompts")
    ap.add_argument("--new", type=int, default=10)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    import acceptance_real

    import hsd_torch as ht
    from hsd_torch.models import real

    target, tt = real.load("qwen2.5-coder-1.5b-instruct", dtype=torch.bfloat16)
    prompt = acceptance_real.prompts(4, 0)["code"][args.prompt]
    out = ht.generate(target, None, [prompt], target_tokenizer=tt, method="ar", max_new_tokens=args.new,
                      do_sample=False, seed=0)
    ours = list(out.sequences[0])
    x = tt(prompt, return_tensors="pt")
    with torch.inference_mode():
        theirs = target.generate(**x, max_new_tokens=args.new, do_sample=False)[0, x["input_ids"].shape[1]:].tolist()
    print("hsd AR greedy:         ", ours)
    print("transformers generate: ", theirs)
    print("near ties re-decided in float32:", out.near_ties, "of them flipped:", out.tie_flips)
    j = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if j is None:
        print("the outputs are equal")
        return 0
    ctx = torch.cat([x["input_ids"][0], torch.tensor(ours[:j])]).unsqueeze(0)
    with torch.inference_mode():
        o = target(ctx, output_hidden_states=True)
        top = torch.topk(o.logits[0, -1].float(), 3)
        head = target.get_output_embeddings().weight.float() @ o.hidden_states[-1][0, -1].float()
    print(f"first difference at new token {j}: bfloat16 logits {top.values.tolist()} of ids {top.indices.tolist()}; "
          f"float32 head over the same hidden state: {[round(v, 4) for v in head[top.indices].tolist()]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
