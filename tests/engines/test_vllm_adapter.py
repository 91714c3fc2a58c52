"""The pure-Python parts of the vLLM adapter, without vLLM: the worker's argument building and
samples-file records from fake vLLM result objects, its dense prompt-log-prob rows and its sample
mode driven by a fake ``vllm`` module, the law provider's pipe protocol against a fake worker, the
replay's checks, and the refusals of ``hsd audit vllm`` before any engine starts. The real
engine is tests/engines/test_vllm_engine.py's (slow, engines)."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import stat
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hsd_core.samples import read_samples
from hsd_torch.engines import vllm_audit as va
from hsd_torch.engines import vllm_worker as vw


def _out(ids: list[int], prompt: list[int], reason: str = "length") -> Any:
    return types.SimpleNamespace(prompt_token_ids=prompt,
                                 outputs=[types.SimpleNamespace(token_ids=ids, finish_reason=reason)])


def test_speculative_configs() -> None:
    assert vw.speculative_config(None) is None
    ng = vw.speculative_config({"method": "ngram"})
    assert ng == {"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 1, "num_speculative_tokens": 4}
    tli = vw.speculative_config({"method": "tli", "model": "/d", "drafter": "smol", "num_speculative_tokens": 3})
    assert tli == {"method": "draft_model", "model": "/d", "use_heterogeneous_vocab": True, "num_speculative_tokens": 3}
    dm = vw.speculative_config({"method": "draft_model", "model": "/d", "rejection_sample_method": "block"})
    assert dm is not None and "use_heterogeneous_vocab" not in dm and dm["rejection_sample_method"] == "block"
    with pytest.raises(ValueError, match="needs a drafter folder"):
        vw.speculative_config({"method": "draft_model"})
    with pytest.raises(ValueError, match="one of ngram, draft_model, tli"):
        vw.speculative_config({"method": "eagle"})


def test_llm_kwargs_set_the_audit_settings() -> None:
    kw = vw.llm_kwargs({"model": "/t", "speculative": {"method": "ngram"}})
    assert kw["dtype"] == "float32" and kw["enforce_eager"] and not kw["enable_prefix_caching"]
    assert kw["disable_hybrid_kv_cache_manager"] and kw["speculative_config"]["method"] == "ngram"
    assert kw["logprobs_mode"] == "raw_logprobs" and "max_logprobs" not in kw
    laws = vw.llm_kwargs({"model": "/t", "laws": True, "dtype": "bfloat16"})
    assert laws["max_logprobs"] == -1 and laws["dtype"] == "bfloat16" and "speculative_config" not in laws


def test_sampling_kwargs() -> None:
    g = vw.sampling_kwargs({"do_sample": False, "temperature": 0.7, "max_new_tokens": 5}, 7)
    assert g == {"max_tokens": 5, "seed": 7, "detokenize": False, "temperature": 0.0}
    s = vw.sampling_kwargs({"do_sample": True, "temperature": 0.7, "top_k": None, "top_p": 0.9, "max_new_tokens": 5}, 8)
    assert (s["temperature"], s["top_k"], s["top_p"], s["seed"]) == (0.7, 0, 0.9, 8)
    plain = vw.sampling_kwargs({"do_sample": True, "max_new_tokens": 5}, None)
    assert (plain["temperature"], plain["top_k"], plain["top_p"], plain["seed"]) == (1.0, 0, 1.0, None)


def test_records_from_vllm_outputs() -> None:
    job = {"target": "smol", "speculative": {"method": "tli", "model": "/folder", "drafter": "gemma"}, "dtype": "bfloat16"}
    sampling = {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "max_new_tokens": 3}
    settings = vw.record_settings(job, sampling, "0.32.0")
    assert settings["speculative"] == {"method": "tli", "drafter": "gemma"}  # the folder is this machine's only
    assert settings["engine"] == {"name": "vllm", "version": "0.32.0", "dtype": "bfloat16"}
    assert settings["sampling"] == {"do_sample": True, "temperature": 0.7, "top_k": None, "top_p": 0.9,
                                    "max_new_tokens": 3}
    reqs = [{"prompt": "a", "prompt_ids": [1, 2], "seed": 11}, {"prompt": None, "prompt_ids": [3], "seed": 12}]
    stats = {"scope": "file", "num_drafts": 2}
    recs = vw.records(settings, reqs, [_out([5, 6, 7], [1, 2]), _out([9, 1], [3], "stop")], stats)
    assert [r["ids"] for r in recs] == [[5, 6, 7], [9, 1]]
    assert [r["prompt_ids"] for r in recs] == [[1, 2], [3]]
    assert [r["seed"] for r in recs] == [11, 12] and recs[0]["prompt"] == "a" and "prompt" not in recs[1]
    assert recs[1]["finish_reason"] == "stop" and recs[0]["spec_stats"] == stats
    assert all(r["format"] == "hsd-samples/1" for r in recs)
    json.dumps(recs)  # every value is JSON
    with pytest.raises(ValueError, match="1 outputs for 2 requests"):
        vw.records(settings, reqs, [_out([5], [1, 2])], None)


def test_spec_stats_and_per_file_differences() -> None:
    M = types.SimpleNamespace
    before = vw.spec_stats([M(name="vllm:spec_decode_num_drafts", value=3),
                            M(name="vllm:spec_decode_num_draft_tokens", value=12),
                            M(name="vllm:spec_decode_num_accepted_tokens", value=6),
                            M(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=[3, 2, 1, 0]),
                            M(name="vllm:num_requests_running", value=1)])
    assert before == {"scope": "run", "num_drafts": 3, "num_draft_tokens": 12, "num_accepted_tokens": 6,
                      "num_accepted_tokens_per_pos": [3, 2, 1, 0], "acceptance_rate": 0.5}
    after = dict(before, num_drafts=5, num_draft_tokens=20, num_accepted_tokens=7, num_accepted_tokens_per_pos=[4, 2, 1, 0])
    assert vw._minus(after, before) == {"scope": "file", "num_drafts": 2, "num_draft_tokens": 8, "num_accepted_tokens": 1,
                                        "num_accepted_tokens_per_pos": [1, 0, 0, 0], "acceptance_rate": 0.125}


def _fake_vllm(monkeypatch: pytest.MonkeyPatch, generate: Any) -> type:
    """A ``vllm`` package with what the worker touches: LLM, SamplingParams, TokensPrompt, and the
    output processor's LogprobsProcessor."""

    class LLM:
        def __init__(self, **kw: Any) -> None:
            self.kw = kw

        def generate(self, prompts: list[Any], params: list[Any], use_tqdm: bool = True) -> list[Any]:
            return [generate(p, s) for p, s in zip(prompts, params)]

        def get_metrics(self) -> list[Any]:
            return []

    class LogprobsProcessor:
        pass

    root = types.ModuleType("vllm")
    root.LLM = LLM  # type: ignore[attr-defined]
    root.SamplingParams = lambda **kw: kw  # type: ignore[attr-defined]
    root.__version__ = "0.0-fake"  # type: ignore[attr-defined]
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}  # type: ignore[attr-defined]
    lp = types.ModuleType("vllm.v1.engine.logprobs")
    lp.LogprobsProcessor = LogprobsProcessor  # type: ignore[attr-defined]
    for name, mod in (("vllm", root), ("vllm.inputs", inputs), ("vllm.v1", types.ModuleType("vllm.v1")),
                      ("vllm.v1.engine", types.ModuleType("vllm.v1.engine")), ("vllm.v1.engine.logprobs", lp)):
        monkeypatch.setitem(sys.modules, name, mod)
    return LogprobsProcessor


def test_dense_prompt_logprob_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    proc_cls = _fake_vllm(monkeypatch, None)
    monkeypatch.setattr(proc_cls, "_update_prompt_logprobs", None, raising=False)
    vw._dense_prompt_logprobs()
    proc_cls._hsd_width = 5
    proc = proc_cls()
    proc.prompt_logprobs = [None]
    # vLLM's layout: column 0 the prompt token itself, then the top ids by rank (here all 5 ids)
    ids = np.array([[2, 2, 0, 4, 1, 3], [0, 1, 0, 2, 3, 4]])
    lps = np.log(np.array([[.4, .4, .3, .2, .05, .05], [.6, .1, .6, .1, .1, .1]], dtype=np.float32))
    proc._update_prompt_logprobs((ids, lps, None))
    rows = proc.prompt_logprobs[1:]
    assert proc.prompt_logprobs[0] is None and len(rows) == 2
    np.testing.assert_allclose(np.exp(rows[0]), [.3, .05, .4, .05, .2], rtol=1e-6)
    np.testing.assert_allclose(np.exp(rows[1]), [.6, .1, .1, .1, .1], rtol=1e-6)
    assert all(r.dtype == np.float32 and r.shape == (5,) for r in rows)
    partial = proc_cls()  # a top-k narrower than the vocabulary leaves -inf, never a made-up value
    partial.prompt_logprobs = [None]
    partial._update_prompt_logprobs((np.array([[1, 1, 3]]), np.log(np.array([[.5, .5, .5]])), None))
    assert np.isneginf(partial.prompt_logprobs[1][[0, 2, 4]]).all()


def test_sample_mode_writes_the_samples_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[Any] = []

    def generate(prompt: dict[str, Any], params: dict[str, Any]) -> Any:
        seen.append((prompt, params))
        return _out([params["seed"] % 7, 1], prompt["prompt_token_ids"], "stop")

    _fake_vllm(monkeypatch, generate)
    files = [va.file_entry([[4, 5], [6]], ["x", "y"], [10, 11, 12], str(tmp_path / "g.jsonl"), do_sample=False,
                           max_new_tokens=2),
             va.file_entry([[4, 5]], ["x"], [20, 21], str(tmp_path / "s.jsonl"), do_sample=True, temperature=0.7,
                           top_p=0.9, max_new_tokens=2)]
    job = va.build_job("/folder", files, None, target_name="smol")
    ch = io.BytesIO()
    vw.run_sample(job, ch)
    summaries = [json.loads(ln) for ln in ch.getvalue().decode().splitlines()]
    assert [s["draws"] for s in summaries] == [3, 2] and summaries[0]["spec_stats"] is None
    g = va.read_samples_file(str(tmp_path / "g.jsonl"))
    assert [r["prompt_ids"] for r in g] == [[4, 5], [6], [4, 5]] and [r["prompt"] for r in g] == ["x", "y", "x"]
    assert [r["ids"] for r in g] == [[3, 1], [4, 1], [5, 1]] and g[0]["sampling"]["do_sample"] is False
    assert g[0]["target"] == "smol" and g[0]["speculative"] is None and g[0]["engine"]["name"] == "vllm"
    assert [p["temperature"] for _, p in seen[:3]] == [0.0] * 3 and seen[3][1]["top_p"] == 0.9
    assert not os.path.exists(str(tmp_path / "g.jsonl.tmp"))


FAKE_WORKER = r'''
import json, sys
import numpy as np
V = 6
print(json.dumps({"ready": True, "vocab_size": V, "version": "fake"}), flush=True)
out = sys.stdout.buffer
for line in sys.stdin:
    req = json.loads(line)
    if any(not p for p, _ in req["pairs"]):
        out.write((json.dumps({"error": "ValueError: empty prompt"}) + "\n").encode()); out.flush(); continue
    arrs = []
    for p, ids in req["pairs"]:
        ctx = list(p)
        rows = []
        for t in ids:
            z = np.arange(V, dtype=np.float64) * (sum(ctx) % 5 + 1) / 10
            rows.append(z - np.log(np.exp(z).sum()))
            ctx.append(t)
        arrs.append(np.array(rows, dtype="<f4").reshape(len(ids), V))
    out.write((json.dumps({"shapes": [list(a.shape) for a in arrs], "dtype": "float32"}) + "\n").encode())
    for a in arrs:
        out.write(a.tobytes())
    out.flush()
'''


def _fake_python(tmp_path: Path, body: str) -> str:
    """An executable that runs ``body`` with this interpreter, whatever arguments it gets."""
    script = tmp_path / "worker_body.py"
    script.write_text(body)
    exe = tmp_path / "fake-python"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {script}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


def test_law_provider_protocol(tmp_path: Path) -> None:
    with va.VllmLaws(_fake_python(tmp_path, FAKE_WORKER), "/folder") as laws:
        assert laws.vocab_size == 6 and laws.version == "fake"
        a = laws([1, 2], [3, 0, 5])
        assert a.shape == (3, 6) and a.dtype == np.float32
        for j, ctx_sum in enumerate([3, 6, 6]):
            z = np.arange(6) * (ctx_sum % 5 + 1) / 10
            np.testing.assert_allclose(a[j], z - np.log(np.exp(z).sum()), rtol=1e-6)
        many = laws.many([([1], [2]), ([4], []), ([2, 2], [1, 1])])
        assert [m.shape for m in many] == [(1, 6), (0, 6), (2, 6)]
        with pytest.raises(ValueError, match="refused the law request: ValueError: empty prompt"):
            laws([], [1])
        assert laws([1], [1]).shape == (1, 6)  # the worker goes on after a refused request
    with pytest.raises(ValueError, match="closed"):
        laws([1], [1])


def test_law_provider_whose_worker_dies(tmp_path: Path) -> None:
    log = str(tmp_path / "laws.log")
    with pytest.raises(va.VllmUnavailable, match="exited before it was ready.*no engine here"):
        va.VllmLaws(_fake_python(tmp_path, "import sys; print('no engine here', file=sys.stderr)"), "/f", log=log)


def test_find_python_refuses_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(va.PYTHON_ENV, raising=False)
    with pytest.raises(va.VllmUnavailable) as e:
        va.find_python(None)
    assert "\n" not in str(e.value) and "--vllm-python" in str(e.value) and va.SETUP in str(e.value)
    with pytest.raises(va.VllmUnavailable, match="not an executable file"):
        va.find_python(str(tmp_path / "missing"))
    monkeypatch.setenv(va.PYTHON_ENV, sys.executable)
    assert va.find_python(None) == sys.executable


def test_spec_entries_and_jobs() -> None:
    assert va.spec_entry("none", None) is None
    assert va.spec_entry("ngram", None, num_speculative_tokens=3) == {"method": "ngram", "num_speculative_tokens": 3}
    assert va.spec_entry("tli", "/g", "gemma") == {"method": "tli", "num_speculative_tokens": 4, "model": "/g",
                                                   "drafter": "gemma"}
    with pytest.raises(ValueError, match="needs a drafter"):
        va.spec_entry("draft_model", None)
    with pytest.raises(ValueError, match="need a drafter"):
        va.spec_entry("ngram", None, draft_sample_method="probabilistic")
    with pytest.raises(ValueError, match="one of none, ngram"):
        va.spec_entry("medusa", "/d")
    with pytest.raises(ValueError, match="distinct"):
        va.file_entry([[1]], ["a"], [5, 5], "/o", do_sample=True)
    with pytest.raises(ValueError, match="at least one"):
        va.build_job("/t", [], None)
    taken = [1, 2, 3]
    base = va.baseline_seeds(0, 50, taken)
    assert len(base) == len(set(base)) == 50 and not set(base) & set(taken)


def test_replay_hands_out_the_draws_and_checks_them() -> None:
    recs = [{"prompt": "a", "seed": 1, "ids": [4]}, {"prompt": "b", "seed": 2, "ids": [5, 6]}]
    rp = va._Replay(recs)
    assert rp(["a"], [1]) == [[4]] and rp(["b"], [2]) == [[5, 6]]
    with pytest.raises(ValueError, match="draw 0 of the samples file was made for prompt 'a' and seed 1"):
        va._Replay(recs)(["a"], [9])


def test_impl_vllm_refuses_before_any_engine(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    from hsd_torch.commands import audit as cli_audit

    monkeypatch.delenv(va.PYTHON_ENV, raising=False)
    p = argparse.ArgumentParser()
    p.add_argument("--impl", default="vllm")
    cli_audit.add_arguments(p)

    def load(path: str, tok: str | None) -> tuple[Any, Any]:
        raise AssertionError("nothing may be loaded before the refusal")

    def refusal(*argv: str) -> str:
        assert va.run(p.parse_args(list(argv)), load, load) == 2  # type: ignore[arg-type]
        err = capsys.readouterr().err
        assert err.startswith("hsd audit: error: ") and err.count("\n") == 1
        return err

    assert "--vllm-python" in refusal("--target", "t", "--prompt", "x")
    py = ["--vllm-python", sys.executable]
    assert "needs --target" in refusal(*py, "--prompt", "x")
    assert "needs --prompt" in refusal(*py, "--target", "t")
    assert "needs a drafter" in refusal(*py, "--target", "t", "--prompt", "x", "--spec", "tli")
    assert "--reference transformers or vllm" in refusal(*py, "--target", "t", "--prompt", "x", "--reference", "x:y")
    assert "--target" in refusal(*py, "--target", str(tmp_path / "nothing"), "--prompt", "x", "--spec", "ngram")


def test_sample_runs_the_worker_and_reports_its_failure(tmp_path: Path) -> None:
    job = va.build_job("/t", [va.file_entry([[1]], ["a"], [3], str(tmp_path / "f.jsonl"), do_sample=True)], None)
    ok = _fake_python(tmp_path, "import json\nfor i in range(2): print(json.dumps({'draws': i}))\n")
    assert va.sample(ok, job) == [{"draws": 0}, {"draws": 1}]
    bad = _fake_python(tmp_path, "import sys\nprint('ImportError: no vllm here', file=sys.stderr)\nsys.exit(3)\n")
    with pytest.raises(va.VllmUnavailable, match=r"exit status 3; log .*f\.jsonl\.log\): ImportError: no vllm here"):
        va.sample(bad, job)


def test_sample_reports_the_draws_as_the_worker_appends_them(tmp_path: Path) -> None:
    """``sample(on_draw=)`` counts the lines the worker appends to each file while it runs (a line
    counted once whole), the ones a resumed file already holds first, and nothing twice. No timing
    luck: the fake worker writes half a line, then a whole one, and waits until hsd has reported that
    draw (a marker file the callback writes) before it writes the other four."""
    out, seen = tmp_path / "f.jsonl", tmp_path / "seen"
    out.write_text('{"resumed": 1}\n{"resumed": 2}\n')
    body = ("import json, os, time\n"
            f"out, seen = {str(out)!r}, {str(seen)!r}\n"
            "with open(out, 'a') as f:\n"
            "    f.write('{\"draw\": 0'); f.flush(); time.sleep(0.1)\n"
            "    f.write('}\\n'); f.flush()\n"
            "    deadline = time.monotonic() + 60\n"
            "    while not os.path.exists(seen) and time.monotonic() < deadline:\n"
            "        time.sleep(0.01)\n"
            "    for i in range(1, 5):\n"
            "        f.write('{\"draw\": ' + str(i) + '}\\n'); f.flush()\n"
            "print(json.dumps({'draws': 5}))\n")
    job = va.build_job("/t", [va.file_entry([[1]], ["a"], [3], str(out), do_sample=True)], None)
    calls: list[int] = []

    def on_draw(k: int) -> None:
        calls.append(k)
        if sum(calls) >= 3:
            seen.touch()

    assert va.sample(_fake_python(tmp_path, body), job, on_draw=on_draw, poll=0.02) == [{"draws": 5}]
    assert calls[:2] == [2, 1] and sum(calls) == 7, calls  # resumed first, then the draw alone, then the rest


def test_expand_kernel_fix_keeps_dtype_and_values() -> None:
    """The fix of vLLM-cpu's expand override: each request's value over its token span, in the
    output's own dtype (vLLM's CPU override leaves a float32 or int32 output uninitialized)."""
    import torch

    cu = torch.tensor([2, 5, 5, 6], dtype=torch.int32)  # a request with no drafts
    for x, want in [(torch.tensor([1.0, 0.7, 0.5, -1.0]), [1.0, 1.0, 0.7, 0.7, 0.7, 2.0]),
                    (torch.tensor([5, 7, 8, -1], dtype=torch.int32), [5, 5, 7, 7, 7, 2]),
                    (torch.tensor([5, 7, 8, -1]), [5, 5, 7, 7, 7, 2])]:
        out = torch.full((7,), 9, dtype=x.dtype)  # one slot past the tokens: left alone
        vw.expand_kernel_impl(out, x, cu, -1, 2)
        assert out.dtype == x.dtype
        assert torch.equal(out, torch.tensor(want + [9], dtype=x.dtype))


def _cpu_rejection_kernel(reject_negative: bool) -> Any:
    """A model of vLLM's rejection kernel with ``NO_DRAFT_PROBS`` (drafts carry q = 1, as ngram's), in its
    argument order: a draft is accepted when the target's probability of it is at least the row's uniform,
    read from the flat ``target_probs`` as the C++ kernel reads it (draft -1: the element before the row).
    ``reject_negative`` is the Triton kernel's ``draft_token_id < 0`` test, which vLLM-cpu 0.32.0 lacks."""
    def kernel(out: Any, cu: Any, drafts: Any, draft_probs: Any, target_probs: Any, bonus: Any, recovered: Any,
               uniform: Any, is_greedy: Any, max_spec_len: int, vocab_size: int, **kw: Any) -> None:
        flat, start = target_probs.reshape(-1), 0
        for row, end in enumerate(cu.tolist()):
            rejected = False
            for pos in range(end - start):
                t, d = start + pos, int(drafts[start + pos])
                accept = not (reject_negative and d < 0) and float(flat[t * vocab_size + d]) >= float(uniform[t])
                out[row, pos] = d if accept else recovered[t]
                if not accept:
                    rejected = True
                    break
            if not rejected:
                out[row, end - start] = bonus[row]
            start = end
    return kernel


def _rejection_call(rng: np.random.Generator, rows: list[list[int]], vocab: int = 6, k: int = 3) -> Any:
    """Arguments of a rejection-kernel call for rows of drafts (``[-1] * k``: a padded row), random laws and
    uniforms; the output starts as vLLM's ``PLACEHOLDER_TOKEN_ID`` everywhere."""
    import torch

    n = sum(len(r) for r in rows)
    probs = torch.tensor(rng.dirichlet(np.ones(vocab), size=n), dtype=torch.float32)
    return (torch.full((len(rows), k + 1), -1, dtype=torch.int32),
            torch.tensor(np.cumsum([len(r) for r in rows]), dtype=torch.int32),
            torch.tensor([d for r in rows for d in r], dtype=torch.int64), None, probs,
            torch.tensor(rng.integers(0, vocab, len(rows)), dtype=torch.int64),
            torch.tensor(rng.integers(0, vocab, n), dtype=torch.int64),
            torch.tensor(rng.random(n), dtype=torch.float64), None, k, vocab)


def test_placeholder_kept_by_the_cpu_kernel_is_rejected() -> None:
    """Issue 47: a padded row (drafts all -1) whose placeholder the CPU kernel keeps gets the recovered token
    at that position and nothing after it, as the Triton kernel gives; a real draft is untouched."""
    import torch

    lossy, wrapped = _cpu_rejection_kernel(False), vw.rejecting_placeholders(_cpu_rejection_kernel(False))
    args = list(_rejection_call(np.random.default_rng(0), [[2, 4, 1], [-1, -1, -1], [], [3]]))
    args[4][2, 5] = 1.0  # the element before token 3's law: the placeholder (flat draft 3) is read there, kept
    args[4][0, 2], args[7][0] = 1.0, 0.5  # the real draft 2 is accepted; its successor 4 too if p >= u
    args[4][1, 4], args[7][1] = 0.0, 0.5  # ... it is not: rejected, recovered at position 1
    out_lossy, out_fixed = args[0].clone(), args[0].clone()
    lossy(out_lossy, *args[1:])
    wrapped(out_fixed, *args[1:])
    rec = args[6].tolist()
    assert out_lossy[1, 0] == -1  # the fault: the placeholder kept, the row's first token drawn after it
    assert out_fixed[1].tolist() == [rec[3], -1, -1, -1]
    assert out_fixed[0].tolist() == out_lossy[0].tolist() == [2, rec[1], -1, -1]
    assert out_fixed[[2, 3]].tolist() == out_lossy[[2, 3]].tolist()
    assert vw.rejecting_placeholders(wrapped) is wrapped  # installed twice: wrapped once
    none = torch.full((1, 4), -1, dtype=torch.int32)  # no placeholder in the step: nothing to do
    assert vw.reject_kept_placeholders(none, torch.tensor([2]), torch.tensor([5, 6]), torch.tensor([1, 2])) == 0


def test_wrapped_cpu_kernel_equals_the_triton_rule() -> None:
    """Over 300 random steps (rows of real drafts, padded rows, rows without drafts), the wrapped CPU-kernel
    model gives exactly the output of the kernel that rejects every placeholder (a deterministic identity,
    whatever the seed), while the unwrapped one differs in some step (the model can fail)."""
    rng = np.random.default_rng(47)
    triton, lossy = _cpu_rejection_kernel(True), _cpu_rejection_kernel(False)
    wrapped = vw.rejecting_placeholders(lossy)
    differed = 0
    for _ in range(300):
        rows = [[-1] * 3 if c == 0 else list(rng.integers(0, 6, int(c) - 1)) for c in rng.integers(0, 5, 4)]
        args = _rejection_call(rng, rows)
        outs = [args[0].clone() for _ in range(3)]
        for kernel, out in zip((triton, lossy, wrapped), outs):
            kernel(out, *args[1:])
        assert outs[2].tolist() == outs[0].tolist(), rows
        differed += outs[1].tolist() != outs[0].tolist()
    assert differed > 0


def test_patch_cpu_expand_overrides_before_and_after_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[dict[str, Any]] = []

    def cpu_kernel(*args: Any) -> None:
        pass

    cpu_tl = types.SimpleNamespace(_expand_kernel_impl=None, _rejection_random_sample_kernel_impl=cpu_kernel)
    disp = types.SimpleNamespace(_registry={}, register_kernels=registered.append)
    monkeypatch.setitem(sys.modules, "vllm.utils.cpu_triton_utils", cpu_tl)
    monkeypatch.setitem(sys.modules, "vllm.triton_utils.dispatcher", disp)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    vw.patch_cpu_expand()  # not registered yet: the platform will register the module's attributes
    assert cpu_tl._expand_kernel_impl is vw.expand_kernel_impl and registered == []
    assert cpu_tl._rejection_random_sample_kernel_impl.__wrapped__ is cpu_kernel
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    disp._registry[vw.EXPAND_KERNEL] = object()  # registered already: registered again, fixed
    disp._registry[vw.REJECTION_KERNEL] = (object(), cpu_kernel)
    vw.patch_cpu_expand()
    assert registered[0] == {vw.EXPAND_KERNEL: vw.expand_kernel_impl}
    assert list(registered[1]) == [vw.REJECTION_KERNEL] and registered[1][vw.REJECTION_KERNEL].__wrapped__ is cpu_kernel
    assert cpu_tl._rejection_random_sample_kernel_impl.__wrapped__ is cpu_kernel  # not wrapped twice
    job = va.build_job("/t", [va.file_entry([[1]], ["a"], [3], "f.jsonl", do_sample=True)], None,
                       patch_vllm_cpu_expand=True)
    assert job["patch_vllm_cpu_expand"] is True
    assert "patch_vllm_cpu_expand" not in va.build_job("/t", job["files"], None)
    settings = vw.record_settings(job, {"max_new_tokens": 4}, "0.32.0")
    assert settings["engine"]["patch"] == vw.PATCH_NAME == "cpu-expand+reject-placeholders"
    assert "patch" not in vw.record_settings({}, {"max_new_tokens": 4}, "0.32.0")["engine"]


def test_worker_run_by_path_reaches_the_patch_without_hsd(tmp_path: Path) -> None:
    """vLLM's Python runs the worker as a script by path, without hsd: it loads its sibling
    ``vllm_cpu_patch.py`` by path and re-exports the patch (as ``vllm_server_launch`` and the reproducers use
    it); imported from hsd, the same names are the package module's. A fresh interpreter (``-I``: no
    PYTHONPATH) in an empty folder loads the worker as ``vllm_server_launch`` does and, as a script, reaches
    its usage line (exit 2) past the sibling's load."""
    import subprocess

    from hsd_torch.engines import vllm_cpu_patch

    assert vw.install_cpu_patch is vllm_cpu_patch.install_cpu_patch and vw.PATCH_NAME is vllm_cpu_patch.PATCH_NAME
    worker = Path(vw.__file__)
    probe = ("import importlib.util, sys\n"
             f"spec = importlib.util.spec_from_file_location('hsd_vllm_worker', {str(worker)!r})\n"
             "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
             "assert not any(m.startswith('hsd_torch') for m in sys.modules), 'hsd imported'\n"
             "print(w.install_cpu_patch.__module__, w.patch_cpu_expand.__module__, w.PATCH_NAME)\n")
    run = subprocess.run([sys.executable, "-I", "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["hsd_vllm_cpu_patch", "hsd_vllm_cpu_patch", vw.PATCH_NAME]
    script = subprocess.run([sys.executable, "-I", str(worker)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert script.returncode == 2 and "usage: vllm_worker.py" in script.stderr, script.stderr


def test_sample_mode_appends_each_chunk_and_resumes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 48, item 1, for the vLLM adapter: the worker appends each chunk of draws as it returns, so
    an engine that dies after the first chunk leaves a valid samples file with its draws; resuming
    asks vLLM only for the missing seeds and ends with the file of an uninterrupted run."""
    asked: list[int] = []
    die_after = [2]

    def generate(prompt: dict[str, Any], params: dict[str, Any]) -> Any:
        if len(asked) >= die_after[0]:
            raise RuntimeError("engine core died")
        asked.append(params["seed"])
        return _out([params["seed"] % 7, 1], prompt["prompt_token_ids"], "length")

    _fake_vllm(monkeypatch, generate)
    out = str(tmp_path / "s.jsonl")
    seeds = [30, 31, 32, 33, 34]

    def job(resume: bool, chunk: int = 2) -> dict[str, Any]:
        entry = va.file_entry([[4, 5], [6]], ["x", "y"], seeds, out, do_sample=True, max_new_tokens=2, resume=resume)
        entry["chunk"] = chunk
        return va.build_job("/folder", [entry], None, target_name="smol")

    with pytest.raises(RuntimeError, match="engine core died"):
        vw.run_sample(job(False), io.BytesIO())
    kept = read_samples(out)  # hsd's own reader: a valid samples file
    assert [d.seed for d in kept.draws] == [30, 31] and [d.ids for d in kept.draws] == [(2, 1), (3, 1)]
    with open(out, "a", encoding="utf-8") as f:
        f.write('{"format": "hsd-samples/1", "seed": 3')  # a line cut short by a crash
    asked.clear()
    die_after[0] = 99
    ch = io.BytesIO()
    vw.run_sample(job(True), ch)
    assert asked == [32, 33, 34] and json.loads(ch.getvalue())["resumed"] == 2
    whole = read_samples(out)
    assert [d.seed for d in whole.draws] == seeds and [d.ids for d in whole.draws] == [(s % 7, 1) for s in seeds]
    assert [d.prompt_ids for d in whole.draws] == [(4, 5), (6,), (4, 5), (6,), (4, 5)]
    fresh = str(tmp_path / "fresh.jsonl")  # the same draws, uninterrupted, in one chunk
    entry = va.file_entry([[4, 5], [6]], ["x", "y"], seeds, fresh, do_sample=True, max_new_tokens=2)
    vw.run_sample(va.build_job("/folder", [entry], None, target_name="smol"), io.BytesIO())
    assert read_samples(fresh).draws == tuple(dataclasses.replace(d, line=i + 1) for i, d in enumerate(whole.draws))
    other = va.file_entry([[4, 5], [6]], ["x", "y"], seeds, out, do_sample=True, temperature=0.5, max_new_tokens=2,
                          resume=True)
    with pytest.raises(ValueError, match="key 'sampling' .* resume only the run that wrote the file"):
        vw.run_sample(va.build_job("/folder", [other], None, target_name="smol"), io.BytesIO())
    strange = va.file_entry([[4, 5]], ["x"], [99], out, do_sample=True, max_new_tokens=2, resume=True)
    with pytest.raises(ValueError, match="seed 30 is not one of this job's seeds"):
        vw.run_sample(va.build_job("/folder", [strange], None, target_name="smol"), io.BytesIO())
