"""One model's batched KV cache for ``generate`` (:class:`Runner`): the ids each row holds, the
cache columns they sit in, the attention mask over those columns, crops and row drops; and the
drafter's sliding window (:func:`window_view`).

A row's tokens sit in the columns it was fed; a column a row must forget (a rejected draft, a
drafter token that the re-sync replaced, padding of a ragged block) is masked out of attention from
then on (a hole), and position ids count only a row's kept tokens, so every row computes what it
would compute alone, up to float rounding (on sliding-window layers, :func:`layer_masks` counts a
row's window in its kept positions). A batch of one row needs neither mask nor position ids:
a re-sync crops its cache at once, so it never holds a hole. The trailing columns no row keeps are
cropped off (``DynamicCache.crop(-n)``); finished rows are dropped from the cache
(``DynamicCache.batch_select_indices``). A model's sliding-window attention layers (Gemma's) keep
their whole history (:func:`new_cache`), the window being applied by the attention mask, so a
rejected draft can be cropped off at any length. The ids every row's first block starts with (a
batch of one prompt: all of it) are fed once, as one row, and that row's cache is copied to every
row (:func:`shared_prefix`).

The drafter's context need not fit its positions: when it outgrows them it sees a sliding window
(the special prefix and the last ids, the cut moving ``(positions - prefix) // 2`` ids at a time,
so the cache is refilled once per that many tokens). The drafter's law only has to be the law each
draft is drawn from, so this keeps every method lossless; :class:`hsd_torch.CoreModel` with
``window=True`` applies the same window for the mirror.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor

from . import kernels
from ._columns import Columns, layer_masks, new_cache
from ._head import HeadTap

__all__ = ["Runner", "check_model", "common_prefix", "layer_masks", "logit_width", "max_positions", "model_device",
           "new_cache", "refuse_meta", "shared_prefix", "window_view"]

ZOO_SEAMS = ("Runner.sync", "Runner._forget", "Runner._first_position")
"""What a variant of the bug zoo may replace here (:func:`hsd_torch.auditing.variants.patch_seam`): the
methods of :class:`Runner` that decide what a row's cache holds (its sync to a context, the columns
a rollback forgets, the first position id of a fed block)."""


def max_positions(config: Any) -> int | None:
    """A model config's number of positions (``n_positions`` or ``max_position_embeddings``), None if it has none."""
    for name in ("n_positions", "max_position_embeddings"):
        v = getattr(config, name, None)
        if isinstance(v, int):
            return v
    return None


def takes_logits_to_keep(model: Any) -> bool:
    """Whether ``model.forward`` takes ``logits_to_keep`` (its head then runs only where asked)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def model_device(model: Any) -> torch.device:
    """The device of a model's (first) parameters."""
    dev: torch.device = next(model.parameters()).device
    return dev


def check_model(model: Any, role: str) -> torch.device:
    """The device of ``model`` (``role``: "target" or "drafter"), checked before any work:
    ``TypeError`` for anything but a ``torch.nn.Module`` with an output embedding (a Hugging Face
    causal LM); ``ValueError`` for a model without parameters, with parameters on more than one
    device (hsd runs each model on one device: ``device_map="auto"`` splits are not supported), or
    with the model or any of its modules in training mode (named: a block put back in ``.train()``
    runs its dropout, and the law is no longer the model's), except the ``torch.nn`` modules whose
    forward never reads the mode (:func:`_mode_free_modules`: a head replaced by a fresh
    ``nn.Linear``, which is created in training mode, changes nothing). The meta device is the
    caller's to refuse (:func:`refuse_meta`), after it compares the two models' devices."""
    if not isinstance(model, torch.nn.Module) or not callable(getattr(model, "get_output_embeddings", None)):
        got = "None" if model is None else type(model).__name__
        raise TypeError(f"{role} must be a Hugging Face causal LM (a torch.nn.Module, e.g. "
                        f"transformers.AutoModelForCausalLM.from_pretrained(...)), got {got}")
    devices = {p.device for p in model.parameters()}
    if not devices:
        raise ValueError(f"the {role} has no parameters")
    if len(devices) > 1:
        where = ", ".join(sorted(map(str, devices)))
        raise ValueError(f"the {role}'s parameters are on more than one device ({where}): hsd runs each model on one "
                         f"device; move the {role} with .to(device) (a model split with device_map='auto' is not "
                         "supported)")
    free = _mode_free_modules()
    for name, module in model.named_modules():
        if module.training and (not name or type(module) not in free):
            what = f"the {role}" if not name else f"the {role}'s module {name!r}"
            raise ValueError(f"{what} is in training mode (dropout would make its law random); call .eval() on the "
                             f"{role} first (generate never changes the models itself)")
    return devices.pop()


_MODE_FREE = (
    "Linear", "Bilinear", "Identity", "Embedding", "EmbeddingBag", "LayerNorm", "GroupNorm", "RMSNorm",
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "Flatten", "Unflatten",
    "ReLU", "ReLU6", "LeakyReLU", "PReLU", "ELU", "CELU", "SELU", "GELU", "SiLU", "Mish", "GLU", "Sigmoid", "Tanh",
    "Hardsigmoid", "Hardswish", "Hardtanh", "Hardshrink", "Softshrink", "Softplus", "Softsign", "Tanhshrink",
    "LogSigmoid", "Threshold", "Softmax", "Softmin", "LogSoftmax",
)


def _mode_free_modules() -> frozenset[type]:
    """The ``torch.nn`` module classes whose forward does not depend on training mode (exact
    classes: a subclass may read it): linear maps, embeddings, layer/group/RMS norms, convolutions,
    shape changes and activations. Not dropout, batch/instance norms (batch statistics), ``RReLU``
    (random slopes in training), RNNs or ``MultiheadAttention``, nor any model-specific class."""
    return frozenset(getattr(torch.nn, n) for n in _MODE_FREE if hasattr(torch.nn, n))


def refuse_meta(dev: torch.device, role: str) -> None:
    """``ValueError`` when a model's parameters are on the meta device (no weights to run)."""
    if dev.type == "meta":
        raise ValueError(f"the {role}'s parameters are on the meta device (shapes without weights): load its "
                         "weights first (from_pretrained without device='meta', or .to_empty() and load_state_dict)")


def logit_width(model: Any) -> int:
    """The number of logit columns a model produces (its output embedding's rows, else ``config.vocab_size``)."""
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "weight"):
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


def window_view(context: Sequence[int], n_prefix: int, max_pos: int) -> list[int]:
    """The drafter's sliding window: the part of ``context`` (``n_prefix`` special ids, then the
    body) that a model with ``max_pos`` positions sees.

    ``context`` itself when it fits; else the special prefix followed by the body without its
    first ``s`` ids, where ``s`` is the smallest multiple of ``step = max(1, (max_pos - n_prefix)
    // 2)`` that makes it fit. ``s`` is a function of the context's length alone (so the windowed
    law is a function of the context, which the mirror needs) and moves by ``step`` ids at a time
    (so the cache is refilled once per ``step`` new ids, not at every token)."""
    n = len(context)
    if n <= max_pos:
        return list(context)
    room = max_pos - n_prefix
    if room < 1:
        raise ValueError(f"a model with {max_pos} positions cannot hold its {n_prefix} special prefix ids and text")
    step = max(1, room // 2)
    body = n - n_prefix
    s = -(-(body - room) // step) * step
    return list(context[:n_prefix]) + list(context[n_prefix + s:])


def read_logits(logits: Tensor, read: list[list[int]], keep: list[int], width_in: int, width: int, one: bool
                ) -> Tensor:
    """The logits each row reads (``read``: its block columns) out of a model's ``[rows, C, V]``,
    computed at every block column (``C = width_in``) or at the columns ``keep``
    (``logits_to_keep``): ``[rows, width, V]`` (``one``: ``[rows, V]``)."""
    if logits.shape[1] != width_in:  # the kept columns only: read them by their rank
        if logits.shape[1] != len(keep):
            raise AssertionError(f"the model returned logits at {logits.shape[1]} columns, asked for "
                                 f"{len(keep)} of {width_in}")
        rank = {c: k for k, c in enumerate(keep)}
        read = [[rank[c] for c in r] for r in read]
    c = read[0][0]
    if all(r == read[0] for r in read) and read[0] == list(range(c, c + width)):
        got = logits[:, c] if one else logits[:, c:c + width]  # every row reads the same columns: a view
    else:
        got = gather_columns(logits, read, one)
    return got


def gather_columns(x: Tensor, read: list[list[int]], one: bool) -> Tensor:
    """``x [rows, C, D]`` at each row's columns ``read`` (one list of ``width`` columns per row):
    ``[rows, width, D]`` (``one``: ``[rows, D]``, the first column)."""
    idx = torch.tensor(read, dtype=torch.long, device=x.device)
    got = x.gather(1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
    return got[:, 0] if one else got


def _scatter_live(got: Tensor, live: list[int], batch: int) -> Tensor:
    """``got``, one row per row in the cache (``live``, in cache order), as ``[batch, ...]``: zeros
    for the rows dropped from the cache (``got`` itself when none is)."""
    if len(live) == batch:
        return got
    full = got.new_zeros((batch, *got.shape[1:]))
    full[torch.tensor(live, dtype=torch.long, device=got.device)] = got
    return full


def batch_inputs(runner: Runner, blocks: Sequence[Sequence[int]], start: int, width_in: int
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """A batched forward's inputs for ``runner``'s rows in the cache, each block padded to
    ``width_in`` columns from cache column ``start``: the ids ``[rows, width_in]`` (``pad_id`` after
    a row's block), their position ids (from :meth:`Runner._first_position`, capped at the model's
    last position: padding past it is never read) and the new mask columns (1 where a row is fed,
    0 for its padding); the blocks are recorded (:meth:`Runner._record`). One host-to-device copy
    for all three. ``AssertionError`` for a block of a row dropped from the cache."""
    toks: list[int] = []
    pos: list[int] = []
    valid: list[int] = []
    cap = (runner.max_pos - 1) if runner.max_pos is not None else None
    for i in runner.live:
        n0 = runner._first_position(i)
        lb = len(blocks[i])
        top = n0 + width_in
        pos.extend(range(n0, top) if cap is None or top <= cap + 1 else [min(p, cap) for p in range(n0, top)])
        valid.extend([1] * lb + [0] * (width_in - lb))
        toks.extend(runner._record(i, blocks[i], start) if lb else [])
        toks.extend([runner.pad_id] * (width_in - lb))
    for i in range(runner.batch):
        if blocks[i] and runner.slot(i) < 0:
            raise AssertionError(f"row {i} was dropped from the {runner.name}'s cache")
    ids_in, pos_in, new_mask = kernels._host_tensor(toks + pos + valid, torch.long, runner.device).view(
        3, len(runner.live), width_in).unbind(0)
    return ids_in, pos_in, new_mask


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two id lists (a binary search over slice
    comparisons, which run in C: contexts are long and usually differ only near their end)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:  # a[:lo] == b[:lo], a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class Runner:
    """A model, its batch cache and, per row, the ids it holds and the cache columns they sit in.

    Rows are the batch's rows (``0 .. batch-1``); ``live`` lists those still in the cache, in
    cache order (:meth:`drop` removes finished rows from the cache with
    ``DynamicCache.batch_select_indices``). With ``window`` set (the drafter), contexts longer
    than the model's positions are seen through :func:`window_view`; without it (the target),
    such a context raises ``ValueError``.

    A batch of one row never holds holes: where :meth:`sync` drops ids it crops the cache at once
    (the dropped ids are the row's last columns), so its columns are exactly its ids, in order, and
    the model runs without an attention mask and without position ids (plain causal attention over
    the cache, positions counted from the cache's length: what the mask of ones and the positions
    they replace would give). Batches of several rows pass both (:attr:`columns`:
    :class:`hsd_torch.engine._columns.Columns`, the cache's width, attention mask and column positions),
    holes and padding included.

    The cache is :func:`new_cache`'s: sliding-window layers keep their full history, so crops work
    past the window. In a batch of a model with sliding-window layers (``columns.positions``), each
    forward gets :func:`layer_masks`' masks per layer type, so that every row's window counts its
    own kept positions, not the batch's columns (padding and holes)."""

    def __init__(self, model: Any, batch: int, pad_id: int, name: str, window: bool = False,
                 n_prefix: Sequence[int] = ()) -> None:
        self.model = model
        self.name = name
        self.device = model_device(model)
        self.cache, sliding = new_cache(model)
        self.columns = Columns(model, batch, self.device, sliding, name)  # the cache's width, mask and positions
        self.batch = batch
        self.live: list[int] = list(range(batch))
        self._slot: dict[int, int] = {i: i for i in range(batch)}
        self.ids: list[list[int]] = [[] for _ in range(batch)]
        self.cols: list[list[int]] = [[] for _ in range(batch)]
        self.high = [0] * batch
        self.calls = [0] * batch
        self.positions = [0] * batch
        self.recomputed = [0] * batch
        self.pad_id = pad_id
        self.max_pos = max_positions(model.config)
        self.window = window and self.max_pos is not None
        self.n_prefix = list(n_prefix) if n_prefix else [0] * batch
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = takes_logits_to_keep(model)
        self.head = HeadTap(model)
        self.want_hidden = False
        """Set: :meth:`feed` also keeps the final hidden states at the columns it returns (:attr:`hidden`)."""
        self.hidden: Tensor | None = None
        """With :attr:`want_hidden`, the head's input ``[B, width, H]`` at the columns the last
        :meth:`feed` returned logits for (zeros for dropped rows); else None."""

    def feed(self, blocks: Sequence[Sequence[int]], starts: Sequence[int], width: int | None,
             head_rows: Tensor | None = None) -> Tensor:
        """Run the model on one block of new ids per row (ragged; an empty block feeds nothing;
        rows dropped from the cache must have empty blocks); returns the logits ``[B, width, V]``
        at block columns ``starts[b] + j`` (clamped into the block), zeros for dropped rows;
        ``width=None``: ``[B, V]``, the column ``starts[b]`` alone. ``head_rows [N]`` (int64 ids on
        the model's device): the logits of those ids only, ``[..., N]`` in that order.

        The head runs only where a row reads: at the block columns every row reads
        (``logits_to_keep``: a prefill's last position; 1 MB per position on Gemma's 262,144 ids),
        else (ragged reads, or ``head_rows``) at each row's own columns and on those ids
        (:class:`hsd_torch.engine._head.HeadTap`): exactly the ``[B, width, N]`` returned."""
        one = width is None
        width = 1 if width is None else width
        shared, read0 = shared_prefix(self, blocks, starts, width, head_rows)
        if shared:
            pre = _prefill(self, blocks, shared, [c for c in read0 if c < shared])
            blocks, starts = [b[shared:] for b in blocks], [s - shared for s in starts]
            if read0:  # the prefix's logits read from the one row, the rest from the remainder
                return _read_after_prefill(self, blocks, read0, shared, pre, one)
        live = self.live
        start = self.columns.width
        dev = self.device
        width_in = max(1, max(len(blocks[r]) for r in live)) if self.columns.masked or not blocks[0] else len(blocks[0])
        hi = width_in - 1
        read = [[min(max(starts[i] + j, 0), hi) for j in range(width)] for i in live]
        keep = sorted({c for r in read for c in r})
        kw: dict[str, Any] = {self._cache_kw: self.cache}
        steer = self.head.usable and (head_rows is not None or any(r != read[0] for r in read))
        if self._keep_kw and len(keep) < width_in and not steer:
            kw["logits_to_keep"] = kernels._host_tensor(keep, torch.long, dev)
        if self.want_hidden:
            kw["output_hidden_states"] = True
        with self.head.steer(kernels._host_tensor(read, torch.long, dev), head_rows) if steer else nullcontext(
                [True]) as fired:
            out = self._forward(blocks, start, width_in, kw)
        if not fired[0]:
            raise AssertionError(f"the {self.name} computed its logits without calling its output head module "
                                 "(get_output_embeddings()): hsd cannot read them at each row's positions")
        self.columns.width = start + width_in
        logits: Tensor = out.logits
        hidden = gather_columns(out.hidden_states[-1], read, one) if self.want_hidden else None
        self.hidden = None if hidden is None else _scatter_live(hidden, live, self.batch)
        if steer:  # exactly the logits read: [rows, width, N]
            got = logits[:, 0] if one else logits
        else:
            got = read_logits(logits, read, keep, width_in, width, one)
            if head_rows is not None:  # a head the tap cannot steer: its full logits, those ids taken
                got = got.index_select(-1, head_rows)
        return _scatter_live(got, live, self.batch)

    def _forward(self, blocks: Sequence[Sequence[int]], start: int, width_in: int, kw: dict[str, Any]) -> Any:
        """The model's forward over the rows' blocks (padded to ``width_in`` columns), recorded."""
        if not self.columns.masked and blocks[0]:  # one row: its ids alone (no mask, no positions, no padding)
            row = self._record(0, blocks[0], start)
            return self.model(input_ids=kernels._host_tensor([row], torch.long, self.device), use_cache=True, **kw)
        ids_in, pos_in, new_mask = batch_inputs(self, blocks, start, width_in)
        am = self.columns.extend(new_mask, pos_in, start)
        return self.model(input_ids=ids_in, attention_mask=am, position_ids=pos_in, use_cache=True, **kw)

    def _record(self, i: int, block: Sequence[int], start: int) -> list[int]:
        """Row ``i`` is fed ``block`` (non-empty) at cache columns from ``start``: check that it fits
        the model's positions, and record ids, columns and counts; returns the ids as ints."""
        n0 = len(self.ids[i])
        lb = len(block)
        if self.max_pos is not None and n0 + lb > self.max_pos:
            raise ValueError(
                f"the {self.name}'s context would grow to {n0 + lb} tokens, beyond its {self.max_pos} "
                "positions; shorten the prompt or max_new_tokens")
        row = [int(t) for t in block]
        self.calls[i] += 1
        self.positions[i] += lb
        self.recomputed[i] += max(0, min(self.high[i], n0 + lb) - n0)
        self.ids[i].extend(row)
        self.cols[i].extend(range(start, start + lb))
        self.high[i] = max(self.high[i], n0 + lb)
        return row

    def slot(self, i: int) -> int:
        """Row ``i``'s index in the cache's batch, -1 once dropped."""
        return self._slot.get(i, -1)

    def sync(self, i: int, context: Sequence[int]) -> list[int]:
        """Keep the longest prefix of row ``i``'s cached ids that ``context`` (seen through the
        window, if any) starts with (mask the rest); returns the ids still to feed, at least one
        (the last id is fed again when the cache holds all of it: its logits are needed)."""
        if self.window and self.max_pos is not None and len(context) > self.max_pos:
            context = window_view(context, self.n_prefix[i], self.max_pos)
        have = self.ids[i]
        nh = len(have)
        if nh < len(context) and list(context[:nh]) == have:
            return list(context[nh:])
        m = common_prefix(have, context)
        if m == len(context) and m > 0:
            m -= 1
        if m < nh:
            drop = self._forget(i, m)
            if drop and not self.columns.masked:  # one row: its dropped ids are the cache's last columns
                self.cache.crop(drop[0] - self.columns.width)
                self.columns.width = drop[0]
            elif drop:
                self.columns.hide(self.slot(i), drop)
            del have[m:]
            del self.cols[i][m:]
        return list(context[m:])

    def _first_position(self, i: int) -> int:
        """The position id of the next id fed to row ``i``: the number of ids it keeps (a rejected
        draft's position is given again). A hook so that ``hsd_torch.auditing.variants`` can model the bug
        of positions not reset after a rejection."""
        return len(self.ids[i])

    def _forget(self, i: int, m: int) -> list[int]:
        """The cache columns row ``i`` forgets when it keeps only its first ``m`` ids: all the
        columns of the others. A hook so that ``hsd_torch.auditing.variants`` can model a cache cropped one
        position short."""
        return self.cols[i][m:]

    def drop(self, finished: Sequence[bool]) -> None:
        """Remove finished rows from the cache (one ``batch_select_indices``), if any are left in it."""
        keep = [s for s, i in enumerate(self.live) if not finished[i]]
        if len(keep) == len(self.live) or not keep:
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(idx)
        self.columns.select(idx)
        self.live = [self.live[s] for s in keep]
        self._slot = {i: s for s, i in enumerate(self.live)}

    def trim(self) -> None:
        """Crop the trailing cache columns that no row in the cache keeps."""
        last = max((self.cols[i][-1] + 1 for i in self.live if self.cols[i]), default=0)
        n = self.columns.width - last
        if n > 0 and last > 0:
            self.cache.crop(-n)
            self.columns.crop(last)


def shared_prefix(run: Runner, blocks: Sequence[Sequence[int]], starts: Sequence[int], width: int,
                  head_rows: Tensor | None) -> tuple[int, list[int]]:
    """Before the first feed of a batch (every row in the cache, no column yet; no sliding-window
    layers): how many ids every row's block starts with that :func:`_prefill` feeds once, as one
    row, and whose cache it copies to every row. ``(n, read)``: with ``read`` (the block columns
    every row reads, the same for all, within the blocks; no ``head_rows``, no hidden states) the
    whole shared prefix, its logits read from the one row; else (``read`` empty) the ids before
    any row's first read and before its last id. ``(0, [])``: nothing shared.

    The prefix's keys, values and logits are computed by the same model at the same positions,
    now for one row instead of every row: a conformance case's rows all share their prompt (the
    BOS alone at ``plain``: 22 % of SD's fed positions; 28 % at ``pos_plain``; bench/RESULTS.md,
    conformance section). Row by row they may differ only where the matrix products round
    differently for one row than for many (on x86-64 with MKL, float32, they were measured bit
    for bit the same, and so were the conformance engine's draws)."""
    cols = run.columns
    if cols.width or not cols.masked or cols.positions or len(run.live) != run.batch:
        return 0, []
    first, shortest = blocks[0], min(len(b) for b in blocks)
    n = shortest if run.max_pos is None else min(shortest, run.max_pos)
    for b in blocks[1:]:
        if n < 1:
            return 0, []
        n = min(n, common_prefix(first[:n], b[:n]))
    read, longest = [starts[0] + j for j in range(width)], max(len(b) for b in blocks)
    uniform = head_rows is None and not run.want_hidden and all(s == starts[0] for s in starts)
    if n > 0 and uniform and read[0] >= 0 and read[-1] < longest and (read[-1] >= n or shortest == n == longest):
        return n, read
    n = min(n, shortest - 1, min(max(s, 0) for s in starts))
    return max(n, 0), []


def _prefill(run: Runner, blocks: Sequence[Sequence[int]], n: int, read: list[int]) -> Tensor | None:
    """Feed the first ``n`` ids of ``blocks[0]`` (every block's first ``n``: :func:`shared_prefix`) as
    one row, copy its cache to every row (``DynamicCache.batch_repeat_interleave``) and record them
    for every row as the whole block would (ids, columns, positions; the call itself where the
    block is all prefix, else by the remainder's feed); returns the logits ``[1, len(read), V]``
    at the prefix columns ``read`` (None when none is read)."""
    prefix = [int(t) for t in blocks[0][:n]]
    kw: dict[str, Any] = {run._cache_kw: run.cache}
    if run._keep_kw:
        kw["logits_to_keep"] = kernels._host_tensor(read, torch.long, run.device) if read else 1
    out = run.model(input_ids=kernels._host_tensor([prefix], torch.long, run.device),
                     attention_mask=torch.ones(1, n, dtype=torch.long, device=run.device),
                     position_ids=kernels._host_tensor([list(range(n))], torch.long, run.device),
                     use_cache=True, **kw)
    run.cache.batch_repeat_interleave(run.batch)
    run.columns.append(torch.ones(run.batch, n, dtype=torch.long, device=run.device),
                        torch.arange(n, device=run.device).expand(run.batch, -1))
    for i in range(run.batch):
        run.ids[i].extend(prefix)
        run.cols[i].extend(range(n))
        run.positions[i] += n
        run.high[i] = n
        run.calls[i] += int(len(blocks[i]) == n)  # a block all prefix: fed by this call alone
    if not read:
        return None
    logits: Tensor = out.logits
    return logits if logits.shape[1] == len(read) else logits[:, read]


def _read_after_prefill(run: Runner, blocks: Sequence[Sequence[int]], read: list[int], n: int, pre: Tensor | None,
                        one: bool) -> Tensor:
    """The logits every row reads at block columns ``read`` once the shared prefix of ``n`` ids is
    in the cache (``pre``: the one row's at the columns before ``n``): those, then the remainder
    ``blocks`` fed (:meth:`Runner.feed`) and read at the columns from ``n``: ``[B, width, V]``
    (``one``: ``[B, V]``)."""
    run.hidden = None
    rest = [c - n for c in read if c >= n]
    parts = [] if pre is None else [pre.expand(run.batch, -1, -1)]
    if rest:
        parts.append(run.feed(blocks, [rest[0]] * run.batch, len(rest)))
    got = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0].contiguous()
    return got[:, 0] if one else got
