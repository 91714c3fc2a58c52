"""The conformance kit as files (hsd_torch.conformance): two builds give the same bytes; transformers
loads each folder and its float64 forward gives the kit's reference laws; the GGUF exports read back
(gguf's reader, and transformers' GGUF loader) to the same laws; target_pos's law is the float64
forward of its weights with Hugging Face's RoPE; the tokenizers write Ġ/Ċ and ▁/<0x0A>;
``hsd conformance kit`` runs through ``python -m hsd_core.cli``; the samples audit refuses processing it
does not apply."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hsd_core import conformance as kc
from hsd_core.samples import FORMAT, parse_samples
from hsd_torch.auditing.samples import check_applicable
from hsd_torch.conformance.kit import build_kit

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kit")
    build_kit(out)
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_two_builds_give_the_same_bytes(kit: Path, tmp_path: Path) -> None:
    build_kit(tmp_path)
    a, b = _files(kit), _files(tmp_path)
    assert set(a) >= {"target/model.safetensors", "target/tokenizer.json", "gguf/target.gguf", "gguf/drafter.gguf",
                      "gguf/target_pos.gguf", "kit.json"}
    assert a == b
    man = json.loads(a["kit.json"])
    assert man["gguf"] == [f"gguf/{r}.gguf" for r in ("target", "drafter", "target_pos")]
    assert man["gguf_rope_layout"].startswith("llama.cpp")


def _tv(logits: np.ndarray, ref: np.ndarray) -> float:
    p = np.exp(logits - logits.max())
    q = np.exp(ref - ref.max())
    return float(0.5 * np.abs(p / p.sum() - q / q.sum()).sum())


@pytest.mark.parametrize("role", kc.ROLES)
def test_transformers_forward_gives_the_reference_law(kit: Path, role: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    km = kc.kit_model(role)
    tok = AutoTokenizer.from_pretrained(kit / role)
    model = AutoModelForCausalLM.from_pretrained(kit / role, dtype=torch.float64)
    ids = tok(" the cat sat.\n the dog on")["input_ids"]
    assert ids[0] == kc.BOS and tok.decode(ids[1:]) == " the cat sat.\n the dog on"
    pieces = tok.convert_ids_to_tokens(ids)
    assert ("Ċ" in pieces and "Ġcat" in pieces) if role != "drafter_sp" else ("<0x0A>" in pieces and "▁ca" in pieces)
    with torch.no_grad():
        lg = model(torch.tensor([ids])).logits[0].numpy()
    # transformers' RMSNorm runs in float32 even in a float64 forward: laws agree to ~1e-8 (dead logits to 1e-3)
    assert max(_tv(lg[j], km.logits(ids[:j + 1])) for j in range(len(ids))) < 1e-6


@pytest.mark.parametrize("role", ["target", "drafter", "drafter_sp"])
def test_the_float64_forward_is_the_closed_form(role: str) -> None:
    """forward64 (the NumPy Llama forward target_pos's law comes from) gives the closed form's logits on
    the roles that have one: the two computations check each other."""
    km = kc.kit_model(role)
    ids = [kc.BOS] + [km.id_of_text[t] for t in (" the", " dog", " sat", ".", "\n", " the")]
    got = kc.forward64(km.weights, ids)
    want = np.stack([km.logits(ids[:j + 1]) for j in range(len(ids))])
    assert np.abs(got - want).max() < 1e-9


def test_target_pos_is_hugging_faces_rope_and_copies_the_id_two_back(kit: Path) -> None:
    """target_pos's law moves with position ids as transformers' Llama RoPE moves it: its float64
    forward at positions 0..n-1 is the reference (TV < 1e-6 at every position), the same ids at
    positions moved by 3 after the fourth are not (TV > 0.3 at the first moved query: the head misses the
    previous id), and the designed law holds: the id two back has probability above 0.5 (copy bonus
    COPY_BONUS on flat rows)."""
    from transformers import AutoModelForCausalLM

    km = kc.kit_model("target_pos")
    ids = [kc.BOS] + [km.id_of_text[t] for t in (" the", " cat", " the", " cat", " sat", ".", " on")]
    x = torch.tensor([ids])
    model = AutoModelForCausalLM.from_pretrained(kit / "target_pos", dtype=torch.float64)
    moved = torch.tensor([list(range(4)) + [p + 3 for p in range(4, len(ids))]])
    with torch.no_grad():
        lg, lg_moved = (model(x, position_ids=pos).logits[0].numpy() for pos in (None, moved))
    ref = np.stack([km.logits(ids[:j + 1]) for j in range(len(ids))])
    assert max(_tv(lg[j], ref[j]) for j in range(len(ids))) < 1e-6
    assert _tv(lg_moved[4], ref[4]) > 0.3
    for j in range(2, len(ids)):
        p = np.exp(ref[j] - ref[j].max())
        assert p[ids[j - 1]] / p.sum() > 0.5, j


def test_gguf_reads_back(kit: Path) -> None:
    import gguf
    from transformers import AutoModelForCausalLM

    km = kc.kit_model("target")
    r = gguf.GGUFReader(str(kit / "gguf" / "target.gguf"))
    fields = {f.name: f for f in r.fields.values()}
    assert bytes(fields["tokenizer.ggml.model"].parts[-1]).decode() == "gpt2"
    assert len(fields["tokenizer.ggml.tokens"].data) == km.vocab_size
    assert len(fields["tokenizer.ggml.merges"].data) == len(km.merges)
    tensors = {t.name: np.asarray(t.data) for t in r.tensors}
    assert np.array_equal(tensors["output.weight"].reshape(km.vocab_size, kc.HIDDEN), km.weights["lm_head.weight"])
    model = AutoModelForCausalLM.from_pretrained(kit / "gguf", gguf_file="target.gguf", dtype=torch.float32)
    ids = [kc.BOS, km.id_of_text[" the"], km.id_of_text[" cat"], km.id_of_text["."]]
    with torch.no_grad():
        lg = model(torch.tensor([ids])).logits[0].double().numpy()
    assert max(_tv(lg[j], km.logits(ids[:j + 1])) for j in range(len(ids))) < 1e-5


def test_llama_rope_layout_moves_each_rotary_pair_to_adjacent_rows() -> None:
    """to_llama_rope puts Hugging Face's pair i of each head (rows i and i + head_dim/2) at rows 2i and
    2i + 1 of that head (checked row by row against that definition, on distinct values), and
    from_llama_rope undoes it; a shape that does not split into heads of an even size is refused."""
    from hsd_torch.conformance.kit import from_llama_rope, to_llama_rope

    heads, hd, d_in = 3, 8, 5
    w = np.arange(heads * hd * d_in, dtype=np.float32).reshape(heads * hd, d_in)
    got = to_llama_rope(w, heads)
    for h in range(heads):
        for i in range(hd // 2):
            assert np.array_equal(got[h * hd + 2 * i], w[h * hd + i])
            assert np.array_equal(got[h * hd + 2 * i + 1], w[h * hd + hd // 2 + i])
    assert got.dtype == w.dtype and not np.array_equal(got, w)
    assert np.array_equal(from_llama_rope(got, heads), w)
    km = kc.kit_model("target_pos")
    q = km.weights["model.layers.0.self_attn.q_proj.weight"]
    assert np.array_equal(from_llama_rope(to_llama_rope(q, kc.HEADS), kc.HEADS), q)
    with pytest.raises(ValueError, match="heads of an even size"):
        to_llama_rope(w, 5)
    with pytest.raises(ValueError, match="heads of an even size"):
        from_llama_rope(np.zeros((6, 2)), 2)


def test_target_pos_gguf_holds_q_and_k_in_llama_cpps_layout(kit: Path, tmp_path: Path) -> None:
    """gguf/target_pos.gguf: every tensor of the export, shapes as the HF checkpoint's, q and k reordered
    (and only they: the previous-token head lives in them), the rest the HF weights as stored;
    transformers' GGUF loader (which undoes llama.cpp's reordering) reads it back to forward64's law
    (TV < 1e-5 at every position), while an export that leaves q and k in Hugging Face's layout reads
    back to another law (TV > 0.3: the head misses the previous id)."""
    import gguf
    from transformers import AutoModelForCausalLM

    from hsd_torch.conformance.kit import from_llama_rope, gguf_tensors, write_gguf

    km = kc.kit_model("target_pos")
    r = gguf.GGUFReader(str(kit / "gguf" / "target_pos.gguf"))
    tensors = {t.name: np.asarray(t.data) for t in r.tensors}
    want = gguf_tensors(km)
    assert set(tensors) == set(want) and len(want) == 12
    hf = gguf_tensors(km, rope_layout="hf")
    p = "model.layers.0.self_attn."
    for name, heads, hf_name in (("blk.0.attn_q.weight", kc.HEADS, p + "q_proj.weight"),
                                 ("blk.0.attn_k.weight", kc.KV_HEADS, p + "k_proj.weight")):
        got = tensors[name].reshape(km.weights[hf_name].shape)
        assert np.count_nonzero(got) > 0 and not np.array_equal(got, km.weights[hf_name])
        assert np.array_equal(from_llama_rope(got, heads), km.weights[hf_name])
    for name, t in hf.items():
        if name not in ("blk.0.attn_q.weight", "blk.0.attn_k.weight"):
            assert np.array_equal(tensors[name].reshape(t.shape), t), name
    ids = [kc.BOS] + [km.id_of_text[t] for t in (" the", " cat", " the", " dog", " sat", ".")]
    ref = np.stack([km.logits(ids[:j + 1]) for j in range(len(ids))])
    wrong = write_gguf(km, tmp_path / "target_pos_hf_layout.gguf", rope_layout="hf")
    tvs = []
    for folder, name in ((kit / "gguf", "target_pos.gguf"), (wrong.parent, wrong.name)):
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        with torch.no_grad():
            lg = model(torch.tensor([ids])).logits[0].double().numpy()
        tvs.append(max(_tv(lg[j], ref[j]) for j in range(len(ids))))
    assert tvs[0] < 1e-5 and tvs[1] > 0.3, tvs


def test_the_command_through_hsd_core_cli(tmp_path: Path) -> None:
    """``hsd conformance`` is an ``hsd.commands`` entry point; a metadata folder naming it (as an install of
    this tree's pyproject would) makes ``python -m hsd_core.cli conformance kit`` run it."""
    meta = tmp_path / "meta" / "hsd_conformance_probe-0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: hsd-conformance-probe\nVersion: 0\n")
    ep = [line for line in (ROOT / "pyproject.toml").read_text().splitlines() if line.startswith("conformance = ")]
    assert ep == ['conformance = "hsd_torch.conformance:COMMAND"']
    (meta / "entry_points.txt").write_text("[hsd.commands]\nconformance = hsd_torch.conformance:COMMAND\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path / "meta")]))
    out = subprocess.run([sys.executable, "-m", "hsd_core.cli", "conformance", "kit", "--out", str(tmp_path / "k"),
                          "--no-gguf"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "k" / "kit.json").read_text())["shapes"]["head_dim"] == 64
    bad = subprocess.run([sys.executable, "-m", "hsd_core.cli", "conformance", "kit", "--out",
                          str(tmp_path / "k" / "kit.json")], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "is a file" in bad.stderr


def test_the_samples_audit_refuses_processing_it_does_not_apply() -> None:
    base = {"format": FORMAT, "engine": {"name": "e", "version": "1"}, "speculative": None, "seed": 1,
            "prompt_ids": [1, 2], "ids": [3]}
    plain = {"do_sample": True, "temperature": 1.0, "top_k": None, "top_p": 0.9, "max_new_tokens": 4}
    check_applicable(parse_samples([json.dumps({**base, "sampling": {**plain, "order": "vllm"}})]))
    for extra in ({"min_tokens": 24, "logit_bias": {"30": 5}, "order": "vllm"}, {"order": "llama.cpp"}):
        f = parse_samples([json.dumps({**base, "sampling": {**plain, **extra}})])
        with pytest.raises(NotImplementedError, match="samples audit applies temperature, top-k and top-p"):
            check_applicable(f)


def test_tli_resyncs_to_the_ids_the_kits_explicit_models_hold(kit: Path) -> None:
    """hsd_torch's bridge maps each target id to the drafter id the drafter's tokenizer writes its text as,
    which is the one id per text the kit's explicit models (``toy_ids``) hold: ``b`` is the piece 262, not the
    lower byte fallback ``<0x62>`` (102) that the lowest-id rule once picked, so hsd_torch's TLI fed the
    drafter a context the exact expected acceptance does not describe (``docs/conformance.md``)."""
    from transformers import AutoTokenizer

    from hsd_torch.vocab import VocabBridge

    T, D = kc.kit_model("target"), kc.kit_model("drafter_sp")
    br = VocabBridge(AutoTokenizer.from_pretrained(kit / "target"), AutoTokenizer.from_pretrained(kit / "drafter_sp"),
                     target_eos_id=kc.EOS, drafter_eos_id=kc.EOS)
    held = set(kc.toy_ids(D))
    shared = 0
    for t in kc.toy_ids(T):
        text = T.texts[t]
        want = [d for d in held if D.texts[d] == text]
        assert br.to_drafter[t].item() == (want[0] if want else -1), text
        shared += bool(want)
    assert shared > 20 and D.tokens.index("<0x62>") < D.id_of_text["b"] == br.to_drafter[T.id_of_text["b"]].item()
    assert br.to_target[D.tokens.index("<0x62>")].item() == br.to_target[D.id_of_text["b"]].item() == T.id_of_text["b"]


@pytest.mark.parametrize("t, k, p", [(1.0, None, None), (0.7, 5, None), (1.3, None, 0.8), (0.5, 12, 0.6)])
def test_hsd_torch_processing_is_hsd_core_vllm_order(t: float, k: int | None, p: float | None) -> None:
    """The backend's processed law (temperature, top-k, top-p) is the reference's vLLM-order law, float64."""
    from hsd_core.processing import next_law
    from hsd_core.samples import Sampling
    from hsd_torch.engine.laws import process_logits

    x = np.random.default_rng(5).normal(0, 2, 40)
    got = process_logits(torch.tensor(x), torch.ones(40, dtype=torch.bool), t, k, p).numpy()
    want = next_law(x, Sampling(True, t, k, p, 1, order="vllm"), [], [], ())
    assert np.abs(got - want).max() < 1e-12
