"""Build tiny tokenizers (and later models) locally, for tests and quick starts. Fully offline.

- :func:`stdlib_corpus`: a few hundred KB of text from the CPython standard library on this
  machine (deterministic choice of files).
- :func:`train_byte_bpe`: byte-level BPE (the GPT-2 scheme), lossless round trip.
- :func:`train_unigram_byte_fallback`: Unigram + ``Metaspace`` with ``<0xNN>`` byte fallback
  (the SentencePiece scheme), lossless round trip up to the leading space SentencePiece adds.
- :func:`train_bpe_byte_fallback`: BPE + ``▁`` normalizer + byte fallback (the LLaMA scheme).
- :func:`tokenizer_from_strings`: a ``tokenizers.Tokenizer`` whose ids decode to given strings
  (duplicates allowed), for mirroring ``hsd_core`` toy vocabularies.

Trained tokenizers come back as ``PreTrainedTokenizerFast`` with ``<unk>``, ``<s>``, ``</s>``,
``<pad>`` at ids 0..3 (special, out of band). Every tokenizer and model here is a deterministic
function of its arguments (and of the stdlib files of the running Python): the same ids, scores,
merges and weights in every process, whatever ``PYTHONHASHSEED`` or the thread count
(``tests/torch/models/test_tiny_determinism.py`` builds them in subprocesses and compares digests). BPE
training in ``tokenizers`` is deterministic (merges tie-break on pair ids); its Unigram trainer is
not, so the Unigram pieces are trained by :mod:`hsd_torch.models._unigram` instead.
"""

from __future__ import annotations

import functools
import json
import os
import sysconfig
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

SPECIALS: tuple[str, ...] = ("<unk>", "<s>", "</s>", "<pad>")
"""The special tokens of trained tiny tokenizers, ids 0..3: unk, bos, eos, pad."""

_SAMPLE_TEXT = (
    "Unicode: naïve café, Ærøskøbing, 日本語のテキスト, Ελληνικά, русский, emoji 😀🚀👍🏽.\n"
    "\ttabs\tand  double  spaces,\r\nwindows newlines, trailing space \n"
)


def stdlib_corpus(max_bytes: int = 300_000) -> list[str]:
    """Texts (one per file) from the CPython stdlib, ``max_bytes`` UTF-8 bytes in all (about),
    plus one short Unicode sample. Deterministic: files in sorted order from ``Lib/``."""
    root = Path(sysconfig.get_paths().get("stdlib") or os.path.dirname(os.__file__))
    texts = [_SAMPLE_TEXT]
    total = len(_SAMPLE_TEXT.encode())
    for path in sorted(root.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        total += len(text.encode())
        if total >= max_bytes:
            break
    return texts


def _wrap(tok: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    unk, bos, eos, pad = SPECIALS
    cls: Any = PreTrainedTokenizerFast
    return cls(tokenizer_object=tok, unk_token=unk, bos_token=bos,
                                   eos_token=eos, pad_token=pad)


def _byte_pieces() -> list[str]:
    return [f"<0x{b:02X}>" for b in range(256)]


def train_byte_bpe(texts: Iterable[str], vocab_size: int, *, ascii_only: bool = False) -> Any:
    """Byte-level BPE (GPT-2 byte alphabet, ``ByteLevel`` pre-tokenizer and decoder) trained on
    ``texts``; ``vocab_size`` ids in all (4 specials + 256 bytes + merges). Lossless.

    ``ascii_only=True``: trained on the printable ASCII characters of ``texts`` (and newlines and
    tabs) with no initial alphabet and ``<unk>`` for the rest, so it has no token for the other
    bytes (a target lacking bytes a byte-level drafter writes, as SmolLM2 lacks 21 bytes Gemma has:
    such text is :class:`~hsd_torch.vocab.text.Unencodable`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=SPECIALS[0]) if ascii_only else models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if ascii_only:
        keep = set(map(chr, range(32, 127))) | {"\n", "\t"}
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False)
        texts = ["".join(c for c in t if c in keep) for t in texts]
    else:
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts), trainer)
    return _wrap(tok)


def _with_byte_tokens(tok: Any) -> Any:
    """``tok`` with ``<0x00>..<0xFF>`` inserted into its model at ids 4..259 (after the specials,
    as SentencePiece does) and byte fallback on."""
    from tokenizers import Tokenizer

    data = json.loads(tok.to_str())
    model = data["model"]
    if model["type"] == "BPE":
        old = sorted(model["vocab"].items(), key=lambda kv: kv[1])
        pieces = [s for s, _ in old]
        new = pieces[:len(SPECIALS)] + [b for b in _byte_pieces() if b not in model["vocab"]] + pieces[len(SPECIALS):]
        model["vocab"] = {s: i for i, s in enumerate(new)}
    elif model["type"] == "Unigram":
        pieces_scores = model["vocab"]
        low = min(score for _, score in pieces_scores) - 1.0
        have = {s for s, _ in pieces_scores}
        model["vocab"] = pieces_scores[:len(SPECIALS)] + [[b, low] for b in _byte_pieces() if b not in have] \
            + pieces_scores[len(SPECIALS):]
        model["unk_id"] = 0
    else:  # pragma: no cover - internal use only
        raise ValueError(model["type"])
    model["byte_fallback"] = True
    for added in data["added_tokens"]:
        assert added["id"] < len(SPECIALS), added
    return Tokenizer.from_str(json.dumps(data))


def train_unigram_byte_fallback(texts: Iterable[str], vocab_size: int) -> Any:
    """Unigram (SentencePiece style: ``Metaspace`` pre-tokenizer, ``▁`` for spaces, a ``▁``
    prepended to the text) with ``<0xNN>`` byte fallback at ids 4..259; ``vocab_size`` ids in all,
    or a few fewer (the EM drops pieces whose expected count falls below 0.5: 1,997 of 2,000 on
    ``stdlib_corpus(200_000)``). Lossless up to the prepended space.

    The pieces and their log-probabilities come from :func:`hsd_torch.models._unigram.train_unigram`
    (SentencePiece's EM on the Metaspace words, pieces of at most 12 characters, every character
    of the corpus kept), a deterministic function of ``texts`` and ``vocab_size``; ids 260.. are
    the pieces by decreasing score (``tokenizers``' own ``UnigramTrainer`` gives other ids in every
    process: see that module)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from ._unigram import train_unigram

    meta = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    words: dict[str, int] = {}
    for text in texts:
        for word, _ in meta.pre_tokenize_str(text):
            words[word] = words.get(word, 0) + 1
    n_pieces = max(vocab_size - 256 - len(SPECIALS), 1)
    pieces = train_unigram(sorted(words.items()), n_pieces, max_piece_length=12)
    tok = Tokenizer(models.Unigram([(s, 0.0) for s in SPECIALS] + pieces, unk_id=0, byte_fallback=False))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.pre_tokenizer = meta
    # Metaspace before Fuse: after Fuse it would treat the whole text as the first token and drop
    # every space.
    tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="always"),
                                     decoders.ByteFallback(), decoders.Fuse()])
    return _wrap(_with_byte_tokens(tok))


def train_bpe_byte_fallback(texts: Iterable[str], vocab_size: int) -> Any:
    """BPE in the LLaMA style: normalizer ``Prepend("▁")`` + ``Replace(" ", "▁")``, no
    pre-tokenizer, byte fallback (``<0xNN>`` at ids 4..259), decoder ``Replace("▁", " ")``,
    ``ByteFallback``, ``Fuse``, ``Strip(" ", 1, 0)``; about ``vocab_size`` ids in all."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    # Training needs word boundaries; split before each ▁ (the trained model runs without it).
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=max(vocab_size - 256, len(SPECIALS) + 1),
                                  special_tokens=list(SPECIALS), show_progress=False, max_token_length=12)
    tok.train_from_iterator(list(texts), trainer)
    out = _with_byte_tokens(tok)
    out.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    return _wrap(out)


def _alias(s: str) -> str:
    """Another written form of ``s`` that the toy decoder maps back to ``s``: a single ASCII
    character as a ``<0xNN>`` byte token, else every lowercase ASCII letter in upper case."""
    if len(s) == 1 and ord(s) < 128:
        return f"<0x{ord(s):02X}>"
    if any("a" <= c <= "z" for c in s) and not any("A" <= c <= "Z" for c in s):
        return s.upper()
    raise ValueError(f"no second written form for the duplicate token {s!r}")


def tokenizer_from_strings(strings: Sequence[str], eos: str = "<eos>") -> Any:
    """A ``tokenizers.Tokenizer`` (``WordLevel`` model) whose id ``i`` decodes to ``strings[i]``
    and whose id ``len(strings)`` is ``eos`` (a special added token), as ``hsd_core``'s
    ``Vocabulary(strings, eos)`` numbers them.

    Several ids may share a string: the first keeps it; later ones are written as a
    SentencePiece byte token (``<0x61>`` for ``"a"``) or in upper case (``"AB"`` for ``"ab"``)
    and the decoder (``Replace`` upper -> lower for each letter, then ``ByteFallback``, ``Fuse``)
    maps them back. Raises ``ValueError`` for a duplicate that has no such second form, or for
    upper-case letters in ``strings`` (reserved for the aliases).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models

    if any("A" <= c <= "Z" for s in strings for c in s):
        raise ValueError("upper-case ASCII letters are reserved for duplicate aliases")
    written: list[str] = []
    seen: set[str] = set()
    for s in strings:
        w = s if s not in seen else _alias(s)
        if w in written:
            raise ValueError(f"string {s!r} occurs more than twice")
        written.append(w)
        seen.add(s)
    vocab = {w: i for i, w in enumerate(written)}
    vocab[eos] = len(written)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=eos))
    letters = sorted({c for s in strings for c in s if "a" <= c <= "z"})
    tok.decoder = decoders.Sequence(
        [decoders.Replace(c.upper(), c) for c in letters] + [decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(eos, special=True, normalized=False)])
    assert tok.token_to_id(eos) == len(written)
    return tok


# --------------------------------------------------------------------------------------------
# tiny random-init causal LMs (the backend's test models, docs/generate.md)


def _peaked_head(model: Any, head_std: float, seed: int) -> None:
    """Give ``model`` an untied output head with i.i.d. ``N(0, (head_std / sqrt(d))^2)`` weights.

    The head's input is the final norm's output (unit scale per position), so logits have a
    standard deviation of about ``head_std``: laws far from uniform (``head_std = 3`` over 500 ids
    puts roughly a third to a half of the mass on the top token)."""
    import torch

    head = model.get_output_embeddings()
    g = torch.Generator().manual_seed(seed + 1_000_003)
    w = torch.randn(tuple(head.weight.shape), generator=g, dtype=torch.float64) * (head_std / head.weight.shape[1] ** 0.5)
    new = torch.nn.Linear(head.weight.shape[1], head.weight.shape[0], bias=False)
    with torch.no_grad():
        new.weight.copy_(w.to(head.weight.dtype))
    model.set_output_embeddings(new)


def _special_ids(tokenizer: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = getattr(tokenizer, name, None)
        if v is not None:
            out[name] = int(v)
    return out


def _finish(model: Any, tokenizer: Any, head_std: float, seed: int, dtype: Any) -> Any:
    _peaked_head(model, head_std, seed)
    for k, v in _special_ids(tokenizer).items():
        setattr(model.generation_config, k, v)
    model.to(dtype)
    model.eval()
    model.requires_grad_(False)
    return model


def tiny_gpt2(tokenizer: Any, *, seed: int = 0, vocab_size: int | None = None, n_layer: int = 2,
              n_embd: int = 64, n_head: int = 2, n_positions: int = 512, head_std: float = 3.0,
              dtype: Any = None) -> Any:
    """A random-init ``GPT2LMHeadModel`` over ``tokenizer`` with a peaked, untied head.

    ``vocab_size`` (default ``len(tokenizer)``) may exceed the tokenizer: a padded embedding,
    whose extra ids have no text. BOS/EOS/PAD ids come from the tokenizer. The model is in eval
    mode, without gradients, in ``dtype`` (default float32), and a deterministic function of its
    arguments (the global torch RNG is left untouched). About 0.1M parameters plus
    ``2 * vocab_size * n_embd`` at the defaults; built in well under a second.
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    v = len(tokenizer) if vocab_size is None else int(vocab_size)
    if v < len(tokenizer):
        raise ValueError(f"vocab_size {v} is smaller than the tokenizer's {len(tokenizer)} ids")
    cfg = GPT2Config(vocab_size=v, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                     tie_word_embeddings=False, **_special_ids(tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(cfg)
    return _finish(model, tokenizer, head_std, seed, torch.float32 if dtype is None else dtype)


def tiny_llama(tokenizer: Any, *, seed: int = 0, vocab_size: int | None = None, num_hidden_layers: int = 2,
               hidden_size: int = 64, intermediate_size: int = 128, num_attention_heads: int = 4,
               num_key_value_heads: int = 2, max_position_embeddings: int = 512, head_std: float = 3.0,
               dtype: Any = None) -> Any:
    """A random-init ``LlamaForCausalLM`` (RoPE, grouped-query attention) over ``tokenizer`` with
    a peaked, untied head; same conventions as :func:`tiny_gpt2`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return _tiny_rope_lm(LlamaConfig, LlamaForCausalLM, tokenizer, seed, vocab_size, head_std, dtype,
                         num_hidden_layers=num_hidden_layers, hidden_size=hidden_size,
                         intermediate_size=intermediate_size, num_attention_heads=num_attention_heads,
                         num_key_value_heads=num_key_value_heads, max_position_embeddings=max_position_embeddings)


def tiny_qwen2(tokenizer: Any, *, seed: int = 0, vocab_size: int | None = None, num_hidden_layers: int = 2,
               hidden_size: int = 64, intermediate_size: int = 128, num_attention_heads: int = 4,
               num_key_value_heads: int = 2, max_position_embeddings: int = 512, head_std: float = 3.0,
               dtype: Any = None) -> Any:
    """A random-init ``Qwen2ForCausalLM`` (RoPE, grouped-query attention with q/k/v biases) over
    ``tokenizer`` with a peaked, untied head; same conventions as :func:`tiny_gpt2`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return _tiny_rope_lm(Qwen2Config, Qwen2ForCausalLM, tokenizer, seed, vocab_size, head_std, dtype,
                         num_hidden_layers=num_hidden_layers, hidden_size=hidden_size,
                         intermediate_size=intermediate_size, num_attention_heads=num_attention_heads,
                         num_key_value_heads=num_key_value_heads, max_position_embeddings=max_position_embeddings)


def tiny_gemma3(tokenizer: Any, *, seed: int = 0, vocab_size: int | None = None, num_hidden_layers: int = 4,
                sliding_window: int = 8, hidden_size: int = 64, intermediate_size: int = 128,
                num_attention_heads: int = 4, num_key_value_heads: int = 2, head_dim: int = 16,
                max_position_embeddings: int = 512, head_std: float = 3.0, dtype: Any = None) -> Any:
    """A random-init ``Gemma3ForCausalLM`` (text only) with sliding-window attention layers: every
    fourth layer (the third of each four) attends to all positions, the others to the last
    ``sliding_window`` ones, so contexts of a few dozen ids go well past the window (Gemma-3-270M's
    is 512). Same conventions as :func:`tiny_gpt2`."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    types = ["full_attention" if k % 4 == 2 else "sliding_attention" for k in range(num_hidden_layers)]
    return _tiny_rope_lm(Gemma3TextConfig, Gemma3ForCausalLM, tokenizer, seed, vocab_size, head_std, dtype,
                         num_hidden_layers=num_hidden_layers, hidden_size=hidden_size,
                         intermediate_size=intermediate_size, num_attention_heads=num_attention_heads,
                         num_key_value_heads=num_key_value_heads, head_dim=head_dim, sliding_window=sliding_window,
                         max_position_embeddings=max_position_embeddings, layer_types=types)


def _tiny_rope_lm(config_cls: Any, model_cls: Any, tokenizer: Any, seed: int, vocab_size: int | None,
                  head_std: float, dtype: Any, **shape: Any) -> Any:
    """The RoPE model of ``model_cls`` with the given shape (shared by tiny_llama/qwen2/gemma3)."""
    import torch

    v = len(tokenizer) if vocab_size is None else int(vocab_size)
    if v < len(tokenizer):
        raise ValueError(f"vocab_size {v} is smaller than the tokenizer's {len(tokenizer)} ids")
    cfg = config_cls(vocab_size=v, tie_word_embeddings=False, **shape, **_special_ids(tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(cfg)
    return _finish(model, tokenizer, head_std, seed, torch.float32 if dtype is None else dtype)


_TOKENIZERS: dict[tuple[str, int], Any] = {}


def tiny_tokenizer(kind: str, vocab_size: int | None = None, max_bytes: int = 60_000) -> Any:
    """A cached tiny tokenizer trained on ``stdlib_corpus(max_bytes)``: ``kind`` is
    ``"byte_bpe"`` (default 384 ids), ``"unigram"`` (Unigram + byte fallback, about 520),
    ``"bpe_fallback"`` (LLaMA-style BPE + byte fallback, about 448) or ``"ascii_bpe"`` (byte-level
    BPE with tokens for ASCII text only, 300: :func:`train_byte_bpe` with ``ascii_only=True``). The
    sizes differ on purpose (transformers tells tokenizers apart by size). A few seconds for the first call of each."""
    sizes = {"byte_bpe": 384, "unigram": 520, "bpe_fallback": 448, "ascii_bpe": 300}
    trainers: dict[str, Callable[[list[str], int], Any]] = {"byte_bpe": train_byte_bpe, "unigram": train_unigram_byte_fallback,
                "bpe_fallback": train_bpe_byte_fallback,
                "ascii_bpe": functools.partial(train_byte_bpe, ascii_only=True)}
    if kind not in trainers:
        raise ValueError(f"unknown tiny tokenizer kind {kind!r}; one of {sorted(trainers)}")
    size = sizes[kind] if vocab_size is None else int(vocab_size)
    key = (f"{kind}/{max_bytes}", size)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = trainers[kind](stdlib_corpus(max_bytes), size)
    return _TOKENIZERS[key]


def tiny_pair(target_kind: str = "byte_bpe", drafter_kind: str = "unigram", *, seed: int = 0,
              dtype: Any = None) -> tuple[Any, Any, Any, Any]:
    """``(target, target_tokenizer, drafter, drafter_tokenizer)`` for quick starts: a tiny Llama
    target and a tiny GPT-2 drafter with a padded embedding (32 ids wider than its tokenizer)."""
    tt = tiny_tokenizer(target_kind)
    dt = tiny_tokenizer(drafter_kind)
    target = tiny_llama(tt, seed=seed, dtype=dtype)
    drafter = tiny_gpt2(dt, seed=seed + 1, vocab_size=len(dt) + 32, dtype=dtype)
    return target, tt, drafter, dt


def sharpen(model: Any, qk: float = 8.0, embed: float = 3.0) -> Any:
    """Scale a tiny random-init model's query and key projections by ``qk`` and its embeddings by
    ``embed``, in place (returns it): its attention is then peaked, so its law depends on positions
    and on each token of its context as a trained model's does. A random-init model attends almost
    uniformly: moving the positions of its last two tokens by 2 moves its next-token law by TV
    ~0.005, sharpened by ~0.1-0.3 (``bench/zoo.py`` audits position bugs on such a target)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                p.mul_(qk)
            elif "embed" in name:
                p.mul_(embed)
    return model


def save_tiny_pair(out: str | os.PathLike[str], *, seed: int = 0) -> tuple[Path, Path]:
    """Build :func:`tiny_pair` (float32) and ``save_pretrained`` it (models and tokenizers) into
    ``out/target`` and ``out/drafter``; returns the two folders. A few seconds."""
    target, tt, drafter, dt = tiny_pair(seed=seed)
    root = Path(out)
    folders = (root / "target", root / "drafter")
    for folder, model, tok in ((folders[0], target, tt), (folders[1], drafter, dt)):
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
    return folders


def out_problem(out: Path) -> str | None:
    """Why ``python -m hsd_torch.models.tiny --out out`` cannot write ``out/target`` and ``out/drafter``
    (a file in the way, a folder that cannot be created or written); None if it can. Creates the
    two folders (as the command would) and writes and removes an empty probe file in each."""
    for path in (out, out / "target", out / "drafter"):
        if path.exists() and not path.is_dir():
            return f"--out {str(out)!r}: {str(path)!r} is a file; give a folder (created if missing)"
    try:
        for folder in (out / "target", out / "drafter"):
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / ".hsd-write-probe"
            probe.write_bytes(b"")
            probe.unlink()
    except OSError as e:
        return f"--out {str(out)!r} cannot be written ({e.strerror or type(e).__name__}); give a folder you can write"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hsd_torch.models.tiny --out DIR``: write a tiny target/drafter pair to ``DIR``. A
    folder that cannot be written is one ``error:`` line on stderr, exit status 2, before any model
    is built; so is a failure to write (a full disk) while saving."""
    import argparse
    import sys
    import time

    from ..commands.args import seed

    ap = argparse.ArgumentParser(prog="python -m hsd_torch.models.tiny",
                                 description="Build a tiny random-init target (Llama, byte-level BPE) and drafter "
                                             "(GPT-2, Unigram + byte fallback) and save them for hsd generate.")
    ap.add_argument("--out", required=True, metavar="DIR", help="writes DIR/target and DIR/drafter")
    ap.add_argument("--seed", type=seed, default=0, help="default 0; an int >= 0")
    args = ap.parse_args(argv)
    out = Path(args.out)
    problem = out_problem(out)
    if problem is None:
        t0 = time.perf_counter()
        try:
            t, d = save_tiny_pair(out, seed=args.seed)
        except OSError as e:
            why = e.strerror or type(e).__name__
            problem = f"writing to --out {args.out!r} failed ({why}); free space or give another folder"
    if problem is not None:
        print(f"{ap.prog}: error: {problem}", file=sys.stderr)
        return 2
    print(f"target: {t}\ndrafter: {d}\n({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
