"""Model files that are damaged or do not match: one error line naming the file and the fix.

Small synthetic files only (a 2-layer Llama of 64 ids, part packages of a few bytes made on the
spot as installed distributions): the Qwen2.5-Coder sources' joining and hash check, a truncated
GGUF file, and ``save_pretrained`` folders whose ``model.safetensors`` is truncated, zeroed, empty
or gone, or whose ``config.json`` disagrees with the weights (the case ``from_pretrained`` would
otherwise fill with random weights). The real models themselves load in the slow tier.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_torch.models import real as rm  # noqa: E402


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64)
    folder = tmp_path_factory.mktemp("tiny") / "good"
    LlamaForCausalLM(cfg).eval().save_pretrained(folder)
    return folder


def _cut(folder: Path) -> None:
    p = folder / "model.safetensors"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _zero(folder: Path) -> None:
    p = folder / "model.safetensors"
    p.write_bytes(bytes(p.stat().st_size))


def _empty(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"")


def _gone(folder: Path) -> None:
    (folder / "model.safetensors").unlink()


def _config(**change: Any) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        cfg = json.loads((folder / "config.json").read_text())
        cfg.update(change)
        (folder / "config.json").write_text(json.dumps(cfg))
    return edit


DAMAGE = {
    "truncated": (_cut, "model.safetensors"),
    "zeroed": (_zero, "model.safetensors"),
    "empty": (_empty, "model.safetensors"),
    "missing": (_gone, "no file named model.safetensors"),
    "more layers in config.json": (_config(num_hidden_layers=3), "9 weights missing from the file"),
    "fewer layers in config.json": (_config(num_hidden_layers=1), "9 weights not in the configuration"),
    "another vocabulary size": (_config(vocab_size=80), "have other shapes than"),
}


def test_a_good_folder_loads(tiny_folder: Path) -> None:
    model = rm.load_checkpoint(tiny_folder, torch.bfloat16)
    assert not model.training and {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_checkpoint_is_one_line_naming_the_file_and_the_fix(case: str, tiny_folder: Path,
                                                                      tmp_path: Path) -> None:
    damage, said = DAMAGE[case]
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_folder, folder)
    damage(folder)
    with pytest.raises(rm.RealModelCorrupt) as info:
        rm.load_checkpoint(folder)
    msg = str(info.value)
    assert "\n" not in msg and said in msg and str(folder) in msg
    assert f"replace {folder} with a good copy" in msg
    assert isinstance(info.value, ValueError)  # what hsd generate turns into one error line


def test_a_damaged_cache_says_to_delete_it(tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """load() reads the converted folder: a damaged one names the folder and says to delete it."""
    folder = tmp_path / "smollm2-135m-instruct"
    shutil.copytree(tiny_folder, folder)
    _cut(folder)
    monkeypatch.setattr(rm, "_folder", lambda name: folder)
    with pytest.raises(rm.RealModelCorrupt, match=rf"model\.safetensors .*: delete the folder \(rm -r {folder}\)"):
        rm.load("smollm2-135m-instruct")


# ---------------------------------------------------------------------------------------------
# multi-package GGUF sources


def _install_parts(root: Path, chunks: list[bytes], stem: str = "hsdfakepart") -> None:
    """Make ``chunks`` installed distributions ``<stem>-<i>`` 0.1 under ``root`` (as pip lays out a
    data-only part package: ``<stem>_<i>/data/partNN.bin`` listed in its RECORD)."""
    for i, chunk in enumerate(chunks, 1):
        mod = root / f"{stem}_{i}"
        (mod / "data").mkdir(parents=True)
        (mod / "__init__.py").write_text("")
        (mod / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        info = root / f"{stem}_{i}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {stem}-{i}\nVersion: 0.1\n")
        (info / "RECORD").write_text(f"{stem}_{i}/__init__.py,,\n{stem}_{i}/data/part{i:02d}.bin,,\n"
                                     f"{stem}_{i}-0.1.dist-info/METADATA,,\n")


def _source(chunks: list[bytes], stem: str = "hsdfakepart") -> Any:
    whole = b"".join(chunks)
    return rm._Source(f"{stem}-{{}}", "0.1", f"{stem}_{{}}", "pip install fake-parts", "joined.gguf", parts=len(chunks),
                      size=len(whole), sha256=hashlib.sha256(whole).hexdigest())


def test_parts_are_found_where_pip_put_them_and_joined_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = [b"GGUF" + bytes(range(20)), b"second", b"3" * 1000]
    _install_parts(tmp_path / "site", chunks)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    src = _source(chunks)
    assert rm._present(src)
    out = rm._join_parts(src, tmp_path / "joined.gguf")
    assert out.read_bytes() == b"".join(chunks)
    assert not rm._present(_source(chunks + [b"4"]))  # a fourth part is not installed
    with pytest.raises(rm.RealModelUnavailable, match="hsdfakepart-4 is not installed: pip install fake-parts"):
        rm._join_parts(_source(chunks + [b"4"]), tmp_path / "j2.gguf")


@pytest.mark.parametrize("damage", ["flipped byte", "truncated part"])
def test_a_damaged_part_fails_the_hash_and_names_the_reinstall(damage: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = [b"GGUF" + bytes(100), b"x" * 300]
    _install_parts(tmp_path / "site", chunks)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    bad = tmp_path / "site" / "hsdfakepart_2" / "data" / "part02.bin"
    bad.write_bytes(b"x" * 299 + b"y" if damage == "flipped byte" else b"x" * 200)
    with pytest.raises(rm.RealModelCorrupt) as info:
        rm._join_parts(_source(chunks), tmp_path / "joined.gguf")
    msg = str(info.value)
    assert "\n" not in msg and "hsdfakepart-1 .. hsdfakepart-2" in msg and "pip install --force-reinstall" in msg
    assert f"has {404 if damage == 'flipped byte' else 304} bytes" in msg
    assert not (tmp_path / "joined.gguf").exists()


def test_the_qwen_sources_pin_size_and_hash() -> None:
    for name, parts in (("qwen2.5-coder-1.5b-instruct", 22), ("qwen2.5-coder-0.5b-instruct", 6)):
        src = rm._SOURCES[name]
        assert src.parts == parts and src.size > 4 * 10**8 and len(src.sha256) == 64
        assert rm.install_command(name) == 'pip install -e ".[real-qwen]" -c constraints.txt'


def test_a_truncated_gguf_file_is_named(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    import gguf

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_string("general.name", "tiny")
    writer.add_tensor("token_embd.weight", torch.zeros(8, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(rm.RealModelCorrupt) as info:
        rm._read_gguf(path, rm._SOURCES["qwen2.5-coder-0.5b-instruct"])
    msg = str(info.value)
    assert "\n" not in msg and f"cannot read the GGUF file {path}" in msg and "pip install --force-reinstall" in msg
    os.remove(path)
