"""Audits of recorded engine samples (:func:`hsd_torch.auditing.samples.audit_samples`) and the
``hsd audit samples`` / ``hsd audit endpoint`` command lines, on a tiny Llama target (byte-level BPE)
with a tiny GPT-2 drafter over the same tokenizer.

The "engine" is :func:`hsd_torch.generate`: without speculation (``ar``) for the baseline, with
same-vocabulary SD (lossless) and with SD under ``first_draft_accepted`` (lossy,
:mod:`hsd_torch.auditing.variants`) for the audited files, written in the samples format. Sizes: 100
sequences x 8 tokens per file (50 per prompt), alpha 1e-3; the margins were measured over seeds 0-3 before they
were asserted (quoted at each test).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.cli import main as hsd_main  # noqa: E402
from hsd_core.samples import Draw, Sampling, read_samples, write_samples  # noqa: E402
from hsd_core.seqaudit import sequence_seeds  # noqa: E402
from hsd_torch import generate  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch.auditing.samples import audit_samples  # noqa: E402
from hsd_torch.auditing.variants import generate_with  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import suite_helpers  # noqa: E402

torch.set_num_threads(1)

PROMPTS = ["def foo(x):\n", "The quick brown"]
L, N = 8, 100
SAMPLING = Sampling(True, 1.0, None, None, L)
ENGINE = {"name": "hsd_torch", "version": "test"}


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any]:
    """The tiny target and its tokenizer (no drafter: the fast tier needs none)."""
    tok = tiny.tiny_tokenizer("byte_bpe")
    return tiny.tiny_llama(tok, seed=0), tok


@pytest.fixture(scope="module")
def drafter(pair: Any) -> Any:
    return tiny.tiny_gpt2(pair[1], seed=3)


def _file(path: Path, pair: Any, drafter: Any, how: str, seed: int) -> Path:
    """``N`` draws of ``how``: "plain" (AR), "hot" (AR at temperature 1.3 written as 1.0, with a
    speculative label: a lossy engine that needs no drafter), "sd", or a variant of SD."""
    target, tok = pair
    seeds = sequence_seeds(seed, N)
    kw: dict[str, Any] = dict(target_tokenizer=tok, drafter_tokenizer=tok, max_new_tokens=L, lookahead=3)
    draws = []
    for c in range(0, N, 32):
        ps = [PROMPTS[i % 2] for i in range(c, min(N, c + 32))]
        if how in ("plain", "hot"):
            out = generate(target, None, ps, method="ar", seed=seeds[c], temperature=1.3 if how == "hot" else 1.0,
                           **kw).sequences
        elif how == "sd":
            out = generate(target, drafter, ps, method="sd", seed=seeds[c], **kw).sequences
        else:
            out = generate_with(how, target, drafter, ps, method="sd", seed=seeds[c], **kw).sequences
        draws += [Draw(ids=tuple(o), seed=seeds[c + i], prompt=p) for i, (p, o) in enumerate(zip(ps, out))]
    write_samples(path, draws, engine=ENGINE, sampling=SAMPLING,
                  speculative=None if how == "plain" else {"method": "sd", "num_speculative_tokens": 3})
    return path


class _Files(dict[str, Path]):
    """The samples files, each written the first time a test asks for it (the fast tier needs two)."""

    def __init__(self, pair: Any, request: pytest.FixtureRequest, d: Path) -> None:
        super().__init__()
        self.pair, self.request, self.d = pair, request, d

    def __missing__(self, key: str) -> Path:
        how, seed = {"plain": ("plain", 1), "hot": ("hot", 4), "sd": ("sd", 2),
                     "lossy": ("first_draft_accepted", 3)}[key]
        drafter = None if how in ("plain", "hot") else self.request.getfixturevalue("drafter")
        self[key] = _file(self.d / f"{key}.jsonl", self.pair, drafter, how, seed)
        return self[key]


@pytest.fixture(scope="module")
def files(pair: Any, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _Files(pair, request, tmp_path_factory.mktemp("samples"))


def _provider(target: Any, scale: float = 1.0) -> Any:
    """The target's own raw log-probabilities as a law provider (``scale`` != 1: a reference whose
    numerics differ from the engine's, as a temperature would)."""
    @torch.inference_mode()
    def laws(prompt_ids: list[int], ids: list[int]) -> np.ndarray:
        x = torch.tensor([prompt_ids + ids])
        lg = target(input_ids=x).logits[0, len(prompt_ids) - 1:-1].double() * scale
        return torch.log_softmax(lg, -1).numpy()
    return laws


@pytest.mark.slow
def test_lossless_speculation_with_its_null_control(pair: Any, drafter: Any, files: dict[str, Path]) -> None:
    """Over seeds 0-3 the audit of SD's file passes against transformers' law, its null control too,
    and the two-sample test does not reject (its smallest p-value 0.027-0.2, against alpha / 2 / m = 1e-4)."""
    target, tok = pair
    rep = audit_samples(files["sd"], target, tok, baseline=files["plain"], drafter=drafter, drafter_tokenizer=tok)
    assert rep.verdict == "lossless-consistent", rep.reason
    assert rep.reference.startswith("transformers' float32 teacher-forced law")
    assert rep.null_control is not None and rep.null_control.verdict != "lossy"
    assert rep.two_sample is not None and rep.two_sample.verdict == "lossless-consistent"
    assert {t.name for t in rep.two_sample.tests} >= {"first-token homogeneity",
                                                       "score log-likelihood under the drafter (stratified rank test)"}
    assert rep.audited.sequence.n == N and len(rep.audited.first_token) == 2  # one per prompt (50 draws each)
    md = rep.to_markdown()
    assert "Null control" in md and "Two-sample audit" in md and "reference law: transformers'" in md


@pytest.mark.slow
def test_lossy_speculation_is_caught(pair: Any, drafter: Any, files: dict[str, Path]) -> None:
    """The first draft accepted whenever the target gives it mass: over seeds 0-3 the sequence audit's
    smallest p-value is 0 and the two-sample test's below 1e-33."""
    target, tok = pair
    rep = audit_samples(files["lossy"], target, tok, baseline=files["plain"], drafter=drafter, drafter_tokenizer=tok)
    assert rep.verdict == "lossy", rep.reason
    assert rep.two_sample is not None and rep.two_sample.verdict == "lossy"


@pytest.mark.slow
def test_engine_law_as_reference_and_a_failing_null_control(pair: Any, files: dict[str, Path]) -> None:
    target, tok = pair
    own = audit_samples(files["sd"], target, tok, baseline=files["plain"], reference=_provider(target),
                        reference_name="the engine's prompt logprobs", context_bugs=None)
    assert own.verdict == "lossless-consistent", own.reason
    assert "the engine's own law from the provider the engine's prompt logprobs" in own.reference
    # a reference whose numerics differ (logits x 1.6): the null control fails, and the report blames the
    # reference, not speculation; the two-sample test decides (p of the null control below 1e-10 over seeds 0-3)
    off = audit_samples(files["sd"], target, tok, baseline=files["plain"], reference=_provider(target, 1.6),
                        context_bugs=None)
    assert off.null_control is not None and off.null_control.verdict == "lossy"
    assert "the reference does not match the engine's numerics" in off.reason
    assert off.verdict == "lossless-consistent"
    alone = audit_samples(files["plain"], target, tok, reference=_provider(target, 1.6), context_bugs=None)
    assert alone.verdict == "lossy" and "it is the null control of the reference" in alone.reason


def test_refusals(pair: Any, files: dict[str, Path], tmp_path: Path) -> None:
    target, tok = pair
    with pytest.raises(ValueError, match=r"returned shape \(\d+, 7\) for \d+ ids; expected \(\d+, 384\)"):
        audit_samples(files["plain"], target, tok, reference=lambda p, i: np.zeros((len(i), 7)), context_bugs=None)
    with pytest.raises(ValueError, match="row 0 sums to .* return raw log-probabilities"):
        audit_samples(files["plain"], target, tok, reference=lambda p, i: np.zeros((len(i), 384 + 0 * len(p))),
                      context_bugs=None)
    with pytest.raises(ValueError, match="the baseline is the same engine without speculation"):
        audit_samples(files["hot"], target, tok, baseline=files["hot"])
    with pytest.raises(ValueError, match="has no speculation .* audit it alone"):
        audit_samples(files["plain"], target, tok, baseline=files["plain"])
    s = read_samples(files["plain"])
    same_seeds = write_samples(tmp_path / "x.jsonl", s.draws, engine=ENGINE, sampling=SAMPLING,
                               speculative={"method": "sd"})
    with pytest.raises(ValueError, match="shares 100 seeds with .*independent draws"):
        audit_samples(same_seeds, target, tok, baseline=s)
    other = write_samples(tmp_path / "y.jsonl", [Draw(ids=d.ids, seed=d.seed + 1, prompt=d.prompt) for d in s.draws],
                          engine=ENGINE, sampling=Sampling(True, 0.5, None, None, L), speculative={"method": "sd"})
    with pytest.raises(ValueError, match="the baseline needs the same sampling settings"):
        audit_samples(other, target, tok, baseline=s)
    # engines that differ in a field the label does not show (vLLM with and without hsd's patch)
    patched = write_samples(tmp_path / "z.jsonl", [Draw(ids=d.ids, seed=d.seed + 1, prompt=d.prompt) for d in s.draws],
                            engine={**ENGINE, "patch": "cpu-expand"}, sampling=SAMPLING, speculative={"method": "sd"})
    with pytest.raises(ValueError, match=r"their engines differ in 'patch' \('cpu-expand' here, absent in the "
                                         r"baseline\): the baseline must be the same engine"):
        audit_samples(patched, target, tok, baseline=s)


@pytest.fixture(scope="module")
def folder(pair: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target, tok = pair
    d = tmp_path_factory.mktemp("target")
    target.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_cli_samples_file(folder: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str],
                          tmp_path: Path) -> None:
    """A lossy engine (temperature 1.3 sampled, 1.0 written) against its baseline: caught over seeds 0-3
    with p below 1e-46 against the reference and below 1e-12 in the two-sample test."""
    rc = hsd_main(["audit", "samples", "--samples-file", str(files["hot"]), "--baseline-file", str(files["plain"]),
                   "--target", str(folder), "--context-bugs", "none", "--report", str(tmp_path / "r.md")])
    out = capsys.readouterr().out
    assert rc == 1 and out.startswith("engine audit: lossy") and "null control: plain.jsonl" in out
    assert "# Engine audit" in (tmp_path / "r.md").read_text()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(files["plain"].read_text().replace('"seed": ', '"seed": 1.5, "x": ', 1))
    for argv, msg in (
            (["samples", "--samples-file", str(bad)], r"bad\.jsonl:1: key 'seed': must be an int or null"),
            (["endpoint", "--endpoint", "http://10.1.2.3:8000/v1", "--prompt", "x"], "is not loopback"),
            (["samples", "--samples-file", str(files["plain"]), "--reference", "nosuchmodule:f"], "cannot be loaded")):
        assert hsd_main(["audit", *argv, "--target", str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("hsd audit: error: "), err
        assert __import__("re").search(msg, err), err
    for extra in (["--temperature", "0.5"], ["--impl", "hsd_torch"]):  # the file says its settings; no --impl
        with pytest.raises(SystemExit):
            hsd_main(["audit", "samples", "--samples-file", str(files["plain"]), *extra, "--target", str(folder)])
        assert f"unrecognized arguments: {' '.join(extra)}" in capsys.readouterr().err


def test_cli_dtype_sets_the_reference_target_and_the_report_says_so(folder: Path, files: dict[str, Path],
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``--dtype bfloat16`` loads the reference target in bfloat16 (half the memory) and the reference
    line says what that changes; float32 says transformers' float32 law as before; ``--impl`` refuses
    --dtype (it samples and audits in float32)."""
    from hsd_torch.auditing.samples import reference_description
    from hsd_torch.commands import audit as cmd

    seen: list[Any] = []
    real_load = cmd.load

    def spy(path: str, tok: str | None, dtype: Any = torch.float32) -> Any:
        seen.append(dtype)
        return real_load(path, tok, dtype)

    import unittest.mock

    with unittest.mock.patch.object(cmd, "load", spy):
        rc = hsd_main(["audit", "samples", "--samples-file", str(files["plain"]), "--target", str(folder),
                       "--context-bugs",
                       "none", "--dtype", "bf16"])
    out = capsys.readouterr().out
    assert rc == 0 and seen == [torch.bfloat16], (rc, seen, out)
    assert "reference: transformers' bfloat16 teacher-forced law" in out and "8 significant bits" in out
    m32 = cmd.load(str(folder), None)[0]
    assert reference_description(m32).startswith("transformers' float32 teacher-forced law")
    assert "significant bits" not in reference_description(m32)
    assert hsd_main(["audit", "--impl", "hsd_torch", "--method", "ar", "--target", str(folder), "--prompt", "x",
                     "--dtype", "bfloat16"]) == 2
    assert "--dtype bfloat16 is the engine audits'" in capsys.readouterr().err


class _Handler(BaseHTTPRequestHandler):
    pair: Any = None

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        target, tok = type(self).pair
        out = generate(target, None, input_ids=torch.tensor([req["prompt"]]), target_tokenizer=tok, method="ar",
                       max_new_tokens=req["max_tokens"], seed=req["seed"]).sequences[0]
        body = json.dumps({"choices": [{"token_ids": list(out), "finish_reason": "length"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server(pair: Any) -> Iterator[str]:
    _Handler.pair = pair
    with suite_helpers.loopback_server(_Handler) as url:
        yield url


@pytest.mark.slow
def test_cli_endpoint(folder: Path, server: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = hsd_main(["audit", "endpoint", "--endpoint", server, "--model", "tiny", "--target", str(folder),
                   "--prompt", PROMPTS[0],
                   "--samples", "40", "--max-new-tokens", "6", "--speculative", "null", "--context-bugs", "none",
                   "--save-samples", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "it is the null control of the reference itself" in out, out
    s = read_samples(tmp_path / "endpoint.jsonl")
    assert len(s.draws) == 40 and s.sampling.max_new_tokens == 6 and not s.is_speculative


@pytest.mark.slow
def test_greedy_files_are_audited_for_identity(pair: Any, drafter: Any, tmp_path: Path) -> None:
    """Greedy: every draw must be the target's argmax path (sequence and first-token audits), and with
    speculation equal the engine's deterministic output without it (exact two-sample comparison)."""
    target, tok = pair
    greedy = Sampling(False, 1.0, None, None, L)

    def write(name: str, method: str, d: Any, bad: bool = False) -> Path:
        out = generate(target, d, PROMPTS * 3, target_tokenizer=tok, drafter_tokenizer=tok, method=method,
                       max_new_tokens=L, do_sample=False).sequences
        if bad:  # one draw off the argmax path at its third token
            out[1] = out[1][:2] + [(out[1][2] + 1) % 384] + out[1][3:]
        seed0 = 100 if method == "ar" else 0
        draws = [Draw(ids=tuple(o), seed=seed0 + i, prompt=p) for i, (p, o) in enumerate(zip(PROMPTS * 3, out))]
        write_samples(tmp_path / name, draws, engine=ENGINE, sampling=greedy,
                      speculative=None if method == "ar" else {"method": method})
        return tmp_path / name

    plain, sd, off = write("p.jsonl", "ar", None), write("s.jsonl", "sd", drafter), write("o.jsonl", "sd", drafter, True)
    good = audit_samples(sd, target, tok, baseline=plain)
    assert good.verdict == "lossless-consistent", good.reason
    assert good.two_sample is not None and "every greedy draw with speculation equals" in good.two_sample.reason
    bad = audit_samples(off, target, tok, baseline=plain)
    assert bad.verdict == "lossy" and bad.two_sample is not None and bad.two_sample.verdict == "lossy"
    assert "first at position 2" in bad.two_sample.greedy_mismatch[0]


def test_the_verdict_is_the_combination_rules(pair: Any, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """audit_samples gives no verdict of its own: each file's parts are combined once by
    ``combine_parts``, the file, its null control and the two-sample test once by
    ``combine_with_control`` (hsd_core.stats.combine, whose truth tables are in
    tests/stats/test_verdicts.py), and the report's verdict and reason are their answers."""
    import hsd_torch.engine_audit as ea

    target, tok = pair
    parts: list[list[Any]] = []
    calls: list[tuple[Any, ...]] = []

    def fake_parts(p: Any) -> tuple[str, str]:
        parts.append(list(p))
        return "inconclusive", "recorded parts"

    def fake_control(audited: Any, control: Any, two_sample: Any, *, speculative: bool = True) -> tuple[str, str]:
        calls.append((audited, control, two_sample, speculative))
        return "lossless-consistent", "the recorded verdict"
    monkeypatch.setattr(ea, "combine_parts", fake_parts)
    monkeypatch.setattr(ea, "combine_with_control", fake_control)
    alone = audit_samples(files["plain"], target, tok, context_bugs=None)
    assert (alone.verdict, alone.reason) == ("lossless-consistent", "the recorded verdict")
    assert alone.audited.verdict == "inconclusive" and calls == [("inconclusive", None, None, False)]
    assert len(parts) == 1 and parts[0][0][0] == "sequence audit" and len(parts[0]) == 1 + len(alone.audited.first_token)
    calls.clear()
    both = audit_samples(files["hot"], target, tok, baseline=files["plain"], context_bugs=None)
    assert (both.verdict, both.reason) == ("lossless-consistent", "the recorded verdict") and len(parts) == 3
    assert both.two_sample is not None
    assert calls == [("inconclusive", "inconclusive", (both.two_sample.verdict, both.two_sample.reason), True)]
