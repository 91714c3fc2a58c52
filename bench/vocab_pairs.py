"""Intersection sizes of every pair of tokenizers the vocabulary bridge was tested on.

    HF_HUB_OFFLINE=1 python bench/vocab_pairs.py > /tmp/pairs.md

prints Markdown tables (the ones in docs/vocab.md): per tokenizer its size, kind and out-of-band
ids; per unordered pair the number of shared byte strings (EOS not counted), the mapped ids in
each direction (duplicates make them differ) and the build time of the bridge. Real tokenizers
come from hsd_torch.models.real_tokenizers (run tests/torch/fetch_real_tokenizers.sh first); missing ones
are listed and left out. Local ones are trained on hsd_torch.models.tiny.stdlib_corpus(200_000).
"""

from __future__ import annotations

import itertools
import platform
import sys
import time
from typing import Any

import torch

from hsd_torch.models import real_tokenizers as rt
from hsd_torch.models import tiny
from hsd_torch.vocab import VocabBridge, clear_cache, token_bytes


def tokenizers() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, why in rt.available().items():
        if why is None:
            out[name] = rt.load(name)
        else:
            print(f"<!-- {name} unavailable: {why} -->")
    corpus = tiny.stdlib_corpus(200_000)
    out["local byte-BPE 1k"] = tiny.train_byte_bpe(corpus, 1000)
    out["local byte-BPE 3k"] = tiny.train_byte_bpe(corpus, 3000)
    out["local Unigram+bytes 2k"] = tiny.train_unigram_byte_fallback(corpus, 2000)
    out["local SPM-BPE+bytes 2k"] = tiny.train_bpe_byte_fallback(corpus, 2000)
    return out


def main() -> int:
    torch.set_num_threads(1)
    toks = tokenizers()
    print(f"Measured with torch {torch.__version__}, Python {platform.python_version()}, "
          f"{platform.machine()}; build times include computing both byte tables.\n")
    print("| tokenizer | ids | kind | out of band (special, holes) | byte table s |")
    print("|---|---:|---|---:|---:|")
    for name, tok in toks.items():
        clear_cache()
        t0 = time.perf_counter()
        tb = token_bytes(tok)
        took = time.perf_counter() - t0
        print(f"| {name} | {len(tb):,} | {tb.kind} | {sum(b is None for b in tb):,} | {took:.2f} |")
    print()
    print("| target | drafter | shared strings | mapped drafter ids | mapped target ids | build s |")
    print("|---|---|---:|---:|---:|---:|")
    for a, b in itertools.combinations_with_replacement(list(toks), 2):
        clear_cache()
        br = VocabBridge(toks[a], toks[b])
        n_t = int((br.to_drafter >= 0).sum()) - 1
        print(f"| {a} | {b} | {br.shared:,} | {len(br.drafter_ids) - 1:,} | {n_t:,} | {br.build_seconds:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
