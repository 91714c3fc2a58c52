"""Build time of the vocabulary bridge (``hsd_torch.vocab.VocabBridge``) for large vocabularies.

    HF_HUB_OFFLINE=1 python bench/vocab_build.py [--repeats R]

Times a cold build (``clear_cache()`` first; both byte tables, the maps, the invariants) after the
tokenizers are loaded, R times per pair, and prints min / median seconds as a Markdown table
(recorded in bench/RESULTS.md, "Vocabulary bridge build time"): a synthetic byte-level vocabulary
of 150,000 random strings against a copy of itself, and the real tokenizers that are available
(``hsd_torch.models.real_tokenizers``; ``tests/torch/fetch_real_tokenizers.sh`` fetches them).

Speed is measured here, not in the tests: ``tests/torch/vocab/test_vocab.py::test_build_cost_is_per_id_c_calls``
guards the cost by counting calls (no Python function call per id, a few C calls per id), which
does not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def synthetic_byte_level(n: int, seed: int, eos: str = "<|eos|>") -> Any:
    """A byte-level WordLevel tokenizer with ``n`` distinct random byte strings (ids 0..n-1, the
    256 single bytes first) and a special EOS at id n: a stand-in for a 150k real vocabulary that
    needs no package. A deterministic function of ``n``, ``seed`` and ``eos``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from hsd_torch.vocab import byte_level_alphabet

    alpha = list(byte_level_alphabet())
    rng = random.Random(seed)
    toks = dict.fromkeys(alpha)
    while len(toks) < n:
        toks.setdefault("".join(rng.choices(alpha[:200], k=rng.randint(2, 7))))
    vocab = {s: i for i, s in enumerate(toks)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<no-unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([AddedToken(eos, special=True, normalized=False)])
    cls: Any = PreTrainedTokenizerFast
    return cls(tokenizer_object=raw, eos_token=eos)


def time_build(target: Any, drafter: Any, repeats: int) -> list[float]:
    from hsd_torch.vocab import VocabBridge, clear_cache

    out = []
    for _ in range(repeats):
        clear_cache()
        t0 = time.perf_counter()
        VocabBridge(target, drafter)
        out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    import torch

    from hsd_torch.models import real_tokenizers as rt

    torch.set_num_threads(1)
    pairs: list[tuple[str, Any, Any]] = []
    syn = synthetic_byte_level(150_000, 1)
    pairs.append(("synthetic byte-level 150k x copy", syn, synthetic_byte_level(150_000, 1)))
    have = {name for name, why in rt.available().items() if why is None}
    for t, d in (("qwen", "cl100k"), ("qwen", "qwen"), ("o200k", "qwen")):
        if t in have and d in have:
            tt = rt.load(t)
            pairs.append((f"{t} x {d}", tt, tt if t == d else rt.load(d)))
        else:
            print(f"<!-- {t} x {d}: tokenizer unavailable -->")
    print(f"<!-- Python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"{args.repeats} cold builds per pair -->")
    print("| pair | len(tokenizer) | build min / median (s) |")
    print("|---|---|---:|")
    for name, t, d in pairs:
        times = time_build(t, d, args.repeats)
        print(f"| {name} | {len(t):,} x {len(d):,} | {min(times):.2f} / {statistics.median(times):.2f} |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
