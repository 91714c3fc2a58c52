"""What the conformance engines do to draw and audit a case cheaply keeps the laws: the draws come
back from memory as the samples file holds them; a resumed file of other settings is refused; a
repeated seed is refused; worker processes make exactly the draws one process makes (so their rows
are the same independent draws, and a case drawn by workers passes its audit); a cell records the
seconds of its parts. The bug zoo through the kit (tests/torch/conformance/test_run.py) runs through
the same collect loop, in one process.

Sizes: 600 draws for the one audited cell (as test_run.py: detectable TV about 0.19 on whole draws,
family-wise alpha 1e-3, so a correct engine fails it with probability at most 1e-3); the other tests
are exact comparisons."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsd_core.samples import Draw, SamplesFormatError, read_samples, write_samples
from hsd_torch.conformance.engines import Case, KitEngine
from hsd_torch.conformance.hsd_engine import HsdTorchEngine
from hsd_torch.conformance.matrix import CASES, MODE_SPECS, audit_case

N = 600
ALPHA = 1e-3


def _case(kit: Path, name: str, mode: str) -> Case:
    pc = next(c for c in CASES if c.name == name)
    drafter, settings, _ = MODE_SPECS[mode]
    return Case(kit, pc.prompts[0], pc.for_engine("transformers"), mode, drafter, settings, pc.target)


def _small(kit: Path, workers: int = 1) -> HsdTorchEngine:
    eng = HsdTorchEngine(kit, workers=workers)
    eng.batch = 16
    return eng


@pytest.fixture(scope="module")
def engine(kit: Path) -> HsdTorchEngine:
    return _small(kit)


def test_the_draws_returned_are_the_files_draws(kit: Path, engine: HsdTorchEngine, tmp_path: Path) -> None:
    """Draws returned from memory equal what read_samples takes from the file written (all but the
    line numbers), with the same shared settings, and the file is named as the path."""
    eng = engine
    case = _case(kit, "eos_early", "sd")
    out = tmp_path / "c.jsonl"
    got = eng.sample(case, list(range(24)), out)
    back = read_samples(out)
    assert got.path == str(out)
    assert (got.engine, got.speculative, got.sampling, got.target) == (back.engine, back.speculative, back.sampling,
                                                                       back.target)
    assert [(d.ids, d.seed, d.prompt_ids, d.finish_reason, dict(d.extra)) for d in got.draws] == \
        [(d.ids, d.seed, d.prompt_ids, d.finish_reason, dict(d.extra)) for d in back.draws]
    mem = eng.sample(case, list(range(24)))  # no file: the same draws (the same seeds and chunks)
    assert mem.path == "<hsd_torch>" and [d.ids for d in mem.draws] == [d.ids for d in got.draws]


def test_a_resumed_file_of_other_settings_is_refused(kit: Path, engine: HsdTorchEngine, tmp_path: Path) -> None:
    eng = engine
    out = tmp_path / "g.jsonl"
    f = eng.sample(_case(kit, "greedy", "none"), list(range(3)), out)
    write_samples(out, list(f.draws), engine=f.engine, sampling=_case(kit, "plain", "none").sampling,
                  speculative=None, target=f.target)
    with pytest.raises(SamplesFormatError, match="mixed settings"):
        eng.sample(_case(kit, "greedy", "none"), list(range(6)), out)


def test_repeated_seeds_are_refused(tmp_path: Path) -> None:
    eng = KitEngine(tmp_path)
    shared = dict(engine={"name": "x", "version": "1"}, sampling=CASES[0].sampling, speculative=None, target=None)
    with pytest.raises(ValueError, match="seeds repeat"):
        eng.collect(None, [1, 2, 1], shared, lambda c: [Draw((2,), seed=s, prompt_ids=(1,)) for s in c], 2)


@pytest.mark.parametrize("to_file", [False, True])
def test_a_malformed_draw_is_refused_with_or_without_a_file(tmp_path: Path, to_file: bool) -> None:
    """Every draw is validated as it arrives, not the first alone: the second of three draws has a
    negative id and the collection is refused on both paths (a file, or draws kept in memory)."""
    eng = KitEngine(tmp_path)
    shared = dict(engine={"name": "x", "version": "1"}, sampling=CASES[0].sampling, speculative=None, target=None)

    def draw(c: list[int]) -> list[Draw]:
        return [Draw((2,) if s != 1 else (-3,), seed=s, prompt_ids=(1,)) for s in c]

    with pytest.raises(SamplesFormatError, match="ids"):
        eng.collect(tmp_path / "m.jsonl" if to_file else None, [0, 1, 2], shared, draw, 3)


def test_chunks_from_a_mapper_arrive_in_order_and_are_reported(tmp_path: Path) -> None:
    eng = KitEngine(tmp_path)
    seen: list[int] = []
    eng.on_draw = seen.append
    shared = dict(engine={"name": "x", "version": "1"}, sampling=CASES[0].sampling, speculative=None, target=None)

    def draw(c: list[int]) -> list[Draw]:
        return [Draw((2,), seed=s, prompt_ids=(1,)) for s in c]

    def backwards_then_in_order(chunks: list[list[int]]) -> list[list[Draw]]:
        made = [draw(c) for c in reversed(chunks)]  # made in another order, handed back in chunk order
        return list(reversed(made))

    f = eng.collect(tmp_path / "x.jsonl", list(range(7)), shared, draw, 3, map_chunks=backwards_then_in_order)
    assert [d.seed for d in f.draws] == list(range(7)) == [d.seed for d in read_samples(tmp_path / "x.jsonl").draws]
    assert seen == [3, 3, 1]


def test_a_cell_records_the_seconds_of_its_parts(kit: Path, engine: HsdTorchEngine) -> None:
    r = audit_case(engine, "hsd_torch", _case(kit, "plain", "sd"), "plain", 16, ALPHA, None)
    assert set(r.times) == {"law", "draws", "audit", "expected_acceptance"}
    assert all(v >= 0 for v in r.times.values()) and r.times["draws"] == r.seconds
    refused = audit_case(engine, "hsd_torch", _case(kit, "min_p", "sd"), "min_p", 40, ALPHA, None)
    assert refused.outcome == "refused" and set(refused.times) == {"law"}


def test_workers_must_be_a_positive_int(kit: Path) -> None:
    with pytest.raises(ValueError, match="workers"):
        HsdTorchEngine(kit, workers=0)


@pytest.mark.slow
def test_workers_make_the_draws_one_process_makes(kit: Path) -> None:
    """Two worker processes (spawned: about 10-20 s here) draw chunk for chunk what one process draws,
    in seed order, for SD and TLI (generate's rows depend on their chunk's seed alone); a case drawn by
    them passes its audit at N = 600 (alpha 1e-3)."""
    one, two = _small(kit), _small(kit, workers=2)
    try:
        two.up()
        for mode in ("sd", "tli"):
            case = _case(kit, "plain", mode)
            a, b = one.sample(case, list(range(100))), two.sample(case, list(range(100)))
            assert [(d.ids, d.seed, dict(d.extra)) for d in a.draws] == [(d.ids, d.seed, dict(d.extra)) for d in b.draws]
        two.batch = HsdTorchEngine.batch
        r = audit_case(two, "hsd_torch", _case(kit, "top_p_inside", "sd"), "top_p_inside", N, ALPHA, None)
        assert r.outcome == "conforms", r.reason
    finally:
        two.close()


def test_the_run_refuses_no_workers(kit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from hsd_torch.conformance.matrix import add_arguments, main

    ap = argparse.ArgumentParser()
    add_arguments(ap)
    assert main(ap.parse_args(["--kit", str(kit), "--out", str(tmp_path / "o"), "--workers", "0"])) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err


@pytest.mark.slow
def test_the_cli_runs_with_workers(kit: Path, tmp_path: Path) -> None:
    """``hsd conformance run --workers 2``: the cell's draws are those one process makes."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    run = [sys.executable, "-m", "hsd_core.cli", "conformance", "run", "--kit", str(kit), "-n", "40", "--mode", "sd",
           "--case", "eos_early"]
    got = {}
    for w in (1, 2):
        p = subprocess.run(run + ["--out", str(tmp_path / f"w{w}"), "--workers", str(w)], capture_output=True,
                           text=True, cwd=root, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        got[w] = [d.ids for d in read_samples(tmp_path / f"w{w}" / "samples" / "hsd_torch" / "sd" / "eos_early-p0.jsonl").draws]
    assert got[1] == got[2] and len(got[1]) == 40


def test_workers_refuse_to_draw_while_a_zoo_patch_is_active(kit: Path) -> None:
    """A zoo variant patched into this process would not reach spawned workers, which would then draw
    from the correct engine and pass it: refused before any pool starts (and allowed again after)."""
    from hsd_torch.auditing.variants import VARIANTS, active_patches

    two = _small(kit, workers=2)
    case = _case(kit, "plain", "sd")
    try:
        with VARIANTS["positions_not_reset"].patch():
            assert active_patches()
            with pytest.raises(RuntimeError, match="workers=1"):
                two.sample(case, [0, 1])
        assert not active_patches() and two._pool is None
    finally:
        two.close()
