"""``hsd_torch.generate`` as a conformance engine: the kit's target and drafters loaded with
transformers in float32, AR as the null control (mode ``"none"``), SD with the same-vocabulary
drafter, TLI, SLEM and SLRS with the SentencePiece-style drafter.

Processing: ``generate`` applies temperature, top-k and top-p (in that order), transformers'
``min_new_tokens`` and stop strings; a case that sets anything else (min-p, penalties, logit bias,
bad words, allowed ids) or names an order other than transformers' is refused
(:class:`~hsd_torch.conformance.engines.EngineRefused`) with one line naming what.

Draws are made in batches of :attr:`HsdTorchEngine.batch` rows, ``generate(seed=s)`` with ``s`` the
batch's first seed (row ``j`` of the batch draws from ``SeedSequence(s).spawn(...)[j]``, so the rows
are independent); each draw records its own seed from the case's list, the batch's seed and row,
and the engine's counts for it (``new_tokens``, ``target_calls``, ``proposed``, ``accepted``), which
the acceptance test reads.

**Workers.** ``HsdTorchEngine(kit, workers=2)`` draws the chunks in that many worker processes
(``spawn``, one torch thread each, the kit's models loaded once per worker), so a case uses every
core of the machine; the chunks, their seeds and so every draw are the same as with one process (a
chunk's draws depend on its seeds alone), and they come back in chunk order. What the parent
process patches (the bug zoo's ``Variant.patch()``, :mod:`hsd_torch.auditing.variants`) does not reach the
workers, so a draw with workers while a zoo patch is active is refused (``RuntimeError``): audit a
patched engine with ``workers=1`` (the default). The engine's class is rebuilt in
each worker (``cls(kit)``), so a subclass must be importable by its module name.

**Cost** (bench/conformance_power.py ``--cpu``, bench/RESULTS.md's conformance section): the kit's
models are small but not free (hidden size 512: about 10^6 multiply-adds a position, some 35 us of
CPU), and the forward passes are about two thirds of a draw's CPU, so a case costs what it feeds: a
draw of SD at lookahead 3 feeds about 4.2 target and 2.8 drafter positions at ``plain`` and 9.0 and
6.3 at ``pos_plain`` (4 new ids at 1.36 tokens a target call), the null control 2.0 and 2.8. Every
row of a call shares the case's prompt, which ``generate`` feeds once for the call
(:func:`hsd_torch.engine.runner.shared_prefix`; draws unchanged). Batches of 250, 1,000 and
2,000 rows were measured no cheaper a draw than :attr:`HsdTorchEngine.batch`. Each worker keeps the
memory its C allocator frees (:func:`keep_freed_memory`: the forward passes' buffers of a few MiB
each were otherwise mapped afresh and page-faulted at every pass) and freezes its startup objects
out of the cyclic garbage collector (``gc.freeze``); neither changes a draw.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from hsd_core.conformance_design import ROLES
from hsd_core.samples import Draw, SamplesFile

from .engines import Case, EngineRefused, KitEngine

__all__ = ["HsdTorchEngine", "METHOD_OF_MODE"]

METHOD_OF_MODE = {"none": "ar", "sd": "sd", "tli": "tli", "slem": "slem", "slrs": "slrs"}
"""The engine's modes and the ``generate`` method each runs."""

DEFAULT_DRAFTER = {"sd": "drafter", "tli": "drafter_sp", "slem": "drafter_sp", "slrs": "drafter_sp"}
SUPPORTED = ("min_tokens", "stop", "order")


def refusal(case: Case) -> str | None:
    """Why ``hsd_torch.generate`` does not run ``case``'s processing (None: it does)."""
    s = case.sampling
    other = [k for k in s.processing() if k not in SUPPORTED]
    if other:
        return (f"hsd_torch.generate applies temperature, top-k, top-p, min_new_tokens and stop strings only; "
                f"this case sets {', '.join(other)}")
    if s.order not in (None, "transformers"):
        return f"hsd_torch.generate follows transformers' order of processing, not {s.order}'s"
    return None


class HsdTorchEngine(KitEngine):
    """The engine (module docstring) over the kit folder ``kit``; models load at the first draw.
    ``workers``: the processes that draw (1: this one; more: a pool started at the first draw and
    stopped by :meth:`close`)."""

    batch = 500
    order = "transformers"

    def __init__(self, kit: Path, workers: int = 1) -> None:
        import hsd_torch

        super().__init__(kit)
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self.name = f"hsd_torch {getattr(hsd_torch, '__version__', 'dev')}"

    def modes(self) -> Sequence[str]:
        return tuple(METHOD_OF_MODE)

    def lookahead(self, case: Case) -> int:
        """The drafts per round ``generate`` is asked for (``settings["num_speculative_tokens"]``;
        default 3, SLRS 1)."""
        return int(case.settings.get("num_speculative_tokens", 1 if case.mode == "slrs" else 3))

    def speculative(self, case: Case) -> dict[str, Any] | None:
        """The samples file's ``speculative`` object for ``case`` (None for the null control)."""
        if case.mode == "none":
            return None
        return {"method": case.mode, "drafter": case.drafter or DEFAULT_DRAFTER[case.mode],
                "num_speculative_tokens": self.lookahead(case)}

    def draw_chunk(self, case: Case, chunk: Sequence[int]) -> list[Draw]:
        """One ``generate`` call: ``len(chunk)`` rows of ``case`` with ``seed=chunk[0]`` (row ``j``
        draws from ``SeedSequence(chunk[0]).spawn(len(chunk))[j]``), one :class:`Draw` per seed of
        ``chunk``, in order (module docstring)."""
        import hsd_torch

        method = METHOD_OF_MODE[case.mode]
        target, ttok = self._load(case.target)
        drafter, dtok = (None, None) if method == "ar" else self._load(case.drafter or DEFAULT_DRAFTER[case.mode])
        s = case.sampling
        o = hsd_torch.generate(target, drafter, input_ids=[list(case.prompt_ids)] * len(chunk),
                               target_tokenizer=ttok, drafter_tokenizer=dtok, method=method,
                               lookahead=self.lookahead(case), max_new_tokens=s.max_new_tokens,
                               do_sample=s.do_sample, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                               seed=int(chunk[0]), min_new_tokens=s.min_tokens or None,
                               stop_strings=list(s.stop) or None)
        return [Draw(tuple(int(i) for i in ids), seed=int(seed), prompt_ids=tuple(case.prompt_ids),
                     extra={"generate_seed": int(chunk[0]), "row": j, "new_tokens": st.new_tokens,
                            "target_calls": st.target_calls, "proposed": st.proposed, "accepted": st.accepted})
                for j, (seed, ids, st) in enumerate(zip(chunk, o.sequences, o.stats))]

    def sample(self, case: Case, seeds: Sequence[int], out: Path | None = None) -> SamplesFile:
        if case.mode not in METHOD_OF_MODE:
            raise EngineRefused(f"hsd_torch has no mode {case.mode!r} (it offers {', '.join(METHOD_OF_MODE)})")
        why = refusal(case)
        if why:
            raise EngineRefused(why)
        s = case.sampling
        shared: dict[str, Any] = dict(engine={"name": "hsd_torch", "version": self.name.split()[-1]},
                                      sampling=s, speculative=self.speculative(case), target=f"conformance-kit/{case.target}")
        many: Callable[[list[list[int]]], Iterable[list[Draw]]] | None = None
        if self.workers > 1:  # the chunks' draws from the pool, in chunk order
            from ..auditing.variants import active_patches

            if active_patches():  # the workers would draw from the unpatched engine: refuse, never audit it silently
                raise RuntimeError(f"bug-zoo patches are active in this process ({', '.join(active_patches())}); "
                                   f"worker processes do not see them: draw with workers=1")
            many = partial(self._start().map, partial(_draw_in_worker, type(self), self.kit, case))
        return self.collect(out, seeds, shared, partial(self.draw_chunk, case), self.batch, "<hsd_torch>", many)

    def up(self) -> None:
        """Load the kit's models now (with workers: start every worker, each loading them as it
        starts, and wait until each has answered, at most 100 rounds of one job a worker), so that
        the first draws do not pay for it."""
        if self.workers == 1:
            for r in ROLES:
                self._load(r)
            return
        pool = self._start()
        seen: set[int] = set()
        for _ in range(100):  # each worker answers once its initializer (the loads) is done
            seen.update(pool.map(_worker_pid, range(self.workers)))
            if len(seen) >= self.workers:
                break

    def _start(self) -> ProcessPoolExecutor:
        if self._pool is None:
            import multiprocessing

            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_worker_init, initargs=(type(self), self.kit))
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
        super().close()


_WORKER_ENGINES: dict[tuple[type, Path], HsdTorchEngine] = {}
"""A worker process's engines (one per class and kit: its models load once)."""


MALLOC_KEEP = (32 << 20, 64 << 20)
"""glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` in a worker (:func:`keep_freed_memory`)."""


def keep_freed_memory() -> bool:
    """Make this process's C allocator keep the memory it frees (glibc: blocks up to 32 MiB come
    from the heap, not from ``mmap``, and the heap is not trimmed below 64 MiB of free space), so
    that the forward passes' tensors of a few MiB each reuse pages instead of mapping fresh ones:
    with glibc's defaults a batch of 500 rows took about 25 minor page faults a draw, 8-10 % of a
    worker's CPU time in the kernel (bench/RESULTS.md, conformance section). Changes no value
    computed; the process keeps its peak memory. True where it was applied (Linux with glibc),
    False elsewhere (nothing changed). Called in each worker process at its start; a caller's own
    process is left as it is."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another C library: no mallopt
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    return bool(mallopt(m_mmap_threshold, MALLOC_KEEP[0])) and bool(mallopt(m_trim_threshold, MALLOC_KEEP[1]))


def set_up_as_worker(load: Callable[[], object]) -> None:
    """Set this process up as a worker sets itself up: one torch thread, the C allocator keeping
    freed memory (:func:`keep_freed_memory`), ``load()`` (the models a worker draws with), then
    every object alive so far (the modules torch and transformers import, the models, the
    tokenizers: about 4 x 10^5 objects) moved out of the cyclic garbage collector's view
    (``gc.freeze``): they live as long as the process, and each full collection would otherwise
    walk them all again (about 15 % of a worker's CPU at 500 rows a call, bench/RESULTS.md).
    None of it changes a value computed. Used by each worker at its start, and by a benchmark
    that measures in its own process what a worker spends."""
    import gc

    import torch

    torch.set_num_threads(1)
    keep_freed_memory()
    load()
    gc.collect()
    gc.freeze()


def _worker_init(cls: type[HsdTorchEngine], kit: Path) -> None:
    """A worker's start: its engine over ``kit``, the kit's models loaded in it, the process set
    up by :func:`set_up_as_worker`."""
    eng = _WORKER_ENGINES[(cls, kit)] = cls(kit)
    set_up_as_worker(lambda: [eng._load(r) for r in ROLES])


def _worker_pid(_: int) -> int:
    import os
    import time

    time.sleep(0.05)  # long enough that the pool's other workers take some of the jobs
    return os.getpid()


def _draw_in_worker(cls: type[HsdTorchEngine], kit: Path, case: Case, chunk: list[int]) -> list[Draw]:
    return _WORKER_ENGINES[(cls, kit)].draw_chunk(case, chunk)
