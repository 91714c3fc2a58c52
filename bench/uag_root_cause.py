"""Experiments behind the root causes in docs/auditing-transformers.md: transformers' universal
speculative decoding (``do_sample=True``, different tokenizers) on the tiny pair of
``bench/audit_transformers.py``.

    python bench/uag_root_cause.py [--draws M] [--patched] [--orders K] [--top-k K] [--real] [--prompt TEXT]

A. Column order: which target id a draft from pruned head column j becomes (``get_target_ids``)
   and which target id column j's logit is written to (``get_target_logits``), by calling both.
B. Laws of the first round (one draft, then the target's bonus / residual token): the law the
   drafts are drawn from (the assistant's processed scores pushed through ``get_target_ids``), the
   q the acceptance test uses (softmax of ``get_target_logits``), the target's p, and the exact
   law of the first new token that follows; then M instrumented ``generate`` calls: how often each
   target id was drafted and emitted, against those laws.
C. The translator cache: a second, fresh assistant with the same tokenizer objects.
D. (``--orders K``) the unpatched TV over K random column orders, and the audit's misses on the
   lowest-TV 1% of them (n=1000, positions=1: the size of the CI test).
E. ``max_new_tokens=1``: how many calls draft at all (the last new token is never drafted).

``--patched`` installs ``bench/transformers_uag_patch.py`` first; ``--top-k K`` samples with top-k K
in B (default 0: the full vocabulary). ``--real``: the real pair instead (SmolLM2-135M-Instruct
target, Gemma-3-270M assistant, ``hsd_torch.models.real``), parts A and B only, and in B where the
draft law, the acceptance test's q and the target's p put their mass: why the installed sampler's
permuted q leaves no trace at top-k 8 there (docs/auditing-transformers.md, "The real pair").
"""

from __future__ import annotations

import os
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from transformers.generation import candidate_generator as cg

from hsd_torch.models import tiny

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformers_uag_patch  # noqa: E402

PROMPT = sys.argv[sys.argv.index("--prompt") + 1] if "--prompt" in sys.argv else "def foo(x):\n"


REAL = "--real" in sys.argv


def fresh_drafter(dt: Any) -> Any:
    """A fresh assistant (building a pruning translator prunes its head in place)."""
    if REAL:
        from hsd_torch.models import real as real_models

        return real_models.load("gemma-3-270m")[0]
    return tiny.tiny_gpt2(dt, seed=1)


def fresh_pair() -> tuple[Any, Any, Any, Any]:
    if REAL:
        from hsd_torch.models import real as real_models

        target, tt = real_models.load("smollm2-135m-instruct")
        drafter, dt = real_models.load("gemma-3-270m")
        return target, tt, drafter, dt
    target, tt, _, dt = tiny.tiny_pair()
    return target, tt, fresh_drafter(dt), dt


def generate(target: Any, tt: Any, drafter: Any, dt: Any, seed: int, top_k: int = 0, new: int = 2) -> list[int]:
    torch.manual_seed(seed)
    x = tt(PROMPT, return_tensors="pt")
    with torch.inference_mode():
        out = target.generate(**x, assistant_model=drafter, tokenizer=tt, assistant_tokenizer=dt, max_new_tokens=new,
                              do_sample=True, temperature=1.0, top_k=top_k, top_p=1.0)
    return [int(t) for t in out[0, x["input_ids"].shape[1]:]]


def tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


def null_share(law: np.ndarray, m: int, observed: float, rng: np.random.Generator) -> str:
    """How often m draws from ``law`` itself show a plug-in TV >= ``observed`` (400 simulations)."""
    law = law / law.sum()
    sims = 0.5 * np.abs(rng.multinomial(m, law, size=400) / m - law).sum(axis=1)
    return f"{float(np.mean(sims >= observed)):.0%}"


class Recorder:
    """Wraps UniversalSpeculativeDecodingGenerator.get_candidates / _generate_candidates (class level)
    to record, per first round: the assistant's scores (the law its draft was sampled from), the
    drafted target id and the logits handed to the acceptance test."""

    def __init__(self) -> None:
        self.rounds: list[dict[str, Any]] = []
        self._gen = cg.UniversalSpeculativeDecodingGenerator._generate_candidates
        self._get = cg.UniversalSpeculativeDecodingGenerator.get_candidates

    def __enter__(self) -> Recorder:
        rec, gen, get = self, self._gen, self._get

        def _generate_candidates(self: Any, args: dict[str, Any]) -> Any:
            ids, logits = gen(self, args)
            rec._scores = logits.detach().clone()
            return ids, logits

        def get_candidates(self: Any, input_ids: torch.Tensor, **kw: Any) -> Any:
            rec._scores = None
            ids, logits = get(self, input_ids, **kw)
            if logits is not None and rec._scores is not None:
                rec.rounds.append({"prompt_len": int(input_ids.shape[1]),
                                   "scores": rec._scores[0].double().numpy(),
                                   "draft": [int(t) for t in ids[0, input_ids.shape[1]:]],
                                   "q_logits": logits[0].double().numpy(),
                                   "translator": self._atm_translator})
            return ids, logits

        cg.UniversalSpeculativeDecodingGenerator._generate_candidates = _generate_candidates  # type: ignore[method-assign]
        cg.UniversalSpeculativeDecodingGenerator.get_candidates = get_candidates  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        cg.UniversalSpeculativeDecodingGenerator._generate_candidates = self._gen  # type: ignore[method-assign]
        cg.UniversalSpeculativeDecodingGenerator.get_candidates = self._get  # type: ignore[method-assign]


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    out: np.ndarray = e / e.sum()
    return out


def column_agreement(tt: Any, dt: Any, vsize: int, drafter: Any) -> tuple[int, int, torch.Tensor, torch.Tensor, Any]:
    """Build a pruning translator for ``drafter`` and call its own methods: for each pruned column j,
    the target id a draft from it becomes (``get_target_ids``) and the target id its logit is
    written to (``get_target_logits``); returns (columns that agree, columns, both maps, translator)."""
    tr = cg.AssistantToTargetTranslator(tt, dt, vsize, assistant_model=drafter, assistant_prune_lm_head=True)
    cols = int(tr.assistant_overlap_token_ids.shape[0])
    empty = torch.zeros((1, 0), dtype=torch.long)
    as_ids = tr.get_target_ids(empty, empty, torch.arange(cols).view(1, cols))[0]
    placed = tr.get_target_logits(torch.arange(cols, dtype=torch.float32).view(1, 1, cols))[0, 0]
    logit_at = torch.full((cols,), -1, dtype=torch.long)
    finite = torch.isfinite(placed)
    logit_at[placed[finite].long()] = torch.nonzero(finite).flatten()
    return int((as_ids == logit_at).sum()), cols, as_ids, logit_at, tr


def first_token_law(p: np.ndarray, d: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Exact law of the first new token of a round with one draft from ``d``, accepted with
    probability min(1, p/q), else a token from norm((p - q)+) (``_speculative_sampling``)."""
    # p/q as torch computes it: q = 0 gives inf (accepted) when p > 0 and nan (rejected) when p = 0
    acc = np.where(q > 0, np.minimum(1.0, np.divide(p, q, out=np.zeros_like(p), where=q > 0)), (p > 0) * 1.0)
    keep = d * acc
    resid = np.clip(p - q, 0, None)
    out: np.ndarray = keep + (1 - keep.sum()) * resid / resid.sum()
    return out


class LawSampler:
    """sample_fn(prompt, seed) drawing one token from a fixed law (numpy), for the order study."""

    def __init__(self, law: np.ndarray) -> None:
        self.law = law / law.sum()

    def __call__(self, prompt: str, seed: int) -> list[int]:
        return [int(np.random.default_rng(seed).choice(len(self.law), p=self.law))]


def order_study(target: Any, tt: Any, p: np.ndarray, col_law: np.ndarray, col_to_target: np.ndarray,
                law_now: np.ndarray, k: int, n: int = 1000, seeds: int = 4) -> None:
    """The unpatched TV depends on get_vocab()'s hash order, which changes from process to process:
    the exact first-token TV over k random column orders (this process's laws), and how often the
    audit at n draws, positions=1, misses the lowest-TV 1% of them."""
    from hsd_torch.auditing.first_tokens import audit_generate

    rng = np.random.default_rng(0)
    d = np.zeros(len(p))
    np.add.at(d, col_to_target, col_law)
    tvs, laws = [], []
    for _ in range(k):
        q = np.zeros(len(p))
        q[rng.permutation(col_to_target)] = col_law     # column j's logit written to a random overlap target id
        laws.append(first_token_law(p, d, q))
        tvs.append(tv(laws[-1], p))
    arr = np.array(tvs)
    low = np.argsort(arr)[:max(1, k // 100)]
    missed = sum(audit_generate(LawSampler(laws[i]), target, tt, PROMPT, n=n, positions=1, alpha=1e-3,
                                seed=s).verdict != "lossy" for i in low for s in range(seeds))
    print(f"\nD. {k} random column orders: exact first-token TV min {arr.min():.3f}, 1% quantile "
          f"{np.quantile(arr, 0.01):.3f}, median {np.median(arr):.3f}, max {arr.max():.3f} (this process: "
          f"{tv(law_now, p):.3f})")
    print(f"   audit at n={n}, positions=1, alpha 1e-3 on the lowest-TV {len(low)} orders (TV {arr[low].min():.3f} to "
          f"{arr[low].max():.3f}), {seeds} seeds each: not flagged lossy {missed} of {len(low) * seeds}")


def main() -> None:
    draws = int(sys.argv[sys.argv.index("--draws") + 1]) if "--draws" in sys.argv else 3000
    patched = "--patched" in sys.argv
    top_k = int(sys.argv[sys.argv.index("--top-k") + 1]) if "--top-k" in sys.argv else 0
    orders = int(sys.argv[sys.argv.index("--orders") + 1]) if "--orders" in sys.argv else 0
    torch.set_num_threads(1)
    if patched:
        transformers_uag_patch.apply_patch()
    print(f"transformers {__import__('transformers').__version__}; top_k {top_k}; "
          f"{'PATCHED (bench/transformers_uag_patch.py)' if patched else 'unpatched'}; prompt {PROMPT!r}")

    # A. column order, by calling the translator's own methods
    target, tt, drafter, dt = fresh_pair()
    vsize = target.config.get_text_config().vocab_size
    agree, cols, as_ids, logit_at, tr = column_agreement(tt, dt, vsize, drafter)
    ov = tr.assistant_overlap_token_ids
    print(f"\nA. pruned assistant head: {cols} columns (the vocabulary intersection); assistant_overlap_token_ids "
          f"ascending: {bool((ov[1:] > ov[:-1]).all())}")
    print(f"   columns whose logit is written to the target id their drafts become: {agree} of {cols}")
    for j in range(3):
        a = int(ov[j])
        print(f"   column {j}: assistant id {a} {dt.convert_ids_to_tokens(a)!r} -> drafts become target "
              f"{int(as_ids[j])} {tt.convert_ids_to_tokens(int(as_ids[j]))!r}; its logit is written to target "
              f"{int(logit_at[j])} {tt.convert_ids_to_tokens(int(logit_at[j]))!r}")
    # the same with the assistant tokenizer's get_vocab() in ascending id order (instance attribute, removed after)
    vocab = dt.get_vocab()
    dt.get_vocab = lambda: dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    try:
        agree_sorted = column_agreement(tt, dt, vsize, fresh_drafter(dt))[0]
    finally:
        del dt.get_vocab
    print(f"   the same with get_vocab() in ascending id order: {agree_sorted} of {cols}")

    # B. laws of the first round, from instrumented generate calls
    target, tt, drafter, dt = fresh_pair()
    first: list[int] = []
    drafted: list[int] = []
    with Recorder() as rec:
        for s in range(draws):
            first.append(generate(target, tt, drafter, dt, s, top_k)[0])
    r0 = rec.rounds[0]
    plen = r0["prompt_len"]
    rounds = [r for r in rec.rounds if r["prompt_len"] == plen]   # first rounds (second rounds have longer inputs)
    drafted = [r["draft"][0] for r in rounds]
    same = max(float(np.abs(softmax(r["scores"][0]) - softmax(r0["scores"][0])).max()) for r in rounds)
    trans = r0["translator"]
    col_law = softmax(r0["scores"][0])                  # the assistant's processed law over its pruned columns
    col_to_target = trans._assistant_to_target_input_ids[trans.assistant_overlap_token_ids].numpy()
    d = np.zeros(vsize)
    np.add.at(d, col_to_target, col_law)                # law of the drafted target id
    q = softmax(r0["q_logits"][0])                      # the q of the acceptance test
    x = tt(PROMPT, return_tensors="pt")
    with torch.inference_mode():
        logits = target(**x).logits[0, -1].float()      # as _assisted_decoding: float32
    if top_k:                                           # TopKLogitsWarper: keep logits >= the k-th largest
        logits = logits.masked_fill(logits < torch.topk(logits, top_k).values[-1], float("-inf"))
    p = torch.softmax(logits, -1).double().numpy()
    law = first_token_law(p, d, q)                      # exact law of the first new token (one draft per round)
    keep = d * np.where(q > 0, np.minimum(1.0, np.divide(p, q, out=np.zeros_like(p), where=q > 0)), (p > 0) * 1.0)
    rng = np.random.default_rng(0)
    emp_d = np.bincount(drafted, minlength=vsize) / len(drafted)
    emp_f = np.bincount(first, minlength=vsize) / len(first)
    print(f"\nB. first round, {len(rounds)} instrumented draws (assistant's law identical across draws up to {same:.1e})")
    print(f"   TV(law the drafts are drawn from, q of the acceptance test) = {tv(d, q):.2g}")
    print(f"   drafted target ids: empirical TV to the draft law {tv(emp_d, d):.4f} (draws from that law show as much "
          f"in {null_share(d, len(drafted), tv(emp_d, d), rng)} of simulations), to q {tv(emp_d, q):.4f} "
          f"({null_share(q, len(drafted), tv(emp_d, q), rng)})")
    print(f"   exact law of the first new token: TV to the target's p = {tv(law, p):.2g}; "
          f"acceptance probability {keep.sum():.4f}")
    print(f"   emitted first tokens: empirical TV to that law {tv(emp_f, law):.4f} "
          f"({null_share(law, len(first), tv(emp_f, law), rng)}), to p {tv(emp_f, p):.4f} "
          f"({null_share(p, len(first), tv(emp_f, p), rng)})")
    worst = np.argsort(-(law - p))[:3]
    print("   most over-produced first tokens (exact law vs p): " + ", ".join(
        f"{int(t)} {tt.convert_ids_to_tokens(int(t))!r} {law[t]:.4f} vs {p[t]:.4f}" for t in worst))
    support = p > 0
    print(f"   mass on the target's support ({int(support.sum())} ids): draft law {d[support].sum():.4g}, "
          f"q of the acceptance test {q[support].sum():.4g}; exact law with q = the draft law (the patch): TV to "
          f"p {tv(first_token_law(p, d, d), p):.2g}")
    if REAL:
        return

    # C. the translator cache: B's generate calls built a translator for B's assistant, keyed by the two
    # tokenizer objects (the same objects here: hsd_torch.models.tiny caches its tokenizers); now a fresh assistant
    tr_first = cg.AssistantVocabTranslatorCache.get_translator(tt, dt, vsize, assistant_model=drafter,
                                                               assistant_prune_lm_head=True)
    fresh = tiny.tiny_gpt2(dt, seed=1)
    head_before = f"{type(fresh.get_output_embeddings()).__name__} with {fresh.get_output_embeddings().weight.shape[0]} rows"
    tr_fresh = cg.AssistantVocabTranslatorCache.get_translator(tt, dt, vsize, assistant_model=fresh,
                                                               assistant_prune_lm_head=True)
    head = fresh.get_output_embeddings()
    rows = head.pruned_lm_head.weight.shape[0] if hasattr(head, "pruned_lm_head") else head.weight.shape[0]
    print(f"\nC. a second, fresh assistant (head {head_before}), same tokenizer objects: gets the first "
          f"assistant's translator: {tr_fresh is tr_first}; its head after get_translator: {type(head).__name__} "
          f"with {rows} rows; the translator maps {int(tr_fresh.assistant_overlap_token_ids.shape[0])} columns")
    errors: dict[str, int] = {}
    ok = 0
    for s in range(20):
        try:
            generate(target, tt, fresh, dt, s)
            ok += 1
        except Exception as e:  # noqa: BLE001 - we count what transformers raises
            line = str(e).splitlines()[0]
            key = f"{type(e).__name__}: " + (line.split(" is out of bounds")[0].rsplit(" ", 1)[0] + " N is out of bounds"
                                              + line.split(" is out of bounds")[1] if "out of bounds" in line else line[:120])
            errors[key] = errors.get(key, 0) + 1
    print(f"   20 sampled generate calls with it: {ok} ran; errors: {errors or 'none'}")
    generate(target, tt, drafter, dt, 0)
    print("   the first assistant still runs")
    # E. the last new token is never drafted: with max_new_tokens=1 UAG samples the target alone
    with Recorder() as rec1:
        for s in range(20):
            generate(target, tt, drafter, dt, s, new=1)
    print(f"\nE. max_new_tokens=1: first rounds with a draft in 20 sampled calls: {len(rec1.rounds)} "
          f"(max_new_tokens=2: {len(rounds[:20])} of the first 20 in B)")
    if orders:
        order_study(target, tt, p, col_law, col_to_target, law, orders)


if __name__ == "__main__":
    main()
