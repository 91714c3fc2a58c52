"""Tokenizers without byte fallback (WordPiece, BPE with a whitespace pre-tokenizer) once passed the
up-front checks and crashed mid-generation (``no token for the byte 0xc8``) on ASCII prompts: they
are supported or refused up front.

Supported (except a WordPiece decoder with ``cleanup``, which rewrites spaces across tokens, so no
token has bytes of its own: refused before any forward pass, naming the reason): a text such a
tokenizer cannot encode is never proposed (``hsd_torch.vocab.text.Unencodable``:
SLEM proposes no candidate, one-token SLRS maps the drafter id to no target id, a drafter's context
leaves the bytes out). Shown here on both kinds, each as the drafter and as the target, on ASCII
prompts and on a prompt with characters outside their alphabets: greedy output is the target's own
for every method, and the sampled first two new tokens follow the target's law (N = 2,000 per
method, top-k 8, alpha 1e-3; the audit states the TV it detects with power 0.99, about 0.13).
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_torch import generate  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch.auditing.first_tokens import audit_generate  # noqa: E402
from hsd_torch.models.mirror import target_greedy  # noqa: E402

torch.set_num_threads(1)
F64 = torch.float64
PROMPTS = ["def foo(x):\n", "Hello world", "naïve ☃ café"]
METHODS = [("ar", {}), ("tli", {}), ("slem", {}), ("slrs", {"lookahead": 1}),
           ("slrs", {"lookahead": 2, "proposal_map": "longest_prefix", "min_path_prob": 0.05})]


def _train(kind: str, cleanup: bool = False) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = tiny.stdlib_corpus(60_000)
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    if kind == "wordpiece":
        tk = Tokenizer(models.WordPiece(unk_token="<unk>"))
        tk.decoder = decoders.WordPiece(cleanup=cleanup)
        trainer: Any = trainers.WordPieceTrainer(vocab_size=600, special_tokens=specials)
    else:  # BPE over whitespace-split words
        tk = Tokenizer(models.BPE(unk_token="<unk>"))
        tk.decoder = decoders.BPEDecoder()
        trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials)
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.train_from_iterator(texts, trainer)
    return tiny._wrap(tk)


@pytest.fixture(scope="module", params=["wordpiece", "bpe_whitespace"])
def world(request: pytest.FixtureRequest) -> dict[str, Any]:
    nofb = _train(request.param)
    tb = tiny.tiny_tokenizer("byte_bpe")
    assert nofb("☃")["input_ids"] == [nofb.unk_token_id]  # no byte fallback: the snowman is <unk>
    return {"kind": request.param, "nofb": nofb, "tb": tb,
            "t_byte": tiny.tiny_llama(tb, seed=0, dtype=F64), "d_nofb": tiny.tiny_gpt2(nofb, seed=1, dtype=F64),
            "t_nofb": tiny.tiny_llama(nofb, seed=2, dtype=F64), "d_byte": tiny.tiny_gpt2(tb, seed=3, dtype=F64)}


@pytest.mark.parametrize("direction", ["nofb-drafter", "nofb-target"])
@pytest.mark.parametrize("method,extra", METHODS, ids=[f"{m}-{len(e)}" for m, e in METHODS])
def test_greedy_is_the_targets_own(world: dict[str, Any], direction: str, method: str, extra: dict[str, Any]) -> None:
    if direction == "nofb-drafter":
        t, tt, d, dt = world["t_byte"], world["tb"], world["d_nofb"], world["nofb"]
    else:
        t, tt, d, dt = world["t_nofb"], world["nofb"], world["d_byte"], world["tb"]
    got = generate(t, d, PROMPTS, target_tokenizer=tt, drafter_tokenizer=dt, method=method, max_new_tokens=12,
                   do_sample=False, **{"lookahead": 3, **extra})
    assert got.sequences == [target_greedy(t, tt, p, 12, mask_textless=False) for p in PROMPTS]


@pytest.mark.parametrize("method,extra", [m for m in METHODS if m[0] != "ar"], ids=["tli", "slem", "slrs1", "slrs2"])
def test_sampled_with_a_drafter_without_byte_fallback(world: dict[str, Any], method: str,
                                                       extra: dict[str, Any]) -> None:
    t, tt, d, dt = world["t_byte"], world["tb"], world["d_nofb"], world["nofb"]
    prompt, n = PROMPTS[2], 2000
    kw: dict[str, Any] = {"lookahead": 3, **extra}
    rows = generate(t, d, [prompt] * n, target_tokenizer=tt, drafter_tokenizer=dt, method=method, max_new_tokens=2,
                    top_k=8, seed=7, **kw).sequences
    it = iter(rows)
    rep = audit_generate(lambda _p, _s: next(it), t, tt, prompt, n=n, top_k=8, alpha=1e-3, seed=2,
                         max_detectable_tv=0.15)
    assert rep.detectable_tv is not None and rep.detectable_tv < 0.15
    assert rep.verdict == "lossless-consistent", rep.reason




def test_wordpiece_with_cleanup_is_refused_before_any_work() -> None:
    from _torch_checks import counting_forwards

    from hsd_torch.vocab import UnsupportedTokenizer

    wp = _train("wordpiece", cleanup=True)
    tb = tiny.tiny_tokenizer("byte_bpe")
    t, d = tiny.tiny_llama(tb, seed=0, dtype=F64), tiny.tiny_gpt2(wp, seed=1, dtype=F64)
    for target, tt, drafter, dt in ((t, tb, d, wp), (d, wp, t, tb)):
        with counting_forwards(t, d) as forwards, pytest.raises(UnsupportedTokenizer, match="WordPiece with cleanup"):
            generate(target, drafter, "x", target_tokenizer=tt, drafter_tokenizer=dt, method="tli", max_new_tokens=2)
        assert forwards == [0]


def test_sampled_bounded_slrs_with_a_target_without_byte_fallback(world: dict[str, Any]) -> None:
    """The drafter's byte tokens start with bytes no token of the target starts (it has no byte
    fallback): such drafts propose nothing, and psi is the law given a proposal (it was refused up
    front). The sampled first two new tokens of multi-token bounded SLRS (an empty proposal, or one
    that ends where the text is dead) follow the target's law (N = 2,000, top-k 8, alpha 1e-3; the
    audit states the TV it detects with power 0.99, asserted below 0.15); psi's exactness with holes,
    one- and multi-token, is shown against the reference in tests/torch/methods/test_holed_pairs.py."""
    t, tt, d, dt = world["t_nofb"], world["nofb"], world["d_byte"], world["tb"]
    prompt, n = PROMPTS[0], 2000
    rows = generate(t, d, [prompt] * n, target_tokenizer=tt, drafter_tokenizer=dt, method="slrs", lookahead=2,
                    proposal_map="longest_prefix", min_path_prob=0.05, max_tokens=None, max_new_tokens=2,
                    top_k=8, seed=7).sequences
    it = iter(rows)
    rep = audit_generate(lambda _p, _s: next(it), t, tt, prompt, n=n, top_k=8, alpha=1e-3, seed=2,
                         max_detectable_tv=0.15)
    assert rep.detectable_tv is not None and rep.detectable_tv < 0.15
    assert rep.verdict == "lossless-consistent", rep.reason
