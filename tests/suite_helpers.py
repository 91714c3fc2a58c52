"""Helpers that tests in several folders share, so that no test folder keeps a copy of another's (a
test in a subfolder imports it with ``tests/`` on ``sys.path``:
``sys.path.insert(0, str(Path(__file__).resolve().parents[1]))``, then ``import suite_helpers``):

* :func:`bench_script`: a script of ``bench/`` (not a package) loaded as a module;
* :func:`save_tiny_pair`: hsd_torch's tiny target / drafter pair written as two checkpoint folders
  (``t`` and ``d``) that the command line loads;
* :func:`loopback_server`: a standard-library HTTP server on ``127.0.0.1`` and a free port, serving a
  fake engine's handler for the time of a ``with`` block (its OpenAI base URL);
* :class:`JsonHandler`: the base of such a fake: a POST's JSON body in, :meth:`JsonHandler.answer`'s
  status and JSON object out, no request log.

Nothing here imports torch at import time.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
"""The repository."""


def bench_script(path: str) -> ModuleType:
    """``bench/<path>`` (e.g. ``engines/llamacpp_conformance.py``) as a fresh module named after its
    file, with ``bench/`` importable while it loads (the scripts import each other)."""
    file = ROOT / "bench" / path
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location(file.stem, file)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(ROOT / "bench"))


def save_tiny_pair(root: Path) -> Path:
    """``hsd_torch.models.tiny.tiny_pair``'s target (and its tokenizer) saved in ``root/t``, a tiny
    GPT-2 drafter over the pair's drafter tokenizer (seed 1) in ``root/d``; returns ``root``. One
    torch thread (the timings of the fast tier assume it)."""
    import torch

    from hsd_torch.models import tiny

    torch.set_num_threads(1)
    target, tt, _, dt = tiny.tiny_pair()
    target.save_pretrained(root / "t")
    tt.save_pretrained(root / "t")
    d = tiny.tiny_gpt2(dt, seed=1)
    d.save_pretrained(root / "d")
    dt.save_pretrained(root / "d")
    return root


class JsonHandler(BaseHTTPRequestHandler):
    """A fake engine's HTTP handler: each POST's JSON body goes to :meth:`answer`, whose ``(status,
    object)`` is sent back as JSON with its length; nothing is logged."""

    def answer(self, req: dict[str, Any]) -> tuple[int, Any]:
        """The status and JSON object that answer the request ``req`` (a subclass says)."""
        raise NotImplementedError

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        code, obj = self.answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def loopback_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served on ``127.0.0.1`` and a free port by a thread while the block runs; yields the
    OpenAI base URL ``http://127.0.0.1:PORT/v1``; the server is shut down and closed after it."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()


def assert_kit_law_is_exact(ids: Any, s: Any) -> None:
    """The conformance kit's whole-draw law after ``ids`` under sampling ``s``
    (``hsd_core.conformance.sequence_law``) equals hsd_core's exact engine's target law over the kit
    as explicit models (``toy_models``), to 1e-12, with each draw's finish reason (tests/exact and
    tests/torch/conformance check their prompts with it)."""
    import pytest

    from hsd_core import conformance as kc
    from hsd_core.exact import target_law

    target = kc.kit_model("target")
    ref = kc.sequence_law(target, ids, s)
    assert sum(p for p, _ in ref.values()) == pytest.approx(1.0, abs=1e-12)
    toy, _, _, text = kc.toy_models(ids, s)
    to_kit = {j: i for j, i in enumerate(kc.toy_ids(target))} | {len(toy.vocab) - 1: kc.EOS}
    exact = {tuple(to_kit[j] for j in seq): float(p) for seq, p in target_law(toy, text, s.max_new_tokens).items()}
    assert set(exact) == set(ref)
    for seq, (p, why) in ref.items():
        assert exact[seq] == pytest.approx(p, rel=1e-12, abs=1e-15)
        assert why == ("stop" if seq[-1] == kc.EOS else "length")
