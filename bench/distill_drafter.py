"""A tiny drafter for Gemma-3-270M with a tokenizer of its own, distilled from Gemma's own samples.

    HF_HUB_OFFLINE=1 nice -n 10 .venv/bin/python bench/distill_drafter.py            # build (cached)
    HF_HUB_OFFLINE=1 .venv/bin/python bench/generate.py --pair distilled --quick        # benchmark it

What it is, plainly:

- **Seeds** (what the target continues): windows of 4-12 lines from the CPython standard library's
  top-level modules on this machine (code), and docstrings of 300 characters or more from the same
  files (prose), in equal numbers, picked with a seeded generator from sorted files. Held out: the
  benchmark's prompts are HumanEval's (never read here) and the first paragraphs of the docstrings of
  ``json``, ``argparse``, ``textwrap`` and ``statistics`` (``bench/acceptance_real.py``), whose files
  (``json/``, ``argparse.py``, ``textwrap.py``, ``statistics.py``) are not read either.
- **The target's continuations**: Gemma-3-270M (``hsd_torch.models.real``, float32) continues each
  seed with ``--new`` tokens through transformers' ``generate``, in batches of ``--batch``, one batch
  greedy and the next sampled at temperature 1 over the full law (seeded), ``--samples`` seeds in
  all. They are saved as they come (``samples.jsonl``; a rerun resumes).
- **Tokenizer**: a byte-level BPE of ``--vocab`` ids (``hsd_torch.models.tiny.train_byte_bpe``) trained on the
  seeds and continuations: not Gemma's (262,144 ids) nor SmolLM2's.
- **Model**: GPT-2 architecture, ``--layers`` x ``--width`` (defaults 4 x 256, about 4.3M parameters
  with the tied head), trained from scratch (``bench/pair.py``'s ``train``: AdamW, warm-up, cosine;
  ``--steps`` of 16 x 128 tokens) on the seeds followed by their continuations, so that it learns the
  target's law after contexts like the benchmark's. Sequence-level distillation only: the drafter
  sees Gemma's sampled and greedy tokens, never its logits (their vocabularies differ).

It writes the model and tokenizer with ``save_pretrained`` under ``--out`` (default
``.cache/distilled_drafter``, gitignored) and ``build.json``: the settings, the counts (seeds, tokens
sampled, training tokens), the wall time of each part, the training loss, and the drafter's and the
target's forward cost (one token with a KV cache at 64, 1 thread). Deterministic given the machine's
stdlib, torch and the seeds (timings aside); the default budget is about 60-75 minutes on this
project's 2-core machine (the target's samples most of it); ``--fast`` builds a barely trained one
in a minute or two for tests.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import provenance  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / ".cache" / "distilled_drafter"
HELD_OUT = {"json", "argparse.py", "textwrap.py", "statistics.py"}


def stdlib_files() -> list[Path]:
    """The stdlib's top-level modules (sorted), without the held-out ones and the test suites."""
    lib = Path(sysconfig.get_paths().get("stdlib") or os.path.dirname(os.__file__))
    return [p for p in sorted(lib.glob("*.py")) if p.name not in HELD_OUT and not p.name.startswith("test")]


def seeds(n: int, seed: int = 0) -> list[str]:
    """``n`` seeds, alternately code windows and docstrings (module docstring: what and how)."""
    rng = random.Random(seed)
    code: list[str] = []
    prose: list[str] = []
    for path in stdlib_files():
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = text.splitlines(keepends=True)
        for _ in range(5):
            if len(lines) > 20:
                a = rng.randrange(0, len(lines) - 12)
                window = "".join(lines[a:a + rng.randint(4, 12)])
                if window.strip():
                    code.append(window)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 300:
                    prose.append(" ".join(doc.split("\n\n")[0].split()) if rng.random() < 0.5 else doc[:800])
    rng.shuffle(code)
    rng.shuffle(prose)
    out: list[str] = []
    for c, p in zip(code, prose):
        out += [c, p]
    if len(out) < n:
        raise ValueError(f"only {len(out)} seeds in this stdlib, asked for {n}")
    return out[:n]


def sample(out: Path, seed_texts: list[str], *, new: int, batch: int, seed: int, log: Any) -> list[dict[str, Any]]:
    """Gemma's continuations of ``seed_texts`` (``samples.jsonl`` under ``out``, resumed)."""
    import torch

    from hsd_torch.models import real as real_models

    path = out / "samples.jsonl"
    done: list[dict[str, Any]] = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    if len(done) >= len(seed_texts):
        return done[:len(seed_texts)]
    model, tok = real_models.load("gemma-3-270m")
    tok.padding_side = "left"
    t0 = time.perf_counter()
    with torch.inference_mode(), path.open("a") as f:
        for b in range(len(done) // batch, (len(seed_texts) + batch - 1) // batch):
            chunk = seed_texts[b * batch:(b + 1) * batch]
            enc = tok(chunk, return_tensors="pt", padding=True)
            greedy = b % 2 == 0
            torch.manual_seed(seed * 100_003 + b)
            kw: dict[str, Any] = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0,
                                                                         "top_k": 0, "top_p": 1.0}
            gen = model.generate(**enc, max_new_tokens=new, pad_token_id=tok.pad_token_id, **kw)
            for s, row in zip(chunk, gen[:, enc["input_ids"].shape[1]:]):
                rec = {"seed": s, "continuation": tok.decode(row, skip_special_tokens=True),
                       "mode": "greedy" if greedy else "sample", "target_tokens": int((row != tok.pad_token_id).sum())}
                done.append(rec)
                f.write(json.dumps(rec) + "\n")
            f.flush()
            log(f"  samples: batch {b + 1}/{(len(seed_texts) + batch - 1) // batch} "
                f"({time.perf_counter() - t0:.0f} s)")
    return done


def forward_ms(model: Any, vocab: int) -> float:
    """Median milliseconds of one token's forward pass with a KV cache at 64 (``bench/overhead.py``'s
    measure, 30 repeats)."""
    from overhead import one_token_forward

    return 1e3 * one_token_forward(model, vocab)[1]


def build(out: Path, *, samples: int, new: int, batch: int, vocab: int, layers: int, width: int, steps: int,
          seed: int = 0, log: Any = print) -> dict[str, Any]:
    import torch

    import pair as pairmod
    from hsd_torch.models import real as real_models
    from hsd_torch.models.tiny import train_byte_bpe

    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    seed_texts = seeds(samples, seed)
    t0 = time.perf_counter()
    recs = sample(out, seed_texts, new=new, batch=batch, seed=seed, log=log)
    t_sample = time.perf_counter() - t0
    docs = [r["seed"] + r["continuation"] for r in recs]
    t0 = time.perf_counter()
    tok = train_byte_bpe(docs, vocab)
    model = pairmod._gpt2(tok, layers, width, max(1, width // 64), seed)
    data = pairmod._stream(tok, docs)
    log(f"tokenizer {len(tok)} ids; {len(data)} training tokens; drafter "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    losses = pairmod.train(model, data, steps=steps, seed=seed, log=log, name="drafter")
    t_train = time.perf_counter() - t0
    model.save_pretrained(out / "drafter")
    tok.save_pretrained(out / "drafter")
    target, ttok = real_models.load("gemma-3-270m")
    info = {
        "settings": {"samples": samples, "new": new, "batch": batch, "vocab": vocab, "layers": layers,
                     "width": width, "steps": steps, "seed": seed},
        "seeds": {"code": (len(recs) + 1) // 2, "prose": len(recs) // 2},  # seeds() alternates them
        "target_tokens_sampled": sum(r["target_tokens"] for r in recs),
        "greedy_continuations": sum(r["mode"] == "greedy" for r in recs),
        "training_tokens": len(data), "drafter_vocab": len(tok),
        "drafter_params": sum(p.numel() for p in model.parameters()),
        "final_loss": sum(losses[-50:]) / len(losses[-50:]), "first_loss": losses[0],
        "sample_seconds": round(t_sample, 1), "train_seconds": round(t_train, 1),
        "build_seconds": round(time.perf_counter() - t_start, 1),
        "drafter_forward_ms": round(forward_ms(model, len(tok)), 3),
        "target_forward_ms": round(forward_ms(target, len(ttok)), 3),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
    }
    info["cost_ratio"] = round(info["drafter_forward_ms"] / info["target_forward_ms"], 4)
    info.update(provenance())
    (out / "build.json").write_text(json.dumps(info, indent=1))
    log(json.dumps(info))
    return info


def load(out: Path | str = DEFAULT_OUT) -> tuple[Any, Any, dict[str, Any]]:
    """``(drafter, tokenizer, build.json)`` of a build (eval mode, float32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    model = AutoModelForCausalLM.from_pretrained(out / "drafter").eval()
    return model, AutoTokenizer.from_pretrained(out / "drafter"), json.loads((out / "build.json").read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--samples", type=int, default=1280, help="seeds the target continues")
    ap.add_argument("--new", type=int, default=48, help="target tokens per continuation")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fast", action="store_true", help="64 seeds, 8 tokens, 30 steps (tests)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    if args.fast:
        args.samples, args.new, args.batch, args.steps, args.vocab = 64, 8, 32, 30, 512
    build(Path(args.out), samples=args.samples, new=args.new, batch=args.batch, vocab=args.vocab, layers=args.layers,
          width=args.width, steps=args.steps, seed=args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
