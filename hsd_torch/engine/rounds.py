"""The round loop of ``generate`` (:class:`Generation`): the models' runners, the rows' contexts,
randomness and statistics, and one round per target forward pass for every unfinished row, in
four phases that call the method object (:class:`hsd_torch.methods.base.Method`):

1. ``draft``: the method's proposals (:class:`Drafts`), from its drafter;
2. ``verify``: one target pass over each row's pending context and proposals, and the kernels'
   decisions (:mod:`hsd_torch.engine.verification`);
3. ``advance``: each row emits its tokens; the method re-syncs the drafter's context;
4. ``settle_caches``: the target's cache keeps exactly the verified context, the drafter's what is
   still valid; finished rows leave both caches.

The loop never looks at which method runs: what differs between methods is in their files
(:mod:`hsd_torch.methods`). A method sees this object as a :class:`hsd_torch.engine.round_state.RoundView`
(read-only facts and the machinery's services) and writes none of its state: its re-sync returns the
ids the drafter's context grows by, which :meth:`Generation.advance` appends.

Contexts. A model's context is its tokenizer's special prefix (a BOS) and its encoding of the
prompt; for a prompt that encodes to no ids with a tokenizer that adds no prefix, the tokenizer's
BOS (``ValueError`` up front when it has none: :meth:`TokenText.start`). The target's context
must fit its positions (prompt + ``max_new_tokens``, checked up front: its law is defined only
there); the drafter's is seen through a sliding window when it does not (:mod:`hsd_torch.engine.runner`).

Randomness. Row ``i`` draws from ``numpy.random.default_rng(SeedSequence(seed).spawn(n)[i])``
(the same for any batch size ``n``), and how many uniforms a round draws depends only on that
row's own state, so a row's output is a function of ``(seed, i, its prompt)`` alone. Per round a
row draws its drafting uniforms (one per possible draft), then its verification uniforms; the
uniforms it actually *consumes*, in the order ``hsd_core``'s method consumes them (drafts, then
what the kernel read: see :mod:`hsd_torch.engine.kernels`), can be recorded (``record_uniforms=True``)
and replayed into ``hsd_core`` through :class:`hsd_core.rand.UniformRand` (the mirror test).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from hsd_core.laws import Prob
from hsd_core.methods.resync import Resync, ResyncMemo

from ..vocab import VocabBridge
from ..vocab.text import TokenText
from . import drafting, tree, tree_cache, verification
from ._cache import IdentityCache
from ._precision import REDUCED, NearTies, model_dtype
from .genconfig import end_ids_of
from .laws import Processing, TextSpace, fixed_drop
from .processors import Processor, StopStrings
from .prompts import Prompts, target_context
from .round_state import DraftColumns, Drafts, EngineState, Verdicts
from .runner import Runner, logit_width, max_positions, model_device
from .validation import check_seed

if TYPE_CHECKING:
    from ..methods.base import Method

__all__ = ["Drafts", "GenerateOutput", "Generation", "RowStats", "Verdicts", "end_ids", "seed_sequence"]


@dataclass
class RowStats:
    """What generating one prompt cost. Forward passes count the calls in which this row had a
    token to feed; ``*_positions`` the tokens it fed; ``*_recomputed`` the fed tokens whose
    position the model had computed before, with whatever id: the correction token at a rejected
    draft's position (the target), drafter tokens from the first one a re-sync changed onward, and
    the last id fed again for its logits when the cache already held the whole context. So
    ``positions - recomputed`` is the context length each model reached, and ``recomputed`` is
    what rollbacks cost. ``wall_time`` is the whole batch's time (seconds)."""

    target_calls: int = 0
    drafter_calls: int = 0
    proposed: int = 0
    accepted: int = 0
    new_tokens: int = 0
    target_positions: int = 0
    drafter_positions: int = 0
    target_recomputed: int = 0
    drafter_recomputed: int = 0
    wall_time: float = 0.0

    @property
    def tokens_per_target_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0


@dataclass
class GenerateOutput:
    """``sequences[i]``: the new target ids of prompt ``i`` (ending with EOS or an end id if it came);
    ``texts[i]``: their text (the tokens' bytes decoded as UTF-8, invalid bytes replaced);
    ``stats[i]``: :class:`RowStats`; ``uniforms[i]``: the uniforms row ``i`` consumed, in
    ``hsd_core``'s order (only with ``record_uniforms=True``, else ``None``)."""

    sequences: list[list[int]]
    texts: list[str]
    stats: list[RowStats]
    uniforms: list[list[float]] | None = None
    prompt_ids: list[list[int]] | None = None
    """Each row's target context before its new ids (its prompt's ids, special prefix included)."""
    pad_token_id: int | None = None
    """The id :meth:`tensors` pads with by default (the target tokenizer's pad id, else its EOS)."""
    near_ties: list[int] | None = None
    """Greedy with a bfloat16 or float16 target, per row: the verified positions whose near-equal top
    logits were decided again in float32 (:mod:`hsd_torch.engine._precision`); None otherwise."""
    tie_flips: list[int] | None = None
    """Of those, per row, the positions where the float32 decision differs from the reduced-precision argmax."""

    def tensors(self, pad_token_id: int | None = None, device: Any = None) -> dict[str, Tensor]:
        """The output as transformers' ``generate`` returns a left-padded batch: ``"sequences"``
        ``[B, P + N]`` int64 (each row's prompt ids right-aligned in the first ``P`` columns, its new
        ids from column ``P``, padded after them), ``"attention_mask"`` (1 on prompt and new ids, 0 on
        padding) and ``"new_tokens"`` ``[B, N]`` (the new ids, padded); ``P`` and ``N`` the longest
        prompt and continuation; padding ``pad_token_id`` (default: :attr:`pad_token_id`)."""
        pad = self.pad_token_id if pad_token_id is None else pad_token_id
        if pad is None or self.prompt_ids is None:
            raise ValueError("this output has no prompt ids or pad id (built by hand): give pad_token_id")
        p = max(len(x) for x in self.prompt_ids)
        n = max((len(x) for x in self.sequences), default=0)
        b = len(self.sequences)
        seq = torch.full((b, p + n), int(pad), dtype=torch.long)
        mask = torch.zeros((b, p + n), dtype=torch.long)
        new = torch.full((b, n), int(pad), dtype=torch.long)
        for i, (pr, s) in enumerate(zip(self.prompt_ids, self.sequences)):
            seq[i, p - len(pr):p] = torch.tensor(pr, dtype=torch.long)
            mask[i, p - len(pr):p + len(s)] = 1
            if s:
                seq[i, p:p + len(s)] = torch.tensor(s, dtype=torch.long)
                new[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        return {k: v.to(device) if device is not None else v
                for k, v in (("sequences", seq), ("attention_mask", mask), ("new_tokens", new))}




_BRIDGES: IdentityCache[VocabBridge] = IdentityCache(16)
"""The bridge of a pair of texts on a device: a :class:`TokenText` is built once per tokenizer object,
width and state, so this skips the bridge's own check of both tokenizers' states on every call."""


def end_ids(config: Any, tt: TokenText) -> frozenset[int]:
    """The ids a row of ``generate`` ends at: the tokenizer's EOS and the generation config's
    ``eos_token_id`` (``config``: the target's ``generation_config`` or the caller's; an int or a
    list, as Llama-3 and instruct models ship; ids outside the model's logits are ignored)."""
    return frozenset([tt.eos_id] + [e for e in end_ids_of(config) if 0 <= e < tt.vocab_size])


def seed_sequence(seed: int | torch.Generator | np.random.SeedSequence | None) -> np.random.SeedSequence:
    """``generate``'s ``seed`` as the root of the rows' streams: an int >= 0 (numpy integers too),
    a ``torch.Generator`` (one int drawn from it), None (fresh entropy) or a ``SeedSequence``
    (itself); else :class:`hsd_torch.engine.validation.OutOfRange` (a ``ValueError``)."""
    if not isinstance(seed, np.random.SeedSequence):
        check_seed(seed)
    return _root(seed)


def _root(seed: int | torch.Generator | np.random.SeedSequence | None) -> np.random.SeedSequence:
    """:func:`seed_sequence` for a seed already checked (``generate`` checks it at its boundary,
    before any work; a ``torch.Generator`` is drawn from here, once the call is under way, so a
    refused call leaves it as it was)."""
    if isinstance(seed, np.random.SeedSequence):
        return seed
    if isinstance(seed, torch.Generator):
        return np.random.SeedSequence(int(torch.randint(0, 2**62, (1,), generator=seed).item()))
    if seed is None:
        return np.random.SeedSequence()
    return np.random.SeedSequence(int(seed))


class _Services:
    """The machinery's services a method calls through its :class:`hsd_torch.engine.round_state.RoundView`
    (each delegates to :mod:`hsd_torch.engine.drafting` or :mod:`hsd_torch.engine.verification` with the engine's
    state): mixed into :class:`Generation`."""

    def drafting_uniforms(self: EngineState, k: Sequence[int]) -> list[list[float]]:
        """:func:`hsd_torch.engine.drafting.drafting_uniforms` (a method's service)."""
        return drafting.drafting_uniforms(self, k)

    def feed_drafter(self: EngineState, contexts: Sequence[Sequence[int] | None], head: Tensor | None = None) -> Tensor:
        """:func:`hsd_torch.engine.drafting.feed_drafter` (a method's service)."""
        return drafting.feed_drafter(self, contexts, head)

    def draft_tokens(self: EngineState, active: Sequence[bool], k: Sequence[int], cols: DraftColumns,
                     min_confidence: Prob | None = None) -> tuple[Drafts, list[list[int]]]:
        """:func:`hsd_torch.engine.drafting.draft_tokens` (a method's service)."""
        return drafting.draft_tokens(self, active, k, cols, min_confidence)

    def drafter_context_from_text(self: EngineState, active: Sequence[bool], resync: Resync) -> None:
        """:func:`hsd_torch.engine.drafting.drafter_context_from_text` (a method's service)."""
        drafting.drafter_context_from_text(self, active, resync)

    def exact_match(self: EngineState, active: list[bool], budget: list[int], drafts: Drafts) -> Verdicts:
        """:func:`hsd_torch.engine.verification.exact_match` (a method's service)."""
        return verification.exact_match(self, active, budget, drafts)

    def rejection(self: EngineState, active: list[bool], budget: list[int], drafts: Drafts,
                  q_of: Callable[[int], Tensor],
                  q_scale: list[list[float]] | None = None) -> Verdicts:
        """:func:`hsd_torch.engine.verification.rejection` (a method's service)."""
        return verification.rejection(self, active, budget, drafts, q_of, q_scale)

    def tree_draft(self: EngineState, active: Sequence[bool], contexts: Sequence[Sequence[int] | None],
                   rows: Sequence[tree_cache.RowDrafting | None], law: Callable[[Tensor], Tensor],
                   token_of: Callable[[int], int], depth: Sequence[int],
                   host: tree_cache.HostLaw | None = None) -> tuple[list[Any], tree_cache.TreeCache]:
        """:func:`hsd_torch.engine.tree.tree_draft` (a method's service)."""
        return tree.tree_draft(self, active, contexts, rows, law, token_of, depth, host)

    def tree_verify(self: EngineState, active: list[bool], budget: list[int], trees: Sequence[Any],
                    walk: tree_cache.Walk, draft_cache: tree_cache.TreeCache | None) -> Verdicts:
        """:func:`hsd_torch.engine.tree.tree_verify` (a method's service)."""
        return tree.tree_verify(self, active, budget, trees, walk, draft_cache)


class Generation(_Services):
    """One call of ``generate`` (its arguments checked): the models' runners and text spaces, the
    rows' contexts, randomness and statistics, and :meth:`round`. ``method`` is the method object
    (:mod:`hsd_torch.methods`, which owns its options), set up here once the spaces exist; it sees
    this object as a :class:`hsd_torch.engine.round_state.RoundView` and the shared machinery as an
    :class:`hsd_torch.engine.round_state.EngineState`. ``process`` and ``d_process``: the target's and the
    drafter's processing; ``seed``: what :func:`seed_sequence` takes, already checked."""

    def __init__(self, method: Method, target: Any, drafter: Any, prompts: list[str] | Prompts, target_tokenizer: Any,
                 drafter_tokenizer: Any, *, max_new_tokens: int, greedy: bool, process: Processing,
                 d_process: Processing, seed: int | torch.Generator | np.random.SeedSequence | None,
                 record_uniforms: bool, mask_textless: bool = False, generation_config: Any = None,
                 processors: Sequence[Processor] = (), min_new_tokens: int = 0, stop_strings: Sequence[bytes] = ()
                 ) -> None:
        dev = self.dev = model_device(target)
        self.method, self.max_new_tokens, self.greedy = method, max_new_tokens, greedy
        self.process, self.d_process, self.mask_textless = process, d_process, mask_textless
        vt = self.vt = logit_width(target)
        tt = self.tt = TokenText.get(target_tokenizer, vt)
        self.ends: frozenset[int] = end_ids(generation_config, tt)  # the config generate resolved and checked
        rendered = prompts if isinstance(prompts, Prompts) else Prompts.of_text(prompts)
        batch = self.batch = len(rendered.target)
        # the drafter's prompt text read as text (empty where its own chat template's ids are in d_start)
        self.prompt_bytes = [b"" if parsed else p.encode("utf-8")
                             for p, parsed in zip(rendered.drafter, rendered.drafter_parsed)]
        if rendered.target_ids is not None:  # given ids: the context exactly
            self.t_first: list[list[int]] = [[] for _ in range(batch)]
            self.t_ctx = [list(ids) for ids in rendered.target_ids]
        else:
            self.t_first = [tt.start(p, parsed=True) for p in rendered.target]
            self.t_ctx = [target_context(tt, p) for p in rendered.target]  # = t_first + the prompt's own ids
        self.prompt_ids = [list(c) for c in self.t_ctx]
        self.processors, self.min_new_tokens = list(processors), min_new_tokens  # hsd_torch.engine.processors
        self.stops = StopStrings(stop_strings, [tt.decode(c) for c in self.t_ctx] if stop_strings else [b""] * batch)
        max_pos_t = max_positions(target.config)
        if max_pos_t is not None:
            for i, ctx_i in enumerate(self.t_ctx):
                if len(ctx_i) + max_new_tokens > max_pos_t:
                    raise ValueError(
                        f"prompt {i} has {len(ctx_i)} target tokens; with max_new_tokens={max_new_tokens} the "
                        f"target's context could reach {len(ctx_i) + max_new_tokens} tokens, beyond its {max_pos_t} "
                        "positions (the target's law is defined only within them: lower max_new_tokens or shorten "
                        "the prompt)")
        self.emitted: list[list[int]] = [[] for _ in range(batch)]
        self.finished = [False] * batch
        self.stats = [RowStats() for _ in range(batch)]
        self.rngs = [np.random.default_rng(s) for s in _root(seed).spawn(batch)]
        self.used: list[list[float]] | None = [[] for _ in range(batch)] if record_uniforms else None
        self.trun = Runner(target, batch, tt.eos_id, "target")
        # greedy under reduced precision: near ties decided again in float32 (hsd_torch.engine._precision)
        self.near = NearTies(target) if greedy and model_dtype(target) in REDUCED else None
        self.trun.want_hidden = self.near is not None and self.near.usable
        self.near_ties = [0] * batch
        self.tie_flips = [0] * batch
        t_space = self.t_space = TextSpace.law(tt, dev, keep_all=not mask_textless, ends=self.ends)
        self.t_drop = fixed_drop(t_space.drop_mask())
        self.t_eos_col = t_space.n - 1  # EOS is the last column of every law over target columns
        self.dt: TokenText | None = None
        self.drun: Runner | None = None
        self.bridge: VocabBridge | None = None
        self.d_ctx: list[list[int]] = []
        self.d_start: list[list[int]] = []  # the drafter's special prefix per row (kept by its window)
        self.d_head: list[list[int]] = []  # then its own chat template's ids of the prompt (else empty)
        # the string-level re-sync's memos, and (n, the text of the first n emitted ids), per row (drafting module)
        self.d_memos: list[ResyncMemo[bytes]] = [ResyncMemo(b"") for _ in range(batch)]
        self.e_text: list[tuple[int, bytes]] = [(0, b"") for _ in range(batch)]
        self.d_drop: Tensor | None = None
        self.d_space: TextSpace | None = None  # the drafter's text space: its laws' columns
        if drafter is not None:
            vd = logit_width(drafter)
            dt = self.dt = TokenText.get(drafter_tokenizer, vd)
            self.bridge = _BRIDGES.get((tt, dt), (str(dev),), lambda: VocabBridge(
                target_tokenizer, drafter_tokenizer, target_vocab_size=vt, drafter_vocab_size=vd,
                target_eos_id=tt.eos_id, drafter_eos_id=dt.eos_id, device=dev))
            self.d_drop = fixed_drop(~dt.text_mask.to(dev))
            self.d_start = [dt.start(p, parsed=parsed) for p, parsed in zip(rendered.drafter, rendered.drafter_parsed)]
            self.d_head = [dt.encode_prompt(p) if parsed else [] for p, parsed in zip(rendered.drafter,
                                                                                    rendered.drafter_parsed)]
            self.d_ctx = [self.d_start[i] + self.d_head[i] + dt.encode(self.prompt_bytes[i], free=True)
                          for i in range(batch)]
            self.drun = Runner(drafter, batch, dt.eos_id, "drafter", window=True,
                               n_prefix=[len(x) for x in self.d_start])
            self.d_space = TextSpace.text(dt, dev)
            space = method.drafter_space(self, self.d_space)
            if space is not self.d_space:  # the method drafts over other columns (SD: the target's)
                self.d_space, self.d_drop = space, fixed_drop(space.drop_mask())
        method.setup(self)

    def record(self, i: int, values: Sequence[float]) -> None:
        """Row ``i`` consumed these uniforms (kept with ``record_uniforms=True``)."""
        if self.used is not None:
            self.used[i].extend(float(v) for v in values)

    def run(self, progress: Callable[[int], None] | None, streamer: Any = None) -> None:
        """Rounds until every row has finished. ``streamer`` (one row): ``put`` the row's target
        context (its prompt's ids, ``[1, L]``), then each round's new ids (``[1, n]``), then ``end()``:
        what transformers' ``generate`` gives its streamers."""
        if streamer is not None:
            streamer.put(torch.tensor([self.t_ctx[0]], dtype=torch.long))
        while not all(self.finished):
            n0 = len(self.emitted[0])
            self.round(progress)
            if streamer is not None and len(self.emitted[0]) > n0:
                streamer.put(torch.tensor([self.emitted[0][n0:]], dtype=torch.long))
        if streamer is not None:
            streamer.end()

    def round(self, progress: Callable[[int], None] | None) -> None:
        """One round: one target forward pass for every unfinished row."""
        active = [not f for f in self.finished]
        budget = [self.max_new_tokens - len(e) for e in self.emitted]
        drafts = self.method.draft(self, active, budget)
        verdicts = self.method.verify(self, active, budget, drafts)
        self.advance(active, drafts.n, verdicts)
        if progress is not None:
            done = sum(1 for i in range(self.batch) if active[i] and self.finished[i])
            if done:
                progress(done)
        self.settle_caches(active)

    def advance(self, active: list[bool], n_d: list[int], verdicts: Verdicts) -> None:
        """Each active row emits its tokens (target columns ``verdicts.emitted``): contexts,
        statistics, recorded uniforms, finished rows, and the method's re-sync of the drafter's
        context for the rows that go on."""
        t_ids, ends = self.t_space.ids, self.ends
        for i in range(self.batch):
            if not active[i]:
                continue
            out = [t_ids[c] for c in verdicts.emitted[i]]
            ended = next((j for j, t in enumerate(out) if t in ends), None)
            if ended is not None:  # an end id other than EOS (the kernels stop at EOS): the row ends there
                out = out[:ended + 1]
            stop = self.stops.first_stop(i, [self.tt.bytes_of[t] or b"" for t in out]) if self.stops.stops else None
            if stop is not None:  # a stop string completed by out[stop]: the row ends there
                out, ended = out[:stop + 1], stop
            if not self.greedy:
                self.record(i, verdicts.uniforms[i])
            self.emitted[i].extend(out)
            self.t_ctx[i].extend(out)
            st = self.stats[i]
            st.target_calls += 1
            st.proposed += n_d[i]
            st.accepted += min(verdicts.accepted[i], len(out))
            if ended is not None or len(self.emitted[i]) >= self.max_new_tokens:
                self.finished[i] = True
            else:
                grown = self.method.resync(self, i, out)
                if grown:
                    self.d_ctx[i].extend(grown)

    def settle_caches(self, active: list[bool]) -> None:
        """The target keeps exactly the verified context; the drafter what is still valid (methods
        that extend its context: the re-synced context; the others re-encode theirs at the next
        round); finished rows leave both caches; trailing columns no row keeps are cropped."""
        trun, drun = self.trun, self.drun
        for i in range(self.batch):
            if active[i]:
                trun.sync(i, self.t_ctx[i])
        trun.drop(self.finished)
        trun.trim()
        if drun is not None:
            if self.method.extends_drafter_context:
                for i in range(self.batch):
                    if active[i] and not self.finished[i]:
                        drun.sync(i, self.d_ctx[i])
            drun.drop(self.finished)
            drun.trim()

    def output(self, wall: float) -> GenerateOutput:
        """The result, with every row's statistics (``wall``: the call's wall time)."""
        trun, drun = self.trun, self.drun
        for i, st in enumerate(self.stats):
            st.new_tokens = len(self.emitted[i])
            st.target_positions = trun.positions[i]
            st.target_recomputed = trun.recomputed[i]
            if drun is not None:
                st.drafter_calls = drun.calls[i]
                st.drafter_positions = drun.positions[i]
                st.drafter_recomputed = drun.recomputed[i]
            st.wall_time = wall
        texts = [self.tt.decode(e).decode("utf-8", errors="replace") for e in self.emitted]
        pad = getattr(self.tt.tokenizer, "pad_token_id", None)
        return GenerateOutput(self.emitted, texts, self.stats, self.used, self.prompt_ids,
                              self.tt.eos_id if pad is None else int(pad),
                              *((self.near_ties, self.tie_flips) if self.near is not None else (None, None)))
