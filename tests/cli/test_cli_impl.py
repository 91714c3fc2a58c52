"""``hsd audit --impl transformers|hsd_torch`` on tiny local checkpoints.

hsd_torch's audit: 300 draws, top-k 3 (at most 9 outcomes for the first two tokens), family-wise
alpha 1e-3: detectable TV 0.21 at power 0.99 (printed by the command and asserted); the lossy run
(the sampler's temperature doubled behind the command's back, TV about 0.3) is found lossy and
exits 1.

transformers' sampled UAG is audited where a draft can be accepted: the full
vocabulary (every target id has p > 0, so every draft has a positive acceptance probability) after
``"import os\\n"``. There the installed transformers is lossy (root cause 1 of
docs/auditing-transformers.md: the q of the acceptance test is the pruned head's law written onto
permuted ids) and ``bench/transformers_uag_patch.py`` makes it lossless-consistent. At top-k 3 on the
default prompt no draft can be accepted (the two random models' top 3 do not meet), so the bug is
invisible there: an audit of that state proves nothing about transformers.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.cli import main  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import suite_helpers  # noqa: E402

PROMPT = "def foo(x):\n"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return suite_helpers.save_tiny_pair(tmp_path_factory.mktemp("ckpt"))


def args(ckpt: Path, impl: str, *extra: str) -> list[str]:
    return ["audit", "model", "--impl", impl, "--target", str(ckpt / "t"), "--drafter", str(ckpt / "d"),
            "--prompt", PROMPT,
            "--samples", "300", "--top-k", "3", "--max-detectable-tv", "0.3", *extra]  # 300 draws: detectable TV 0.21


def test_impl_audit_passes_and_writes_the_report(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "out" / "report.md"
    assert main(args(ckpt, "hsd_torch", "--report", str(report))) == 0
    out = capsys.readouterr()
    assert "lossless-consistent" in out.out
    det = float(re.search(r"detectable TV ([0-9.]+)", out.out).group(1))  # type: ignore[union-attr]
    assert det <= 0.22
    assert "hsd audit: sampling hsd_torch" in out.err and "draw/s" in out.err  # the progress lines (no terminal)
    assert "Verdict: lossless-consistent" in report.read_text()


# --------------------------------------------------------------------------------------------
# transformers' sampled UAG, where a draft can be accepted

UAG_PROMPT = "import os\n"
UAG_SAMPLES = 300
# transformers' translator read the assistant's (Unigram, 520 ids) vocabulary through the pinned order
PINNED = ("_get_assistant_to_target_input_ids", 520)


def uag_args(ckpt: Path, *extra: str) -> list[str]:
    """Full vocabulary (no --top-k: transformers gets top_k=0), the first new token (transformers is
    asked for 2, so it comes out of a round with a draft), UAG_SAMPLES draws, seed 0."""
    return ["audit", "model", "--impl", "transformers", "--target", str(ckpt / "t"), "--drafter", str(ckpt / "d"),
            "--prompt", UAG_PROMPT, "--samples", str(UAG_SAMPLES), "--positions", "1", "--seed", "0",
            "--max-detectable-tv", "0.6", *extra]  # the promise at 300 draws is TV 0.55 (asserted below)


@pytest.fixture
def uag_spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Pins the order of every fast tokenizer's ``get_vocab()`` to sorted token strings and counts
    transformers' speculative rounds and accepted drafts.

    transformers builds the pruned assistant head in the order of ``get_vocab()``, a Rust hash map
    whose order changes from process to process; sorted strings are one such order, the same in
    every process, so the draws (and the unpatched sampler's law) are the same on every clone."""
    from transformers import PreTrainedTokenizerFast
    from transformers.generation import utils as gen_utils

    counts: dict[str, Any] = {"pinned": set(), "rounds": 0, "accepted": 0}
    real_vocab = PreTrainedTokenizerFast.get_vocab
    real_sampling = gen_utils._speculative_sampling

    def get_vocab(self: Any) -> dict[str, int]:
        vocab = dict(sorted(real_vocab(self).items()))
        counts["pinned"].add((sys._getframe(1).f_code.co_name, len(vocab)))  # (caller, vocabulary size)
        return vocab

    def speculative_sampling(*a: Any, **kw: Any) -> Any:
        tokens, n_matches = real_sampling(*a, **kw)
        counts["rounds"] += 1
        counts["accepted"] += int(n_matches)
        return tokens, n_matches

    monkeypatch.setattr(PreTrainedTokenizerFast, "get_vocab", get_vocab)
    monkeypatch.setattr(gen_utils, "_speculative_sampling", speculative_sampling)
    return counts


def _uag_patch() -> ModuleType:
    """``bench/transformers_uag_patch.py`` as a module (bench/ is not a package)."""
    return suite_helpers.bench_script("transformers_uag_patch.py")


def test_uag_state_lets_every_draft_be_accepted(ckpt: Path) -> None:
    """The premise of the two tests below: at UAG_PROMPT the target's full-vocabulary law is
    positive on every id, so every draft is accepted with a positive probability min(1, p/q)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target, tt = AutoModelForCausalLM.from_pretrained(ckpt / "t"), AutoTokenizer.from_pretrained(ckpt / "t")
    with torch.inference_mode():
        p = torch.softmax(target(**tt(UAG_PROMPT, return_tensors="pt")).logits[0, -1].float(), -1)
    assert bool((p > 0).all()) and p.shape[0] == len(tt)


def test_transformers_uag_patched_passes(ckpt: Path, uag_spy: dict[str, Any], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """With the project's patch, transformers' sampled UAG is lossless-consistent where drafts can
    be accepted. At UAG_SAMPLES = 300 draws (first token, full vocabulary, alpha 1e-3) the audit
    catches any TV >= 0.55 with probability 0.99 (printed, asserted <= 0.6): the unpatched sampler
    of the next test, TV 0.979 at this very state, would not pass. Every draw's first token came out
    of a round with a draft (counted). A false fail has probability <= alpha over seeds; the seed
    is fixed and get_vocab()'s order pinned, so the outcome is the same on every clone."""
    patch = _uag_patch()
    report = tmp_path / "report.md"
    patch.apply_patch()
    try:
        assert main(uag_args(ckpt, "--report", str(report))) == 0
    finally:
        patch.remove_patch()
    out = capsys.readouterr().out
    assert "transformers UAG: lossless-consistent" in out, out
    det = float(re.search(r"detectable TV ([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    assert det <= 0.6, out
    assert "Verdict: lossless-consistent" in report.read_text()
    assert PINNED in uag_spy["pinned"], uag_spy
    assert uag_spy["rounds"] >= UAG_SAMPLES, uag_spy


def test_transformers_uag_unpatched_is_lossy_when_a_draft_can_be_accepted(
        ckpt: Path, uag_spy: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """transformers as installed is lossy where drafts can be accepted. With get_vocab() pinned
    (``uag_spy``), the exact law of its first new token puts 0.927 on ``'f'`` (target id 73), which
    the target gives 0.0004: the drafter's peaked law drafts ``'f'``, and the q of the acceptance
    test, written onto permuted ids, is 1.4e-6 there, so the draft is accepted (acceptance 0.994
    per draw). TV to the target 0.979 over its ids (computed as ``bench/uag_root_cause.py`` part B
    does, for this order; over random orders it is about as large unless ``'f'``'s column lands on
    itself, about 1 order in 159).

    Sample size: UAG_SAMPLES = 300 draws. The audit expands the 10 ids with expected count >= 5 and
    pools the rest (target mass 0.336, expected 100.9 draws); the unpatched law puts 0.995 there.
    With >= 200 of 300 draws in the pool the joint chi-square is >= 146.7 on 10 dof (p < 2e-26,
    Holm's threshold 2.5e-4) whatever the other cells hold, and fewer than 200 has probability
    < 1e-150 (Chernoff bound on Binomial(300, 0.995)); the run here puts 297 there. The accepted
    drafts are counted too: at least half of the draws (Binomial(300, 0.994))."""
    from transformers.generation import candidate_generator as cg

    assert cg.AssistantToTargetTranslator.get_target_logits.__module__ == cg.__name__, "the patch was left installed"
    assert main(uag_args(ckpt)) == 1
    out = capsys.readouterr().out
    assert "transformers UAG: lossy" in out, out
    assert PINNED in uag_spy["pinned"], uag_spy
    assert uag_spy["accepted"] >= UAG_SAMPLES // 2, uag_spy


def test_greedy(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args(ckpt, "transformers", "--greedy", "--samples", "20")) == 0
    assert "exact point-mass check" in capsys.readouterr().out


def test_lossy_exits_non_zero(ckpt: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    g = sys.modules["hsd_torch.engine.entry"]  # the module of the function hsd_torch.generate
    real = g.generate

    def hot(*a: Any, **kw: Any) -> Any:
        kw["temperature"] = 2.0 * kw.get("temperature", 1.0)
        return real(*a, **kw)

    monkeypatch.setattr(g, "generate", hot)
    assert main(args(ckpt, "hsd_torch", "--method", "ar")) == 1
    assert "lossy" in capsys.readouterr().out


@pytest.mark.parametrize("extra, sent, named", [
    (["--method", "tli", "--tree", "2,1"], {"tree": "Static(widths=(2, 1))", "min_confidence": None},
     "hsd_torch tli (tree 2,1)"),
    (["--method", "slem", "--tree", "dynamic:4:2:2", "--tree-draws", "iid"],
     {"tree": "Dynamic(budget=4, width=2, depth=2)", "tree_draws": "iid"},
     "hsd_torch slem (tree dynamic:4:2:2, tree draws iid)"),
    (["--method", "tli", "--min-confidence", "0.5"], {"tree": None, "min_confidence": 0.5},
     "hsd_torch tli (min confidence 0.5)"),
])
def test_tree_and_confidence_options_reach_generate_and_the_verdict(
        ckpt: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], extra: list[str],
        sent: dict[str, Any], named: str) -> None:
    """``--tree``, ``--tree-draws`` and ``--min-confidence`` are what generate samples with (every call),
    the verdict names them, and the sampler they make passes the audit (300 draws, detectable TV 0.21)."""
    g = sys.modules["hsd_torch.engine.entry"]
    real = g.generate
    seen: list[dict[str, Any]] = []

    def spy(*a: Any, **kw: Any) -> Any:
        seen.append({k: (repr(kw.get(k)) if k == "tree" and kw.get(k) is not None else kw.get(k)) for k in sent})
        return real(*a, **kw)

    monkeypatch.setattr(g, "generate", spy)
    assert main(args(ckpt, "hsd_torch", *extra)) == 0
    out = capsys.readouterr().out
    assert seen and all(s == sent for s in seen)
    assert out.startswith(named + ": lossless-consistent")


@pytest.mark.parametrize("extra, says", [
    (["--method", "tli", "--tree", "2,1", "--lookahead", "3"], "--lookahead and --tree"),
    (["--method", "slrs", "--tree", "2,1"], "--tree is for --method sd, tli or slem"),
    (["--method", "ar", "--min-confidence", "0.5"], "--min-confidence is for --method sd, tli or slem"),
    (["--method", "tli", "--tree", "2,1", "--min-confidence", "0.5"], "--min-confidence and --tree"),
])
def test_tree_and_confidence_options_are_refused_where_generate_would(ckpt: Path, extra: list[str], says: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args(ckpt, "hsd_torch", *extra)) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("flag, value", [("--tree", "2,1"), ("--tree-draws", "iid"), ("--min-confidence", "0.5")])
def test_tree_and_confidence_options_are_refused_for_transformers(ckpt: Path, flag: str, value: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args(ckpt, "transformers", flag, value)) == 2
    assert f"{flag}: options of --impl hsd_torch" in capsys.readouterr().err


def test_missing_argument(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "model", "--impl", "hsd_torch", "--target", str(ckpt / "t")]) == 2
    assert "--drafter" in capsys.readouterr().err


@pytest.mark.parametrize("impl", ["hsd_torch", "transformers"])
def test_asks_for_one_token_more_than_it_audits(ckpt: Path, impl: str, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """transformers drafts nothing for the last new token: the samplers are asked for
    ``--positions + 1`` tokens so that the audited ones come out of rounds with room to draft."""
    from transformers.generation.utils import GenerationMixin

    seen: list[int] = []
    if impl == "hsd_torch":
        g = sys.modules["hsd_torch.engine.entry"]
        real = g.generate

        def spy(*a: Any, **kw: Any) -> Any:
            seen.append(kw["max_new_tokens"])
            return real(*a, **kw)

        monkeypatch.setattr(g, "generate", spy)
    else:
        real_hf = GenerationMixin.generate

        def spy_hf(self: Any, *a: Any, **kw: Any) -> Any:
            if "assistant_model" in kw:  # the audited call (not the assistant's own drafting calls)
                seen.append(kw["max_new_tokens"])
            return real_hf(self, *a, **kw)

        monkeypatch.setattr(GenerationMixin, "generate", spy_hf)
    assert main(args(ckpt, impl, "--samples", "20", "--positions", "1")) in (0, 1)
    capsys.readouterr()
    assert seen and set(seen) == {2}


def seq_args(ckpt: Path, impl: str, *extra: str) -> list[str]:
    return ["audit", "model", "--impl", impl, "--target", str(ckpt / "t"), "--drafter", str(ckpt / "d"),
            "--prompt", PROMPT,
            "--sequences", *extra]


def test_sequences_hsd_torch_passes_and_writes_the_report(ckpt: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """--sequences: 100 sequences of 16 tokens, batched; the verdict, the power per family and the
    cost are printed, the report written."""
    report = tmp_path / "seq.md"
    assert main(seq_args(ckpt, "hsd_torch", "--samples", "100", "--max-new-tokens", "16", "--report",
                         str(report))) == 0
    cap = capsys.readouterr()
    out = cap.out
    assert "lossless-consistent (100 sequences" in out and "mixture toward the drafter" in out
    assert "teacher forcing" in out
    assert "Sequence audit" in report.read_text()
    # progress in a log (stderr is no terminal): a line per chunk of 16 (each chunk is 16 % of 100), not per draw
    bar = [ln for ln in cap.err.splitlines() if ln.startswith("hsd audit: sampling and teacher forcing (hsd_torch)")]
    assert [ln.split(" (hsd_torch) ")[1].split(",")[0] for ln in bar] == \
        ["16/100 (16%)", "32/100 (32%)", "48/100 (48%)", "64/100 (64%)", "80/100 (80%)", "96/100 (96%)",
         "100/100 (100%)"], cap.err
    assert "sequence/s" in bar[0] and "ETA" in bar[0] and " in all" in bar[-1]


def test_sequences_context_bugs_option(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--context-bugs: the aimed tests named (each with its stated probability), 'none' for none, an
    unknown name refused by argparse naming the known ones."""
    assert main(seq_args(ckpt, "hsd_torch", "--samples", "20", "--max-new-tokens", "4", "--max-detectable-tv", "1",
                         "--context-bugs", "prompt_last_twice,prompt_last_dropped")) == 0
    out = capsys.readouterr().out
    assert "context bug: the prompt's last id fed twice" in out and "context bug: the prompt's last id dropped" in out
    assert main(seq_args(ckpt, "hsd_torch", "--samples", "20", "--max-new-tokens", "4", "--max-detectable-tv", "1",
                         "--context-bugs", "none")) == 0
    assert "context bug" not in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(seq_args(ckpt, "hsd_torch", "--context-bugs", "prompt_twice"))
    assert e.value.code == 2 and "prompt_last_dropped, prompt_last_twice" in capsys.readouterr().err


def test_sequences_lossy_exits_non_zero(ckpt: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    g = sys.modules["hsd_torch.engine.entry"]
    real = g.generate

    def hot(*a: Any, **kw: Any) -> Any:
        kw["temperature"] = 1.5 * kw.get("temperature", 1.0)
        return real(*a, **kw)

    monkeypatch.setattr(g, "generate", hot)
    assert main(seq_args(ckpt, "hsd_torch", "--samples", "100", "--max-new-tokens", "16")) == 1
    assert "lossy" in capsys.readouterr().out


def test_sequences_transformers_greedy(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(seq_args(ckpt, "transformers", "--greedy", "--samples", "4", "--max-new-tokens", "8")) == 0
    assert "argmax" in capsys.readouterr().out


def test_impl_options_without_impl_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """``hsd audit --samples N`` used to run the exact toy audit and ignore N (the toy audit's sampled
    mode is --sampled N): refused, naming the flag."""
    with pytest.raises(SystemExit) as e:
        main(["audit", "--samples", "5"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--samples" in err and "--sampled N" in err


def test_a_weak_promise_is_inconclusive(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """At the default --max-detectable-tv 0.1, 300 draws (detectable TV 0.21) give "inconclusive" with
    the number of draws that would do, not a reassuring "lossless-consistent"."""
    a = [x for x in args(ckpt, "hsd_torch") if x not in ("--max-detectable-tv", "0.3")]
    assert main(a) == 0
    out = capsys.readouterr().out
    assert "inconclusive" in out and "above max_detectable_tv 0.1" in out and "draws would reach it" in out


@pytest.mark.parametrize("extra, says", [(["--sequences", "--positions", "3"], "--positions is the first-token"),
                                         (["--max-new-tokens", "8"], "--max-new-tokens is the sequence audit's"),
                                         (["--context-bugs", "none"], "--context-bugs is the sequence audit's")])
def test_options_of_the_other_audit_are_refused(ckpt: Path, extra: list[str], says: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "model", "--impl", "hsd_torch", "--target", str(ckpt / "t"), "--drafter", str(ckpt / "d"),
                 "--prompt", PROMPT, *extra]) == 2
    assert says in capsys.readouterr().err


def test_sequences_transformers_sampled(ckpt: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``--impl transformers --sequences`` sampling: transformers' sampled UAG prunes its assistant's
    head in place, and hsd's teacher forcing of that altered drafter used to crash ("logits have 159
    columns but the text mask 520"). The sampler now gets its own copy: the run ends with a verdict
    (the installed transformers is lossy where drafts can be accepted, docs/auditing-transformers.md,
    so either exit status is a verdict), the drafter the audit reads is the one loaded, untouched,
    and the cost estimate is printed after the first draws. 12 sequences of 4 tokens."""
    from hsd_torch.auditing import first_tokens as audit_mod
    from hsd_torch.auditing.sequences import model_fingerprint

    seen: dict[str, Any] = {}
    real = audit_mod.audit_sequences

    def spy(*a: Any, **kw: Any) -> Any:
        d = kw["drafter"]
        seen["before"] = model_fingerprint(d)
        rep = real(*a, **kw)
        seen["after"] = model_fingerprint(d)
        return rep

    monkeypatch.setattr(sys.modules["hsd_torch.commands.audit"], "audit_sequences", spy)
    rc = main(seq_args(ckpt, "transformers", "--samples", "12", "--max-new-tokens", "4", "--max-detectable-tv", "1"))
    out = capsys.readouterr()
    assert rc in (0, 1) and "transformers UAG: " in out.out and "hsd audit: error" not in out.err, out
    assert seen["before"] == seen["after"]
    assert "_PruneReindexingLMHead" not in str(seen["after"][0])
    assert "sampling 12 sequences should take about" in out.err


def test_a_run_over_the_time_budget_is_refused_with_the_samples_that_fit(ckpt: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """After the first draws (10 here) the estimated sampling time of all --samples is printed, and
    a run above --max-minutes is refused (exit status 2) naming the --samples that fits."""
    assert main(args(ckpt, "transformers", "--samples", "20000", "--max-minutes", "0.001")) == 2
    err = capsys.readouterr().err
    assert "sampling 20000 draws should take about" in err
    assert "more than --max-minutes 0.001: choose --samples" in err
    # what the run would detect is said first, before any draw
    assert "hsd audit: plan: 20000 draws of the first 2 token(s)" in err
    assert err.index("plan: 20000 draws") < err.index("should take about")


def test_sd_with_another_tokenizer_is_refused_before_the_models_load(ckpt: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``--method sd`` drafts target ids: a drafter with another tokenizer is refused from the
    tokenizers alone, before either model loads, by both commands."""
    import transformers

    def boom(*a: Any, **kw: Any) -> Any:
        raise AssertionError("a model was loaded before --method sd was refused")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    assert main(args(ckpt, "hsd_torch", "--method", "sd")) == 2
    assert "--method sd needs a drafter that uses the target's tokenizer" in capsys.readouterr().err
    assert main(["generate", "--target", str(ckpt / "t"), "--drafter", str(ckpt / "d"), "--method", "sd",
                 "--prompt", "x"]) == 2
    assert "--method sd needs a drafter that uses the target's tokenizer" in capsys.readouterr().err
