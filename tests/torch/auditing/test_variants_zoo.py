"""The zoo of real-world SD bugs (``hsd_torch.auditing.variants``, docs/auditing.md) against
``audit_sequences`` on the tiny pair.

Budgets and margins (from ``bench/zoo.py``, recorded in ``docs/auditing.md``; seeds 0 and 1 give
the same verdicts): at n = 200 sequences x 32 tokens, alpha 1e-3, the bugs that bias every round
are caught with p-values below 1e-30 or by draws of probability 0, the prompt's last id fed twice by
the test aimed at it (p ~1e-59); the stale-cache bug needs n = 1,000 (p ~1e-25 there, slow tier;
at 200 the test aimed at the prompt fed twice sees it too, a stale column being an extra id in
the context, but at p 1e-8 to 1e-5 over seeds 0-3 against alpha / m = 9e-5: too thin a margin to
assert); the lossless one passes. Every variant is first shown to change
the output (a patch that does nothing would pass any audit).
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_torch import generate  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch.auditing.sequences import audit_sequences  # noqa: E402
from hsd_torch.auditing.variants import TREE_VARIANTS, VARIANTS, generate_with  # noqa: E402

torch.set_num_threads(1)

PROMPTS = ["def foo(x):\n", "The quick brown"]
L = 32


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any, Any, Any]:
    return tiny.tiny_pair()


def _kw(name: str, pair: Any) -> dict[str, Any]:
    _, tt, _, dt = pair
    v = VARIANTS[name]
    kw: dict[str, Any] = {"target_tokenizer": tt, "drafter_tokenizer": dt, "method": v.methods[0], "lookahead": 3}
    if "top_p" in v.needs:
        kw["top_p"] = v.needs["top_p"]
    return kw


def _audit(pair: Any, name: str, n: int) -> Any:
    target, tt, drafter, dt = pair
    kw = _kw(name, pair)

    def batch(prompts: list[str], seeds: list[int]) -> list[list[int]]:
        return generate_with(name, target, drafter, prompts, max_new_tokens=L, seed=seeds[0], **kw).sequences

    return audit_sequences(None, target, tt, PROMPTS, n=n, max_new_tokens=L, top_p=kw.get("top_p"), drafter=drafter,
                           drafter_tokenizer=dt, sample_batch_fn=batch)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_variant_changes_the_output(pair: Any, name: str) -> None:
    target, _, drafter, _ = pair
    kw = _kw(name, pair)
    changed = 0
    for seed in (0, 1):
        a = generate(target, drafter, [PROMPTS[0]] * 4, max_new_tokens=L, seed=seed, **kw).sequences
        b = generate_with(name, target, drafter, [PROMPTS[0]] * 4, max_new_tokens=L, seed=seed, **kw).sequences
        changed += sum(x != y for r1, r2 in zip(a, b) for x, y in zip(r1, r2))
    assert changed > 0, f"{name} changes nothing: its patch is not on the code path"


def test_patches_are_undone(pair: Any) -> None:
    from hsd_torch.engine import kernels, verification
    from hsd_torch.engine.runner import Runner

    before = (kernels._rejection_host, verification.space_head_law, Runner.sync, Runner._forget, Runner._first_position)
    for v in VARIANTS.values():
        with v.patch():
            pass
    assert before == (kernels._rejection_host, verification.space_head_law, Runner.sync, Runner._forget,
                      Runner._first_position)


@pytest.mark.parametrize("name", ["q_columns_permuted", "first_draft_accepted", "residual_minus_qx",
                                  "unprocessed_verification"])
def test_bugs_of_every_round_are_caught_at_200_sequences(pair: Any, name: str) -> None:
    rep = _audit(pair, name, 200)
    assert rep.verdict == "lossy", rep.to_markdown()


def test_the_prompt_fed_twice_is_caught_at_200_sequences_by_its_aimed_test(pair: Any) -> None:
    """The prompt's last id held twice in the target's cache moves each law in its own direction
    (mean per-token TV ~0.08): the pooled tests average it out, the test aimed at it (on by default,
    ``hsd_core.context_bugs``) does not."""
    rep = _audit(pair, "prompt_token_twice", 200)
    hit = [t.name for t, h in zip(rep.tests, rep.holm_rejected) if h]
    assert rep.verdict == "lossy" and "directional (toward the prompt's last id fed twice)" in hit, rep.to_markdown()


def test_the_lossless_variant_passes(pair: Any) -> None:
    """The drafter's context is free: a re-sync that drops a token changes the output, not its law."""
    assert VARIANTS["resync_drops_token"].lossless
    rep = _audit(pair, "resync_drops_token", 200)
    assert rep.verdict == "lossless-consistent", rep.to_markdown()


@pytest.mark.slow
def test_a_stale_cache_is_caught_at_1000_sequences(pair: Any) -> None:
    """A rejected draft left in the cache changes every later law a little (TV ~0.1 where it sits,
    in no fixed direction): at 1,000 sequences the log-likelihood martingale sees it (its mean drops
    by the KL; p 6e-14 before the aimed test existed), and the test aimed at the prompt's last id
    fed twice sees it better (an extra id in the context; p 2.5e-25 at seed 0)."""
    rep = _audit(pair, "cache_cropped_short", 1000)
    assert rep.verdict == "lossy", rep.to_markdown()


@pytest.mark.slow
def test_positions_not_reset_are_caught_on_a_position_sensitive_target() -> None:
    """On the plain tiny target positions barely matter (its attention is nearly uniform), so the
    bug moves its laws by a mean per-token TV of 0.002-0.006 (bench/position_tv.py): invisible. On
    the sharpened target (``tiny.sharpen``) it is caught at 1,000 sequences (p ~1e-15 at seed 0 by the log-likelihood martingale alone; with the
    test aimed at the prompt's last id fed twice, whose shifted positions it resembles, 6e-222, and
    1.9e-46 already at 200)."""
    target, tt, drafter, dt = tiny.tiny_pair()
    rep = _audit((tiny.sharpen(target), tt, drafter, dt), "positions_not_reset", 1000)
    assert rep.verdict == "lossy", rep.to_markdown()


# ---------------------------------------------------------------------------------------------
# named seams: a variant patches only what the module that defines it declares (ZOO_SEAMS)

def test_every_variant_patches_only_declared_seams_and_restores_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """The single-path variants and the token trees' (TREE_VARIANTS) alike."""
    import hsd_torch.auditing.variants as variants

    seen: list[tuple[Any, str]] = []
    real = variants.patch_seam

    def recording(owner: Any, name: str, make: Any) -> Any:
        seen.append((owner, name))
        return real(owner, name, make)

    monkeypatch.setattr(variants, "patch_seam", recording)
    for v in (*VARIANTS.values(), *TREE_VARIANTS.values()):
        seen.clear()
        with v.patch():
            assert seen, f"variant {v.name} patched nothing through patch_seam"
            patched = [(owner, name, getattr(owner, name)) for owner, name in seen]
        for owner, name in seen:
            module, seam = variants.seam_name(owner, name)
            assert seam in module.ZOO_SEAMS, f"variant {v.name} patches {module.__name__}.{seam}, not a declared seam"
        for owner, name, inside in patched:
            assert getattr(owner, name) is not inside, f"{name} not restored after variant {v.name}"


def test_patching_an_undeclared_name_is_refused_and_changes_nothing() -> None:
    from hsd_torch.engine import kernels, verification
    from hsd_torch.methods.tli import TLI
    from hsd_torch.engine.runner import Runner
    from hsd_torch.auditing.variants import NotASeam, patch_seam

    for owner, name in ((kernels, "_draw_host"), (kernels, "_ratio_test"), (verification, "rejection"),
                        (Runner, "feed"), (TLI, "draft"), (tiny, "tiny_pair")):
        before = getattr(owner, name)
        with pytest.raises(NotASeam, match="is not a seam of the bug zoo"):
            with patch_seam(owner, name, lambda orig: None):
                pass
        assert getattr(owner, name) is before
    with patch_seam(kernels, "_rejection_host", lambda orig: "patched"):  # a declared one is patched
        assert kernels._rejection_host == "patched"  # type: ignore[comparison-overlap]
    assert callable(kernels._rejection_host)


def test_the_zoo_scripts_patch_through_the_one_helper() -> None:
    """No ``setattr`` or attribute assignment on another module in ``hsd_torch/auditing/variants.py`` (outside
    ``patch_seam``) or ``bench/zoo.py``: every patch goes through :func:`hsd_torch.auditing.variants.patch_seam`."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    for path in (root / "hsd_torch" / "auditing" / "variants.py", root / "bench" / "zoo.py"):
        tree = ast.parse(path.read_text())
        helper = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "patch_seam"
                  for n in ast.walk(f)}
        for node in ast.walk(tree):
            if id(node) in helper:
                continue
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
                raise AssertionError(f"{path.name}:{node.lineno}: setattr outside patch_seam")
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id != "self":
                        raise AssertionError(f"{path.name}:{node.lineno}: {ast.unparse(t)} assigned outside patch_seam")
