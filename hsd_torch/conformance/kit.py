"""Write the conformance kit (:mod:`hsd_core.conformance`) as files real engines load natively.

``build_kit(out)`` writes, in seconds and with the same bytes on every build (no randomness: the
weights are the design's, :attr:`hsd_core.conformance.KitModel.weights`):

* ``out/target``, ``out/drafter``, ``out/drafter_sp``, ``out/target_pos``: Hugging Face folders (``config.json``,
  ``generation_config.json``, ``model.safetensors`` in float32, ``tokenizer.json`` and its
  config): ``LlamaForCausalLM``, one layer, hidden 512, 8 heads of 64, 2 KV heads, MLP 128, untied
  head. The target, ``drafter`` and ``target_pos`` (the positional target: a previous-token head under
  RoPE) share a byte-level BPE tokenizer (``Ġ``, ``Ċ``); ``drafter_sp`` has a SentencePiece-style BPE
  with byte fallback (``▁``, ``<0x0A>``). Both tokenizers prepend BOS.
* ``out/gguf/target.gguf``, ``out/gguf/drafter.gguf``, ``out/gguf/target_pos.gguf`` (:data:`GGUF_ROLES`):
  the byte-level BPE models for llama.cpp (``general.architecture`` llama, F32 tensors, tokenizer
  ``gpt2`` with its tokens, types, scores and merges, BOS added), q and k in llama.cpp's rotary layout
  (:func:`to_llama_rope`: llama.cpp's llama graph turns adjacent coordinates ``2i, 2i + 1`` of a head
  as pair ``i``, Hugging Face's turns ``i, i + head_dim/2``, so the rows of q and k are reordered per
  head as llama.cpp's own converter does). The target's and drafter's q and k are zero (the reordering
  leaves their bytes as they were); ``target_pos``'s previous-token head lives in them.
* ``out/kit.json``: the manifest (shapes, ids, the designed features and the live ids, the GGUF files
  and their rotary layout).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from hsd_core import conformance as kc

__all__ = ["GGUF_ROLES", "build_kit", "from_llama_rope", "gguf_tensors", "hf_config", "manifest", "to_llama_rope",
           "write_gguf", "write_hf"]

GGUF_ROLES = ("target", "drafter", "target_pos")
"""The kit roles exported as GGUF (``gguf/ROLE.gguf``): every byte-level BPE model, the ones llama.cpp's
server runs with the target's vocabulary (``drafter_sp`` has another tokenizer and is not exported)."""


def hf_config(m: kc.KitModel) -> dict[str, Any]:
    """The ``config.json`` of a kit checkpoint (LlamaForCausalLM; keys in a fixed order)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": m.vocab_size,
            "hidden_size": kc.HIDDEN, "intermediate_size": kc.INTERMEDIATE, "num_hidden_layers": kc.LAYERS,
            "num_attention_heads": kc.HEADS, "num_key_value_heads": kc.KV_HEADS, "head_dim": kc.HEAD_DIM,
            "hidden_act": "silu", "max_position_embeddings": 512, "rms_norm_eps": kc.RMS_EPS,
            "rope_theta": 10000.0, "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
            "bos_token_id": kc.BOS, "eos_token_id": kc.EOS, "pad_token_id": kc.PAD, "torch_dtype": "float32"}


def _tokenizer(m: kc.KitModel) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(m.tokens)}
    merges = [(a, b) for a, b in m.merges]
    if m.kind == "byte_bpe":
        tok = Tokenizer(models.BPE(vocab, merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    else:
        tok = Tokenizer(models.BPE(vocab, merges, unk_token=kc.SPECIALS[kc.UNK], byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in kc.SPECIALS])
    bos = kc.SPECIALS[kc.BOS]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                       special_tokens=[(bos, kc.BOS)])
    from transformers import PreTrainedTokenizerFast

    cls: Any = PreTrainedTokenizerFast
    unk, bos_s, eos, pad = kc.SPECIALS
    return cls(tokenizer_object=tok, unk_token=unk, bos_token=bos_s, eos_token=eos, pad_token=pad)


def write_hf(m: kc.KitModel, folder: Path) -> Path:
    """Write ``m`` as a Hugging Face folder (module docstring) and return it."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in sorted(m.weights.items())}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_config(m), indent=2) + "\n", encoding="utf-8")
    gen = {"bos_token_id": kc.BOS, "eos_token_id": kc.EOS, "pad_token_id": kc.PAD, "do_sample": True}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n", encoding="utf-8")
    _tokenizer(m).save_pretrained(str(folder))
    return folder


def to_llama_rope(w: np.ndarray, heads: int) -> np.ndarray:
    """The rows of a q or k projection ``w`` (``[heads * head_dim, in]``, Hugging Face's layout) in
    llama.cpp's rotary layout: within each head's ``head_dim`` rows, Hugging Face's rotary pair ``i``
    (rows ``i`` and ``i + head_dim/2``, rotate-half) becomes rows ``2i`` and ``2i + 1`` (llama.cpp's
    llama graph turns adjacent coordinates: ``LLAMA_ROPE_TYPE_NORM``). A copy, same dtype; ``ValueError``
    unless the rows split into ``heads`` heads of an even size. :func:`from_llama_rope` undoes it."""
    rows = w.shape[0]
    if heads <= 0 or rows % heads or (rows // heads) % 2:
        raise ValueError(f"{rows} rows do not split into {heads} heads of an even size")
    half = rows // heads // 2
    # [heads, 2 (first or second half), half, ...] -> [heads, half, 2, ...]: row 2i + j of a head is row j*half + i
    out: np.ndarray = np.ascontiguousarray(w.reshape(heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))
    return out


def from_llama_rope(w: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of :func:`to_llama_rope`: llama.cpp's interleaved rows back to Hugging Face's halves."""
    rows = w.shape[0]
    if heads <= 0 or rows % heads or (rows // heads) % 2:
        raise ValueError(f"{rows} rows do not split into {heads} heads of an even size")
    half = rows // heads // 2
    out: np.ndarray = np.ascontiguousarray(w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))
    return out


def gguf_tensors(m: kc.KitModel, rope_layout: str = "llama.cpp") -> dict[str, np.ndarray]:
    """``m``'s tensors under llama.cpp's names: the same float32 arrays in HF's ``[out, in]`` layout,
    except q (:data:`~hsd_core.conformance.HEADS` heads) and k (``KV_HEADS`` heads), whose rows are in
    llama.cpp's rotary layout (:func:`to_llama_rope`). ``rope_layout="hf"`` leaves them as Hugging
    Face orders them: a wrong export, kept only so that a check can show that the reordering matters."""
    if rope_layout not in ("llama.cpp", "hf"):
        raise ValueError(f"rope_layout must be 'llama.cpp' or 'hf', got {rope_layout!r}")
    w = m.weights
    p = "model.layers.0."
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight", "blk.0.attn_norm.weight": p + "input_layernorm.weight",
             "blk.0.ffn_norm.weight": p + "post_attention_layernorm.weight",
             "blk.0.attn_q.weight": p + "self_attn.q_proj.weight", "blk.0.attn_k.weight": p + "self_attn.k_proj.weight",
             "blk.0.attn_v.weight": p + "self_attn.v_proj.weight",
             "blk.0.attn_output.weight": p + "self_attn.o_proj.weight", "blk.0.ffn_gate.weight": p + "mlp.gate_proj.weight",
             "blk.0.ffn_up.weight": p + "mlp.up_proj.weight", "blk.0.ffn_down.weight": p + "mlp.down_proj.weight"}
    out = {g: np.ascontiguousarray(w[h]) for g, h in names.items()}
    if rope_layout == "llama.cpp":
        out["blk.0.attn_q.weight"] = to_llama_rope(out["blk.0.attn_q.weight"], kc.HEADS)
        out["blk.0.attn_k.weight"] = to_llama_rope(out["blk.0.attn_k.weight"], kc.KV_HEADS)
    return out


def write_gguf(m: kc.KitModel, path: Path, rope_layout: str = "llama.cpp") -> Path:
    """Write ``m`` (a byte-level BPE kit model) as a GGUF file llama.cpp loads: architecture llama, F32
    tensors (:func:`gguf_tensors`: q and k in ``rope_layout``, llama.cpp's unless a check asks for the
    wrong one), tokenizer ``gpt2`` (tokens, token types: control for the specials, scores 0, merges),
    BOS, EOS, PAD and UNK ids, BOS added. The same bytes on every call."""
    import gguf

    if m.kind != "byte_bpe":
        raise ValueError("the kit exports only its byte-level BPE models to GGUF")
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"hsd-conformance-{m.role}")
    w.add_context_length(512)
    w.add_embedding_length(kc.HIDDEN)
    w.add_block_count(kc.LAYERS)
    w.add_feed_forward_length(kc.INTERMEDIATE)
    w.add_head_count(kc.HEADS)
    w.add_head_count_kv(kc.KV_HEADS)
    w.add_key_length(kc.HEAD_DIM)
    w.add_value_length(kc.HEAD_DIM)
    w.add_rope_dimension_count(kc.HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(kc.RMS_EPS)
    w.add_vocab_size(m.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(list(m.tokens))
    w.add_token_types([int(gguf.TokenType.CONTROL) if i < len(kc.SPECIALS) else int(gguf.TokenType.NORMAL)
                       for i in range(m.vocab_size)])
    w.add_token_scores([0.0] * m.vocab_size)
    w.add_token_merges([f"{a} {b}" for a, b in m.merges])
    w.add_bos_token_id(kc.BOS)
    w.add_eos_token_id(kc.EOS)
    w.add_pad_token_id(kc.PAD)
    w.add_unk_token_id(kc.UNK)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    for name, t in gguf_tensors(m, rope_layout).items():
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def manifest() -> dict[str, Any]:
    """``kit.json``: the shapes, the special ids, each model's live ids and the designed features."""
    models = {r: kc.kit_model(r) for r in kc.ROLES}
    return {"format": "hsd-conformance-kit/1",
            "shapes": {"architecture": "LlamaForCausalLM", "hidden_size": kc.HIDDEN, "head_dim": kc.HEAD_DIM,
                       "num_attention_heads": kc.HEADS, "num_key_value_heads": kc.KV_HEADS,
                       "intermediate_size": kc.INTERMEDIATE, "num_hidden_layers": kc.LAYERS, "dtype": "float32"},
            "special_ids": {"unk": kc.UNK, "bos": kc.BOS, "eos": kc.EOS, "pad": kc.PAD},
            "top_p_boundary": kc.TOP_P, "clock": kc.CLOCK, "eos_rise": kc.EOS_RISE,
            "models": {r: {"tokenizer": m.kind, "vocab_size": m.vocab_size,
                           "live": {str(i): m.texts[i].decode() or m.tokens[i] for i in m.live_ids}}
                       for r, m in models.items()},
            "gguf": [f"gguf/{r}.gguf" for r in GGUF_ROLES],
            "gguf_rope_layout": "llama.cpp: q and k rows of each head interleaved, Hugging Face's rotary pair i "
                                "(rows i, i + head_dim/2) at rows 2i, 2i + 1"}


def build_kit(out: str | os.PathLike[str], gguf: bool = True) -> dict[str, Path]:
    """Write the kit into ``out`` (module docstring); returns each file or folder written by name."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for role in kc.ROLES:
        paths[role] = write_hf(kc.kit_model(role), root / role)
    if gguf:
        for role in GGUF_ROLES:
            paths[f"gguf/{role}"] = write_gguf(kc.kit_model(role), root / "gguf" / f"{role}.gguf")
    (root / "kit.json").write_text(json.dumps(manifest(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    paths["manifest"] = root / "kit.json"
    return paths
