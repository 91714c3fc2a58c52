"""bench/generate.py's --quick path end to end on a barely trained pair (bench/pair.py --fast)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def test_generate_bench_quick_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import torch

    threads = torch.get_num_threads()
    gen = _load("generate")
    out = tmp_path / "r.json"
    try:
        assert gen.main(["--quick", "--fast-pair", "--pair", str(tmp_path / "pair"), "--prompts", "2", "--new", "5",
                         "--repeats", "1", "--batches", "1,2", "--extra-layers", "2", "--json", str(out),
                         "--plots", str(tmp_path / "plots"), "--sweep", "2,4", "--sweep-modes", "greedy",
                         "--methods", "ar,sd,slem,tli,slrs,bslrs,bslrsm,sdtree,slemtree,tlitree", "--tree", "2,1"]) == 0
    finally:
        torch.set_num_threads(threads)
    res = json.loads(out.read_text())
    m = res["methods"]
    for method in ("ar", "sd", "slem", "tli", "slrs", "bslrs", "bslrsm", "sdtree", "slemtree", "tlitree"):
        for mode in ("greedy", "sample"):
            for b in (1, 2):
                row = m[f"hsd:{method}-{mode}@b{b}"]
                assert row["new_tokens"] == 2 * 5  # the fast pair's samples rarely end early; EOS would show here
                assert row["tokens_per_s"] > 0 and row["target_forwards"] >= 1
                assert (row["acceptance"] is None) == (method == "ar")
                if method != "ar":
                    assert 0 <= row["acceptance"] <= 1 and row["drafter_forwards"] >= 1
    for k in ("ar", "sd", "uag"):
        assert f"hf:{k}-greedy@b1" in m and f"hf:{k}-sample@b1" in m
    assert set(res["vs_transformers"]) == {"ar-greedy", "ar-sample", "sd-greedy", "sd-sample", "tli-sample",
                                           "slem-greedy", "tli-greedy"}
    assert all(v > 0 for v in res["vs_transformers"].values())
    # transformers' UAG sampling with bench/transformers_uag_patch.py, installed for that configuration only
    assert m["hf:uagfix-sample@b1"]["new_tokens"] > 0 and set(res["vs_transformers_patched"]) == {"tli-sample"}
    from transformers.generation import candidate_generator as cg

    assert cg.AssistantToTargetTranslator.get_target_logits.__module__ == cg.__name__, "the patch was left installed"
    # the lookahead sweep: lookahead 2 at batch 1 in greedy mode (4 is the run's own: its batch-1 rows)
    swept = {k for k in m if "/k" in k}
    assert swept == {f"hsd:{x}-greedy@b1/k2" for x in ("tli", "slem", "bslrs", "bslrsm")} | {"hf:uag-greedy@b1/k2"}
    for x in ("tli", "slem", "bslrs"):  # one-token proposals: at most the lookahead's drafts a round
        row = m[f"hsd:{x}-greedy@b1/k2"]
        assert row["new_tokens"] == 2 * 5 and 0 < row["proposed"] <= 2 * row["rounds"]
    assert res["setup"]["sweep"] == [2] and res["setup"]["bounded_slrs"]["min_path_prob"] == 0.05
    # the token trees (--tree 2,1: depth 2): greedy equal to AR's, as every method's
    trees = {k: v for k, v in res["greedy_mismatches"].items() if "tree" in k}
    assert len(trees) == 6 and not any(trees.values()), res["greedy_mismatches"]  # 3 methods x batches 1, 2
    sw = res["lookahead_sweep"]
    assert set(sw) == {"hsd:tli-greedy", "hsd:slem-greedy", "hsd:bslrs-greedy", "hsd:bslrsm-greedy", "hf:uag-greedy"}
    assert all(set(by_k) == {"2", "4"} for by_k in sw.values())
    assert sw["hsd:tli-greedy"]["4"]["speedup_median"] == m["hsd:tli-greedy@b1"]["speedup_median"]
    assert sw["hsd:tli-greedy"]["2"]["tokens_per_target_call"] == m["hsd:tli-greedy@b1/k2"]["tokens_per_target_call"]
    assert set(res["vs_transformers_by_lookahead"]) == {"2", "4"}
    assert set(res["vs_transformers_by_lookahead"]["2"]) == {"slem-greedy", "tli-greedy", "bslrs-greedy", "bslrsm-greedy"}
    # greedy: every hsd method at batch 1 emits the target's own greedy tokens (the AR run's), swept too
    assert all(v == 0 for k, v in res["greedy_mismatches"].items() if k.startswith("hsd:") and "@b1" in k)
    assert {Path(p).name for p in res["plots"]} == {"generate_tokens_per_s.png", "generate_batch.png",
                                                     "generate_bound.png", "generate_lookahead.png"}


# slow tier (9 s): bench/pair.py's rebuild path, a benchmark tool's; the quick path above stays in the fast tier
@pytest.mark.slow
def test_pair_rebuilds_the_tli_drafter_alone_and_diagnoses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/pair.py --drafters-only --keep-sd-drafter: the target and the SD drafter are kept (same
    weights, their recorded times carried over), the TLI drafter is retrained; diagnose() reports
    shares and per-character losses in range."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import torch

    threads = torch.get_num_threads()
    pairmod = _load("pair")
    out = tmp_path / "pair"
    try:
        first = pairmod.build(out, fast=True, log=lambda *_: None)
        sd_before = (out / "sd_drafter" / "model.safetensors").read_bytes()
        again = pairmod.build(out, fast=True, log=lambda *_: None, reuse_target=True, reuse_sd=True)
        assert (out / "sd_drafter" / "model.safetensors").read_bytes() == sd_before
        assert again["sd_drafter_seconds"] == first["sd_drafter_seconds"]
        assert again["target_seconds"] == first["target_seconds"]
        assert again["build_seconds"] >= again["target_seconds"] + again["sd_drafter_seconds"]
        d = pairmod.diagnose(pairmod.load_pair(out, extra_layers=0), chars=2000)
    finally:
        torch.set_num_threads(threads)
    assert 0 <= d["target_tokens_outside_intersection"] <= 1 and d["target_tokens"] > 0
    assert all(v > 0 for v in d["nll_per_char"].values())


# slow tier (10 s): a cut benchmark run keeps its finished repeats (the tool's resilience, not the library's)
@pytest.mark.slow
def test_generate_bench_keeps_finished_repeats_when_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stopped during its second repeat (as a device's time limit stops it) leaves the first
    repeat's figures in --json, marked partial; a finished run's file has no such mark."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import torch

    threads = torch.get_num_threads()
    gen = _load("generate")
    out = tmp_path / "r.json"
    real = gen.Bench.run_hsd

    def cut_in_repeat_two(self, method, mode, b, seed, **kw):  # type: ignore[no-untyped-def]
        if seed == 1:
            raise KeyboardInterrupt("cut")  # what a timeout's signal looks like from inside
        return real(self, method, mode, b, seed, **kw)

    monkeypatch.setattr(gen.Bench, "run_hsd", cut_in_repeat_two)
    args = ["--quick", "--fast-pair", "--pair", str(tmp_path / "pair"), "--prompts", "1", "--new", "3",
            "--repeats", "2", "--batches", "1", "--extra-layers", "1", "--no-transformers", "--json", str(out)]
    try:
        with pytest.raises(KeyboardInterrupt):
            gen.main(args)
    finally:
        torch.set_num_threads(threads)
    res = json.loads(out.read_text())
    assert res["partial"] == {"repeats_done": 1, "repeats_asked": 2}
    assert res["methods"]["hsd:tli-greedy@b1"]["new_tokens"] == 3
    # the greedy comparison with AR (from the first repeat) is kept by the cut run too
    assert set(res["greedy_mismatches"]) == {k for k in res["methods"] if "-greedy@" in k}
    assert res["greedy_mismatches"]["hsd:ar-greedy@b1"] == 0
    monkeypatch.setattr(gen.Bench, "run_hsd", real)
    try:
        assert gen.main(args) == 0
    finally:
        torch.set_num_threads(threads)
    assert "partial" not in json.loads(out.read_text())


def test_greedy_comparison_and_no_assistant_copies_without_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = _load("generate")
    monkeypatch.setattr(gen, "FwdTimer", lambda m, cuda: None)
    got = gen.greedy_comparison({"hsd:ar-greedy@b1": [[1, 2, 3], [4, 5]], "hsd:tli-greedy@b1": [[1, 2, 3], [4, 6]],
                                 "hsd:slem-greedy@b1": [[1, 2, 3], [4, 5]]})
    assert got["greedy_mismatches"] == {"hsd:ar-greedy@b1": 0, "hsd:tli-greedy@b1": 1, "hsd:slem-greedy@b1": 0}
    assert got["greedy_divergences"] == {"hsd:tli-greedy@b1": [(1, 1)]}

    class Model:  # deep-copying it would be a transformers assistant copy
        generation_config = None

        def __deepcopy__(self, memo: object) -> None:
            raise AssertionError("an assistant copy was built without transformers' runs")

    pair = {"target": Model(), "drafter": Model(), "sd_drafter": Model(), "target_tokenizer": None,
            "drafter_tokenizer": None}
    assert gen.Bench(pair, [], 3, 2, "cpu", hf=False).hf_assist == {}
    with pytest.raises(AssertionError, match="assistant copy"):  # the fake does notice a copy
        gen.Bench(pair, [], 3, 2, "cpu", hf=True)


def test_configs_without_sd_drafter_and_with_chat_mode() -> None:
    """The real pair has no SD drafter: no SD configuration on either side; mode chat runs every hsd
    method and transformers' plain generate, not its UAG (the patch was checked for full-law sampling)."""
    gen = _load("generate")
    cfgs = gen.configs([1, 4], True, sd=False, modes=("greedy", "sample", "chat"))
    assert not [c for c in cfgs if c[1] == "sd"]
    assert {(m, b) for impl, m, mode, b in cfgs if impl == "hsd" and mode == "chat"} == \
        {(m, b) for m in ("ar", "slem", "tli", "slrs", "bslrs", "bslrsm") for b in (1, 4)}
    assert {(m, mode) for impl, m, mode, _ in cfgs if impl == "hf"} == {
        ("ar", "greedy"), ("ar", "sample"), ("ar", "chat"), ("uag", "greedy"), ("uag", "sample"), ("uagfix", "sample")}
    assert gen.configs([1], True) == gen.configs([1], True, sd=True, modes=("greedy", "sample"))


@pytest.mark.slow
def test_generate_bench_real_pair_quick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--pair real``: the real pair runs end to end (one prompt, two tokens, batch 1, greedy and
    chat), greedy output of every method equal to AR's; and ``--pair real-reverse`` (roles swapped)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import torch

    from hsd_torch.models import real as real_models

    if set(real_models.available()) != {"gemma-3-270m", "smollm2-135m-instruct"}:
        pytest.skip("the real-model extra is not installed")
    threads = torch.get_num_threads()
    gen = _load("generate")
    out = tmp_path / "r.json"
    try:
        assert gen.main(["--pair", "real", "--quick", "--prompts", "1", "--new", "3", "--repeats", "1",
                         "--batches", "1", "--modes", "greedy,chat", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    res = json.loads(out.read_text())
    m = res["methods"]
    assert res["setup"]["pair_kind"] == "real" and res["setup"]["pair"]["target_vocab"] == 262144
    for method in ("ar", "slem", "tli", "slrs"):
        for mode in ("greedy", "chat"):
            assert m[f"hsd:{method}-{mode}@b1"]["new_tokens"] == 3
    assert "hf:uag-greedy@b1" in m and "hf:ar-chat@b1" in m and not [k for k in m if ":sd-" in k]
    assert all(v == 0 for v in res["greedy_mismatches"].values())
    # the roles swapped: SmolLM2 target, Gemma drafter
    try:
        assert gen.main(["--pair", "real-reverse", "--quick", "--prompts", "1", "--new", "3", "--repeats", "1",
                         "--batches", "1", "--modes", "greedy", "--methods", "ar,tli,slem", "--no-transformers",
                         "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    res = json.loads(out.read_text())
    assert res["setup"]["pair"]["target"] == "smollm2-135m-instruct" and res["setup"]["pair"]["target_vocab"] == 49152
    assert res["methods"]["hsd:tli-greedy@b1"]["new_tokens"] == 3
    assert all(v == 0 for v in res["greedy_mismatches"].values())


def test_distilled_drafter_seeds_hold_out_the_benchmark_sources() -> None:
    """bench/distill_drafter.py never reads the files the benchmark's prose prompts come from, nor a
    test suite; its seeds alternate code and prose and are deterministic."""
    dd = _load("distill_drafter")
    names = {p.name for p in dd.stdlib_files()}
    assert names and not names & {"json", "argparse.py", "textwrap.py", "statistics.py"}
    assert not [n for n in names if n.startswith("test")]
    a, b = dd.seeds(40), dd.seeds(40)
    assert a == b and len(a) == 40
    assert all(s.strip() for s in a)


@pytest.mark.slow
def test_distilled_drafter_fast_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--fast`` builds end to end: Gemma's continuations saved, a tokenizer of the drafter's own (not
    Gemma's), a model that loads, and build.json with the counts and the cost ratio."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import torch

    from hsd_torch.models import real as real_models

    if "gemma-3-270m" not in real_models.available():
        pytest.skip("the real-model extra is not installed")
    threads = torch.get_num_threads()
    dd = _load("distill_drafter")
    try:
        assert dd.main(["--fast", "--out", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
    model, tok, info = dd.load(tmp_path)
    assert len(tok) == info["drafter_vocab"] == 512 and info["seeds"] == {"code": 32, "prose": 32}
    assert info["target_tokens_sampled"] > 0 and info["greedy_continuations"] == 32
    assert 0 < info["cost_ratio"] < 1 and info["training_tokens"] > info["target_tokens_sampled"]
    assert sum(1 for _ in (tmp_path / "samples.jsonl").open()) == 64
    assert model.config.vocab_size == len(tok)
