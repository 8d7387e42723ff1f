"""Start a local Ray (sized to the machine, no dashboard) or join a cluster.

Token authentication (Ray 2.60): a cluster started with ``RAY_AUTH_MODE=token``, or by
``ray start --head`` on a machine holding ``~/.ray/auth_token``, accepts only processes that
present its token.

- The local Ray roll_ma starts itself runs without token auth (``RAY_AUTH_MODE=disabled``
  unless you set the variable yourself), as before: nobody else joins it.
- Joining a cluster (``resources.ray_address`` or ``RAY_ADDRESS``), roll_ma leaves every
  ``RAY_AUTH_*`` variable as you set it, so the driver follows Ray's own rules: your
  ``RAY_AUTH_MODE`` and token (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
  ``~/.ray/auth_token``); with ``RAY_ADDRESS=auto`` and no mode set, an existing token turns
  token mode on.
- Actors never get ``RAY_AUTH_*`` from roll_ma: their processes are started by the raylet of
  their node and inherit its auth mode and token, which are the cluster's own by construction
  (forcing ``disabled`` into them, as roll_ma once did, made every actor of a token cluster die
  at registration). The token is never copied into a runtime env, where Ray would store it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from roll_ma.distributed.ray_health import ray_responds
from roll_ma.distributed.resources import usable_cpus
from roll_ma.errors import RunStartError

AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")

# Variables every actor process needs; set before any library reads them. No RAY_AUTH_* (see above).
WORKER_ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    "PYTHONUNBUFFERED": "1",
    # per-load progress bars and info logs of every actor would bury the step summaries
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
}


def ray_address(address: str | None = None) -> str | None:
    """The cluster to join: ``address`` (resources.ray_address), else ``RAY_ADDRESS``; None: start one."""
    return address or os.environ.get("RAY_ADDRESS") or None


def auth_hint(address: str) -> str:
    """What to check when joining ``address`` failed, given this process's auth settings."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return (
            "If the cluster uses token authentication (Ray 2.60 turns it on for `ray start --head` "
            "whenever ~/.ray/auth_token exists; Ray then logs InvalidAuthToken above), set "
            "RAY_AUTH_MODE=token and give this process the cluster's token as RAY_AUTH_TOKEN, in the file "
            "RAY_AUTH_TOKEN_PATH or in ~/.ray/auth_token (`ray get-auth-token` on the head prints it). "
            f"Otherwise check that {address} is the head's address and reachable from here."
        )
    return (
        "RAY_AUTH_MODE=token is set: check that the token this process finds (RAY_AUTH_TOKEN, the file "
        "RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token) is the cluster's (`ray get-auth-token` on the head), "
        f"and that {address} is the head's address and reachable from here."
    )


def init_ray(
    address: str | None = None, num_cpus: int | None = None, env_vars: dict[str, str] | None = None,
    log_file: str | os.PathLike | None = None,
) -> dict:
    """Join ``address`` (or ``RAY_ADDRESS``) if given, else start a local Ray; returns its resources.

    ``log_file``: the run's log file; the workers' output goes there, but for progress and roll_ma's own
    lines (``distributed/worker_output.py``), also when this process had joined a Ray already.
    """
    import ray

    from roll_ma.distributed.worker_output import route_worker_output

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not all(getattr(s, "isatty", lambda: False)() for s in (sys.stdout, sys.stderr)):
        # actors' lines go to a file or pipe: Ray's coloured "(Actor pid=...)" prefixes would be escapes there
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    if ray.is_initialized():
        if log_file is not None:
            route_worker_output(log_file)
        return ray.cluster_resources()
    address = ray_address(address)
    ours = _python_sigterm_handler()
    env = {**WORKER_ENV, **(env_vars or {})}
    kwargs: dict[str, Any] = {
        "runtime_env": {"env_vars": env},
        "logging_level": logging.WARNING,
        "log_to_driver": True,
    }
    if address:
        # AuthenticationError: token mode but no token found (newer Rays); a wrong token is a ConnectionError
        auth_error = getattr(ray.exceptions, "AuthenticationError", ConnectionError)
        join_errors = (ConnectionError, auth_error)
        try:
            with _kept_sigterm_handler(ours):
                ray.init(address=address, **kwargs)
        except join_errors as err:
            raise RunStartError(
                f"could not join the Ray cluster at {address}: {err}\n{auth_hint(address)}"
            ) from None
        mode = os.environ.get("RAY_AUTH_MODE", "disabled")
        where = f"joined the Ray cluster at {address} (auth mode {mode})"
    else:
        # a Ray of our own that nobody else joins: no token auth (and no token file written to ~/.ray)
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        # "local": always a fresh Ray of our own, even if a `ray start` cluster runs on this machine (join
        # that one with RAY_ADDRESS). Actors ask for fractions of a CPU, so a 2-core laptop fits every role.
        with _kept_sigterm_handler(ours), _own_process_group():
            ray.init(address="local", num_cpus=num_cpus or max(2, usable_cpus()), include_dashboard=False,
                     **kwargs)
        where = "started a local Ray"
    res = ray.cluster_resources()
    routed = route_worker_output(log_file) if log_file is not None else None
    print(
        f"[roll_ma] {where}: {res.get('CPU', 0):.0f} CPUs, {res.get('GPU', 0):.0f} GPUs, "
        f"{len(ray.nodes())} node(s)" + (f"; the workers' logs go to {routed.log_path}" if routed else ""),
        flush=True,
    )
    return res


def _python_sigterm_handler() -> Any:
    """The SIGTERM handler a Python caller installed (``interrupts.sigterm_as_interrupt``), else None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = signal.getsignal(signal.SIGTERM)
    return handler if callable(handler) else None


@contextlib.contextmanager
def _kept_sigterm_handler(handler: Any) -> Iterator[None]:
    """While ``ray.init`` runs: the caller's SIGTERM handler stays. Ray's would replace it (``sys.exit``
    wherever the driver is, then its node's kill-and-exit: roll_ma.interrupts says why that matters), and
    the driver's core worker would install its C failure-signal handler, which prints ``*** SIGTERM
    received ***`` and Ray's stack for a SIGTERM between its start and the end of ``ray.init`` (and at times
    aborts the driver: exit 134). That handler is left out in the driver alone (Ray's own switch, read when
    the core worker starts; Ray's processes and workers keep theirs); Python's fault handler gives a native
    crash of the driver its stack instead."""
    if handler is None:
        yield
        return
    import faulthandler

    import ray._private.ray_constants as ray_constants
    import ray._private.utils as ray_utils

    original = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda _handler: None
    no_c_handler = getattr(ray_constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", None)
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    if not faulthandler.is_enabled():
        try:
            faulthandler.enable()
        except (AttributeError, OSError, RuntimeError, ValueError):  # a stderr with no file (a notebook's)
            pass
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = original
        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = no_c_handler
        # the Python handler now (the caller's, or its "ignore" after a stop): nothing of Ray's over it
        signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGTERM))


@contextlib.contextmanager
def _own_process_group() -> Iterator[None]:
    """While ``ray.init`` starts a local Ray: its processes (GCS, raylet and, under it, the agents) start in
    a process group of their own, so that a SIGTERM to the job's group (``timeout``, Slurm, Kubernetes via
    a shell) reaches the driver alone, which stops them in order; as starting, they would die under it and
    leave the driver waiting on a dead GCS. Ray does the same on Windows, and only where they die with the
    driver anyway (kernel fate-sharing: a driver killed outright takes them along)."""
    import ray._private.services as services
    import ray._private.utils as ray_utils

    original = getattr(services, "ConsolePopen", None)
    if original is None or sys.platform == "win32" or not ray_utils.detect_fate_sharing_support():
        yield
        return

    class OwnGroupPopen(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any):
            if sys.version_info >= (3, 11):
                kwargs.setdefault("process_group", 0)
            else:
                kwargs.setdefault("start_new_session", True)
            super().__init__(*args, **kwargs)

    setattr(services, "ConsolePopen", OwnGroupPopen)  # noqa: B010 - patched for the call (mypy: a class)
    try:
        yield
    finally:
        setattr(services, "ConsolePopen", original)  # noqa: B010


def shutdown_ray() -> None:
    """Disconnect, and stop the Ray this process started. One whose GCS no longer answers has its
    processes killed first: Ray's own shutdown would wait on them (and its GCS client for 60 s)."""
    import ray

    from roll_ma.distributed.worker_output import unroute_worker_output

    unroute_worker_output()
    if not ray.is_initialized():
        return
    node = getattr(ray._private.worker, "_global_node", None)  # None: joined a Ray, not ours to stop
    if node is not None and not ray_responds():
        node.kill_all_processes(check_alive=False, allow_graceful=False)
    ray.shutdown()
