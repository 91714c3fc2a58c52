"""The dynamic draft length (``min_confidence``) of hsd_torch's SD, TLI and SLEM against hsd_core's.

- Mirror: with a threshold that stops drafts (asserted: fewer proposals than without it), every row
  emits the reference's tokens on the uniforms it recorded, reads them all, and makes the same
  number of proposals in the same number of rounds as ``hsd_core``'s method with the same
  ``min_confidence`` (greedy too, where the tokens alone would not show a wrong stop: greedy
  output is the target's whatever is drafted). The rows of one batch stop on their own.
- Sampled (slow tier): the law of the first two new tokens against the target's exact law with the
  stop active in 10-90 % of first rounds (asserted; 20,000 samples, alpha 1e-6, TV 0.04 detected
  with power 0.99, as in test_generate.py), and the same test rejects a lossy verification (ratio
  test on ``u / 4``) under the stop. No lossy *stop* is offered: a stop that reads only the models'
  laws (drafter's or target's), never the verification's uniforms, leaves SD, TLI and SLEM lossless.
- Bad values and methods that do not take it are refused with one-line errors.

Models: test_generate.py's tiny float64 models (conftest), as the mirror tests use them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.methods import SD, SLEM, TLI  # noqa: E402
from hsd_core.methods.base import Method, State  # noqa: E402
from hsd_core.methods.tree import Static  # noqa: E402
from hsd_core.models import Model  # noqa: E402
from hsd_core.rand import Rand, UniformRand  # noqa: E402
from hsd_core.stats import assert_law_matches, min_num_samples_for_tv, min_tv_detectable  # noqa: E402
from hsd_torch import CoreModel, generate  # noqa: E402
from hsd_torch.engine import kernels  # noqa: E402
from hsd_torch.models.mirror import core_text, target_two_token_law  # noqa: E402

generate = functools.partial(generate, mask_textless=True)  # hsd_core's laws hold ids with text only (the mirror's)

torch.set_num_threads(1)

PROMPTS = ["def foo(x):\n", "Hello", "import os\nimport sys\n", "x", "naïve café", "return self."]

# (target model, target tokenizer, drafter model, drafter tokenizer, drafter temperature)
PAIRS = {
    "bpe<-self": ("llama_bpe", "byte_bpe", "llama_bpe", "byte_bpe", 1.5),  # one tokenizer, q != p
    "bpe<-unigram": ("llama_bpe", "byte_bpe", "gpt2_uni_pad", "unigram", None),
}
# (method, pair, min_confidence): thresholds at which these drafters stop often but not always
CASES = [("sd", "bpe<-self", 0.3), ("tli", "bpe<-unigram", 0.3), ("slem", "bpe<-unigram", 0.5)]
LOOKAHEAD, MAX_NEW = 4, 12


def unpack(pair: str, toks: dict[str, Any], models: dict[str, Any]) -> tuple[Any, Any, Any, Any, float | None]:
    t, tt, d, dt, dtemp = PAIRS[pair]
    return models[t], toks[tt], models[d], toks[dt], dtemp


def core_method(method: str, greedy: bool, min_confidence: float) -> Method:
    if method == "slem":
        return SLEM(lookahead=LOOKAHEAD, greedy=greedy, min_confidence=min_confidence)
    cls = {"sd": SD, "tli": TLI}[method]
    return cls(lookahead=LOOKAHEAD, greedy=greedy, min_confidence=min_confidence)  # type: ignore[no-any-return]


def core_trace(m: Method, target: Model, drafter: Model, prompt: str, rand: Rand) -> tuple[list[int], int, int]:
    """``m.generate``'s loop, counting: the emitted ids, the proposals made and the rounds run."""
    emitted: tuple[int, ...] = ()
    proposed = rounds = 0
    eos = target.vocab.eos_id
    while len(emitted) < MAX_NEW and not (emitted and emitted[-1] == eos):
        out = m.run_round(target, drafter, State(prompt, emitted, MAX_NEW), rand)
        emitted += out.tokens
        proposed += out.proposed
        rounds += 1
    return list(emitted), proposed, rounds


def run(method: str, pair: str, toks: dict[str, Any], models: dict[str, Any], prompts: list[str],
        min_confidence: float | None, greedy: bool, **process: Any) -> Any:
    target, tt, drafter, dt, dtemp = unpack(pair, toks, models)
    return generate(target, drafter, prompts, target_tokenizer=tt, drafter_tokenizer=dt, method=method,
                    lookahead=LOOKAHEAD, max_new_tokens=MAX_NEW, seed=7, record_uniforms=True, do_sample=not greedy,
                    drafter_temperature=dtemp, min_confidence=min_confidence, **process)


def check_mirror(method: str, pair: str, conf: float, greedy: bool, toks: dict[str, Any], models: dict[str, Any],
                 **process: Any) -> None:
    """hsd_torch with ``min_confidence=conf`` (which must stop drafts here) against hsd_core's
    method with it, fed the recorded uniforms: the same tokens, every uniform read, and per row
    the same proposals in the same number of rounds."""
    out = run(method, pair, toks, models, PROMPTS, conf, greedy, **process)
    free = run(method, pair, toks, models, PROMPTS, None, greedy, **process)
    made, unbounded = sum(s.proposed for s in out.stats), sum(s.proposed for s in free.stats)
    assert made < 0.8 * unbounded, f"the threshold must stop drafts in this test: {made} vs {unbounded} proposals"
    target, tt, drafter, dt, dtemp = unpack(pair, toks, models)
    ct = CoreModel(target, tt, **process)
    dtemp = process.get("temperature", 1.0) if dtemp is None else dtemp
    cd = CoreModel(drafter, dt, **dict(process, temperature=dtemp))
    ref = core_method(method, greedy, conf)
    assert out.uniforms is not None
    for i, prompt in enumerate(PROMPTS):
        rand = UniformRand(out.uniforms[i])
        ids, proposed, rounds = core_trace(ref, ct, cd, core_text(prompt), rand)
        assert ct.tokenizer.to_hf(ids) == out.sequences[i], (method, prompt)
        assert rand.used == len(out.uniforms[i]), "the backend recorded a uniform the reference did not read"
        assert (out.stats[i].proposed, out.stats[i].target_calls) == (proposed, rounds), (method, prompt)


@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
@pytest.mark.parametrize("method,pair,conf", CASES)
def test_mirror_with_min_confidence(method: str, pair: str, conf: float, greedy: bool, toks: dict[str, Any],
                                    models: dict[str, Any]) -> None:
    check_mirror(method, pair, conf, greedy, toks, models)


@pytest.mark.parametrize("method,pair,conf", [("tli", "bpe<-unigram", 0.3), ("slem", "bpe<-unigram", 0.5)])
def test_mirror_with_min_confidence_and_processing(method: str, pair: str, conf: float, toks: dict[str, Any],
                                                   models: dict[str, Any]) -> None:
    """With top-k / top-p the drafter's law is the full processed law and TLI draws from its slice
    on the shared ids (not renormalized): the confidence is still q_cap's, as hsd_core reads it."""
    check_mirror(method, pair, conf, False, toks, models, temperature=0.8, top_k=40, top_p=0.9)


@pytest.mark.parametrize("method,pair,conf", CASES)
def test_each_row_stops_on_its_own(method: str, pair: str, conf: float, toks: dict[str, Any],
                                   models: dict[str, Any]) -> None:
    """A row's tokens, proposals and rounds depend on its seed stream and prompt alone, not on the
    rows beside it (row ``i`` draws from ``(seed, i)``): alone, and among other prompts (which stop
    drafting in other rounds), row 0 and row 3 do the same. So rows of one batch draft different
    lengths in a round, and none waits for, or stops with, another."""
    def facts(out: Any, i: int) -> tuple[list[int], int, int]:
        return out.sequences[i], out.stats[i].proposed, out.stats[i].target_calls

    batch = run(method, pair, toks, models, PROMPTS[:4], conf, False)
    assert facts(run(method, pair, toks, models, PROMPTS[:1], conf, False), 0) == facts(batch, 0)
    others = ["aaaaa", "\n\n", "lambda", PROMPTS[3]]
    assert facts(run(method, pair, toks, models, others, conf, False), 3) == facts(batch, 3)


def test_confidence_one_drafts_one_token_per_round_unless_certain(toks: dict[str, Any], models: dict[str, Any]) -> None:
    """At ``min_confidence=1`` (an int: hsd_core's ``Fraction(1)``) only a law with all its mass on
    one id lets a second draft be made; these drafters' laws never are, so every round proposes one draft."""
    out = run("sd", "bpe<-self", toks, models, PROMPTS[:3], 1, False)
    for st in out.stats:
        assert st.proposed == st.target_calls


# ---------------------------------------------------------------------------------------------
# sampled: the law of the first two tokens with the stop active

ALPHA, POWER, EPS = 1e-6, 0.99, 0.04
N, CHUNK, TOP_K = 20_000, 2_500, 6
LAW_CASE = ("sd", "bpe<-self", 0.5)  # at 0.5 the second draft is made in some rounds and not in others


def test_the_sampled_test_is_sized() -> None:
    k = TOP_K * TOP_K
    assert min_num_samples_for_tv(k, EPS, ALPHA, POWER) <= N
    assert min_tv_detectable(k, N, ALPHA, POWER) <= EPS


def sampled_two_tokens(method: str, pair: str, conf: float, toks: dict[str, Any], models: dict[str, Any],
                       prompt: str, seed: int) -> tuple[list[tuple[int, ...]], int]:
    """N draws of the first two new tokens (lookahead 2), and how many of them made a second draft
    in their first round (SD: a second round, budget 1, always drafts one token, so the first
    round's drafts are the proposals less the rounds after it)."""
    target, tt, drafter, dt, dtemp = unpack(pair, toks, models)
    out: list[tuple[int, ...]] = []
    two = 0
    for c in range(N // CHUNK):
        res = generate(target, drafter, [prompt] * CHUNK, target_tokenizer=tt, drafter_tokenizer=dt, method=method,
                       lookahead=2, max_new_tokens=2, top_k=TOP_K, seed=seed * 1000 + c, drafter_temperature=dtemp,
                       min_confidence=conf)
        out.extend(tuple(s) for s in res.sequences)
        two += sum(s.proposed - (s.target_calls - 1) == 2 for s in res.stats)
    return out, two


@pytest.fixture()
def lossy_accept(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A deliberately lossy backend: the ratio test reads ``u / 4`` (accepts drafts too often)."""
    real = kernels._rejection_host

    def lossy(p: Any, q: Any, drafts: Any, n: Any, ua: Any, uf: Any, **kw: Any) -> Any:
        return real(p, q, drafts, n, None if ua is None else [[x * 0.25 for x in row] for row in ua], uf, **kw)

    monkeypatch.setattr(kernels, "_rejection_host", lossy)
    yield


@pytest.mark.slow  # about 25 s on one core: 20,000 draws
def test_sampled_law_of_first_two_tokens_with_the_stop(toks: dict[str, Any], models: dict[str, Any]) -> None:
    method, pair, conf = LAW_CASE
    target, tt, *_ = unpack(pair, toks, models)
    prompt = "def foo(x):\n"
    law = target_two_token_law(target, tt, prompt, top_k=TOP_K)
    draws, two = sampled_two_tokens(method, pair, conf, toks, models, prompt, seed=4)
    assert 0.1 * N < two < 0.9 * N, f"the stop must act in some first rounds and not in others: {two}/{N}"
    assert_law_matches(law, draws, alpha=ALPHA, eps=EPS, power=POWER)


@pytest.mark.slow  # about 25 s on one core: 20,000 draws
def test_sampled_lossy_variant_is_rejected_with_the_stop(toks: dict[str, Any], models: dict[str, Any],
                                                         lossy_accept: None) -> None:
    method, pair, conf = LAW_CASE
    target, tt, *_ = unpack(pair, toks, models)
    prompt = "def foo(x):\n"
    law = target_two_token_law(target, tt, prompt, top_k=TOP_K)
    with pytest.raises(AssertionError, match="rejected"):
        assert_law_matches(law, sampled_two_tokens(method, pair, conf, toks, models, prompt, seed=5)[0], alpha=ALPHA,
                           eps=EPS, power=POWER)


# ---------------------------------------------------------------------------------------------
# refusals


def test_refusals(toks: dict[str, Any], models: dict[str, Any]) -> None:
    target, tt, drafter, dt, _ = unpack("bpe<-unigram", toks, models)
    kw: dict[str, Any] = dict(target_tokenizer=tt, drafter_tokenizer=dt)
    for bad in (0, 0.0, -0.5, 1.5, float("nan"), Fraction(3, 2)):
        with pytest.raises(ValueError, match=r"min_confidence must be None or a probability in \(0, 1\]"):
            generate(target, drafter, "x", method="tli", min_confidence=bad, **kw)
    for bad in (True, "0.5", [0.5]):
        with pytest.raises(TypeError, match=r"min_confidence must be None or a probability in \(0, 1\]"):
            generate(target, drafter, "x", method="slem", min_confidence=bad, **kw)
    for method in ("slrs", "ar"):
        with pytest.raises(ValueError, match="min_confidence is an option of method 'sd' or 'tli' or 'slem' only"):
            generate(target, drafter, "x", method=method, lookahead=1, min_confidence=0.5, **kw)
    with pytest.raises(ValueError, match="give tree= or min_confidence=, not both"):
        generate(target, drafter, "x", method="tli", tree=Static((2, 1)), min_confidence=0.5, **kw)
    out = generate(target, drafter, "x", method="tli", min_confidence=np.float32(0.5), max_new_tokens=3, seed=0, **kw)
    assert len(out.sequences[0]) == 3


# ---------------------------------------------------------------------------------------------
# command line and benchmark


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from hsd_torch.models.tiny import save_tiny_pair

    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


def proposals(table: str) -> int:
    """The ``proposed`` total of ``hsd generate --stats``'s table (its ``all`` line)."""
    head = next(line for line in table.splitlines() if line.startswith("#  "))
    total = next(line for line in table.splitlines() if line.startswith("all "))
    return int(total.split()[re.split(r"\s{2,}", head).index("proposed") - 1])  # the "all" line has no prompt


def test_generate_command_min_confidence(saved_pair: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``hsd generate --min-confidence C``: greedy output is still the target's (AR's), with fewer
    proposals than without it; bad values and methods are one-line refusals (exit status 2)."""
    from hsd_torch.commands.generate import main

    target, drafter = map(str, saved_pair)
    args = ["--target", target, "--prompt", "def foo(x):", "--max-new-tokens", "8", "--greedy"]
    assert main([*args, "--method", "ar"]) == 0
    ar = capsys.readouterr().out
    counts = {}
    for conf in ([], ["--min-confidence", "0.5"]):
        assert main([*args, "--drafter", drafter, "--method", "tli", "--stats", *conf]) == 0
        out = capsys.readouterr().out
        assert out.startswith(ar)
        counts[bool(conf)] = proposals(out[len(ar):])
    assert counts[True] < counts[False]
    for bad, why in ((["--method", "tli", "--min-confidence", "0"], "needs a number in (0, 1]"),
                     (["--method", "slrs", "--lookahead", "1", "--min-confidence", "0.5"],
                      "--min-confidence is for --method sd, tli or slem"),
                     (["--method", "tli", "--tree", "2,1", "--min-confidence", "0.5"], "--min-confidence and --tree")):
        try:
            code = main([*args, "--drafter", drafter, *bad])
        except SystemExit as e:  # argparse's own refusal of a value
            code = e.code
        err = capsys.readouterr().err
        assert code == 2 and why in err, (bad, err)


def test_benchmark_options(bench_module: Any) -> None:
    """``bench/generate.py --min-confidence C`` reaches the single-path SD, SLEM and TLI only."""
    gen = bench_module("generate")
    for m in ("sd", "slem", "tli"):
        assert gen.hsd_options(m, 4, None, 0.4) == {"lookahead": 4, "method": m, "min_confidence": 0.4}
        assert "min_confidence" not in gen.hsd_options(m, 4, None, None)
    for m in ("ar", "slrs", "bslrs", "bslrsm", "sdtree", "tlitree", "slemtree"):
        assert "min_confidence" not in gen.hsd_options(m, 4, "shape", 0.4)
