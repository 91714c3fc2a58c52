"""The vLLM adapter carries every processing parameter of a samples file's ``sampling``, and the
conformance matrix drives vLLM through its worker job (a fake here: vLLM is not installed; the real
run is ``slow`` + ``engines`` and needs ``HSD_VLLM_PYTHON``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hsd_core.samples import Draw, Sampling, write_samples
from hsd_torch.conformance.engines import Case
from hsd_torch.conformance.matrix import audit_case
from hsd_torch.engines import vllm_worker as vw


def test_sampling_kwargs_carry_every_parameter() -> None:
    s = Sampling(True, 0.7, 3, 0.9, 4, min_p=0.1, repetition_penalty=1.2, presence_penalty=0.5,
                 frequency_penalty=0.3, logit_bias=((101, 2.0),), allowed_token_ids=(2, 262), min_tokens=2,
                 stop=(".",), order="vllm")
    kw = vw.sampling_kwargs(s.to_json(), 5)
    assert kw == {"max_tokens": 4, "seed": 5, "detokenize": True, "temperature": 0.7, "top_k": 3, "top_p": 0.9,
                  "min_p": 0.1, "repetition_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": 0.3,
                  "logit_bias": {101: 2.0}, "allowed_token_ids": [2, 262], "min_tokens": 2, "stop": ["."]}
    with pytest.raises(ValueError, match="bad_words_ids"):
        vw.sampling_kwargs(Sampling(True, 1.0, None, None, 3, bad_words_ids=((5,),), order="vllm").to_json(), 1)
    with pytest.raises(ValueError, match="llama.cpp"):
        vw.sampling_kwargs(Sampling(True, 1.0, None, None, 3, min_p=0.1, order="llama.cpp").to_json(), 1)
    rec = vw.record_settings({"target": "t"}, s.to_json(), "0.32.0")["sampling"]
    assert rec["order"] == "vllm" and rec["logit_bias"] == {"101": 2.0} and rec["stop"] == ["."]


class FakeWorker:
    """Stands for ``vllm_audit.sample``: writes each file's draws with vLLM's record settings, the
    ids from the kit's exact law sampled by numpy (a lossless engine)."""

    def __init__(self) -> None:
        self.jobs: list[dict[str, Any]] = []

    def __call__(self, python: str, job: dict[str, Any], timeout: float | None = None) -> list[dict[str, Any]]:
        import numpy as np

        from hsd_core import conformance as kc

        self.jobs.append(job)
        for f in job["files"]:
            settings = vw.record_settings(job, f["sampling"], "fake")
            from hsd_core.samples import parse_samples

            s = parse_samples([json.dumps({**settings, "seed": 0, "prompt_ids": [1], "ids": [2]})]).sampling
            law = kc.sequence_law(kc.kit_model("target"), f["requests"][0]["prompt_ids"], s)
            seqs = list(law)
            p = np.array([law[q][0] for q in seqs])
            draws = []
            for r in f["requests"]:
                q = seqs[np.random.default_rng(r["seed"]).choice(len(seqs), p=p / p.sum())]
                draws.append(Draw(q, r["seed"], None, tuple(r["prompt_ids"]), law[q][1]))
            write_samples(f["out"], draws, engine=settings["engine"], sampling=settings["sampling"],
                          speculative=settings["speculative"], target=settings["target"])
        return [{}]


def test_vllm_engine_through_a_fake_worker(tmp_path: Path) -> None:
    from hsd_torch.conformance.vllm_engine import VllmEngine

    fake = FakeWorker()
    eng = VllmEngine(tmp_path / "kit", python="python", sample_job=fake)
    s = Sampling(True, 1.0, None, None, 3, min_p=0.15, logit_bias=((101, 2.0),), order="vllm")
    r = audit_case(eng, "vllm", Case(tmp_path / "kit", (1,), s, "draft_model", "drafter",
                                     {"num_speculative_tokens": 3}), "x", 400, 1e-3, tmp_path / "o" / "x.jsonl")
    assert r.outcome == "conforms", r.reason
    job = fake.jobs[0]
    assert job["speculative"]["method"] == "draft_model" and job["files"][0]["sampling"]["min_p"] == 0.15
    assert job["max_model_len"] == 1024  # no kit config here: the default


def test_vllm_engine_asks_no_longer_context_than_the_kit(tmp_path: Path) -> None:
    """vLLM refuses a ``max_model_len`` above the checkpoint's ``max_position_embeddings`` (the kit's
    is 512): the engine takes the kit's."""
    from hsd_torch.conformance.kit import build_kit
    from hsd_torch.conformance.vllm_engine import VllmEngine

    build_kit(tmp_path / "kit", gguf=False)
    limit = json.loads((tmp_path / "kit" / "target" / "config.json").read_text())["max_position_embeddings"]
    fake = FakeWorker()
    eng = VllmEngine(tmp_path / "kit", python="python", sample_job=fake)
    r = audit_case(eng, "vllm", Case(tmp_path / "kit", (1,), Sampling(True, 1.0, None, None, 3), "ngram"), "x", 50,
                   1e-3, tmp_path / "o" / "x.jsonl")
    assert r.outcome == "conforms", r.reason
    assert fake.jobs[0]["max_model_len"] == limit < 1024
    r = audit_case(eng, "vllm", Case(tmp_path / "kit", (1,), Sampling(True, 1.0, None, None, 3), "ngram"), "x", 50,
                   1e-3, tmp_path / "o" / "x.jsonl")
    assert r.outcome == "conforms" and len(fake.jobs) == 1  # the file holds every seed: no engine started again
    bad = Sampling(True, 1.0, None, None, 3, bad_words_ids=((5,),), order="vllm")
    r = audit_case(eng, "vllm", Case(tmp_path / "kit", (1,), bad, "none"), "y", 10, 1e-3, tmp_path / "o" / "y.jsonl")
    assert r.outcome == "refused" and "bad_words_ids" in r.reason


@pytest.mark.slow
@pytest.mark.engines
def test_vllm_real_run(vllm_python: str, tmp_path: Path) -> None:
    from hsd_torch.conformance.kit import build_kit
    from hsd_torch.conformance.matrix import CASES, run_matrix

    build_kit(tmp_path / "kit", gguf=False)
    rows = run_matrix(tmp_path / "kit", ["vllm"], modes=["ngram"], cases=[c for c in CASES if c.name == "plain"],
                      n=200, out=tmp_path / "o")
    assert rows and all(r.outcome in ("conforms", "lossy", "refused") for r in rows), [r.reason for r in rows]


@pytest.mark.slow
@pytest.mark.engines
def test_shipped_patch_keeps_no_placeholder_in_a_mixed_batch(vllm_python: str, tmp_path: Path) -> None:
    """Issue 47: through hsd's patch (the reproducer's ``--patched``: ``vllm_worker.install_cpu_patch``), 200
    one-id requests that join running ones are all padded with placeholder drafts, none keeps one, and none
    has a first token of probability 0 (expand fix alone: about 1 in 100 does, docs/conformance.md)."""
    import ast
    import os
    import subprocess

    from hsd_torch.conformance.kit import build_kit

    build_kit(tmp_path / "kit", gguf=False)
    repro = Path(__file__).resolve().parents[2] / "bench" / "engines" / "vllm_mixed_batch_repro.py"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    run = subprocess.run([vllm_python, str(repro), str(tmp_path / "kit"), "--patched", "--n", "200"], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = {ln.split(":", 1)[0]: ln for ln in run.stdout.splitlines()}
    assert lines["late prompt [1] ; outside the support (101, 102, 262, 265, 268) "].endswith(": 0"), run.stdout
    trace = ast.literal_eval(lines["rejection_sample rows without drafts"].split(":", 1)[1].strip())
    assert trace["rows whose drafts are all placeholders (-1)"] == 200, trace
    assert trace["of them, placeholder accepted at position 0"] == 0, trace


def test_a_request_vllm_refuses_is_a_refusal_and_other_failures_crash(tmp_path: Path) -> None:
    """vLLM 0.32 refuses min-p and logit bias with speculation (``VLLMValidationError`` in the
    worker's log): the matrix records that as ``refused`` with vLLM's message; any other failure of
    the worker stays a crash."""
    from hsd_torch.conformance.vllm_engine import VllmEngine, validation_error
    from hsd_torch.engines.vllm_audit import VllmUnavailable

    tail = ("the vLLM worker failed (exit status 1; log x.log): [rank0]:     raise VLLMValidationError( | [rank0]: "
            "vllm.exceptions.VLLMValidationError: The min_p and logit_bias sampling parameters are not yet supported "
            "with speculative decoding. | done")
    crash = "the vLLM worker failed (exit status 1; log x.log): RuntimeError: max(): Expected reduction dim"

    def failing(message: str) -> Any:
        def job(python: str, job: dict[str, Any], timeout: float | None = None) -> list[dict[str, Any]]:
            raise VllmUnavailable(message)
        return job

    assert validation_error(crash) is None
    assert validation_error(tail) == ("vLLM refuses the request: The min_p and logit_bias sampling parameters are not "
                                      "yet supported with speculative decoding.")
    s = Sampling(True, 1.0, None, None, 3, min_p=0.15, order="vllm")
    case = Case(tmp_path / "kit", (1,), s, "ngram", None, {"num_speculative_tokens": 3})
    r = audit_case(VllmEngine(tmp_path / "kit", python="python", sample_job=failing(tail)), "vllm", case, "x", 10,
                   1e-3, tmp_path / "o" / "x.jsonl")
    assert r.outcome == "refused" and "not yet supported with speculative decoding" in r.reason
    r = audit_case(VllmEngine(tmp_path / "kit", python="python", sample_job=failing(crash)), "vllm", case, "y", 10,
                   1e-3, tmp_path / "o" / "y.jsonl")
    assert r.outcome == "crashed" and "max()" in r.reason
