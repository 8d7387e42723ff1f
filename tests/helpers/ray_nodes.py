"""Ray nodes a test starts with `ray start` on this machine, and stops again without touching anyone else's.

Every node of one test cluster gets the same fresh RAY_TMPDIR, which its processes (and the worker
processes its raylet starts, which Ray puts in process groups of their own) inherit. Teardown stops
each `ray start` process (``stop_nodes``), then kills any process that still carries that RAY_TMPDIR, by
pid: never `ray stop`, which would stop every Ray on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """`ray start ARGS --block` in a process group of its own, returned once Ray says it runs, with what it
    said until then (its later output is read away, so its pipe never fills). If it ends first: RuntimeError
    with its output, nothing of it left."""
    cmd = [RAY, "start", *args, "--block"]
    node = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    said = []
    for line in node.stdout:  # the node's own words: the event to wait for, no polling
        said.append(line)
        if "Ray runtime started" in line:
            threading.Thread(target=node.stdout.read, daemon=True).start()
            return node, "".join(said)
    stop_nodes([node])
    raise RuntimeError(f"`{' '.join(cmd)}` ended:\n{''.join(said)}")


def stop_nodes(nodes: list[subprocess.Popen]) -> None:
    """Stop `ray start --block` processes, the head (``nodes[0]``) last, each within ~2 s.

    SIGTERM goes to each `ray start` process alone, the other nodes before the head: it drains its node
    through the head's GCS, then stops its own Ray processes. A signal to its whole process group would stop
    the GCS too, and the process would wait 30 s for a drain that can no longer happen. What is left of a
    node's group after that is killed."""
    for batch in (nodes[1:], nodes[:1]):
        for node in batch:
            if node.poll() is None:
                node.send_signal(signal.SIGTERM)
        for node in batch:
            try:
                node.wait(timeout=40)  # the drain's own limit is 30 s
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(node.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            node.wait()


class LocalCluster:
    """A head node and further nodes on this machine, each with its own CPUs, GPUs and custom resources.

    GPUs here are only declared (``--num-gpus``): Ray places GPU bundles on them, and the actors see
    CUDA_VISIBLE_DEVICES, but no CUDA exists. Use as a context manager.
    """

    def __init__(self, env: dict[str, str] | None = None):
        # short: Ray's socket paths must fit in 107 characters
        self.temp_dir = tempfile.mkdtemp(prefix="rmn", dir="/tmp")
        base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_") and k != "RAY_ADDRESS"}
        # no token auth: these nodes are the test's own, whatever ~/.ray holds
        self.env = {**base, **(env or {}), "RAY_TMPDIR": self.temp_dir, "RAY_AUTH_MODE": "disabled",
                    "RAY_USAGE_STATS_ENABLED": "0"}
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: list[subprocess.Popen] = []

    def add_node(self, cpus: int, gpus: int = 0, resources: dict[str, float] | None = None) -> None:
        """Start the head (first call) or a node joining it; returns once Ray says it runs."""
        head = not self.nodes
        where = ["--head", f"--port={self.port}", "--include-dashboard=false", "--disable-usage-stats"] \
            if head else [f"--address={self.address}"]
        resources_arg = f"--resources={json.dumps(resources or {})}"
        node, _ = start_node([*where, f"--num-cpus={cpus}", f"--num-gpus={gpus}", resources_arg,
                              "--object-store-memory=150000000"], self.env)
        self.nodes.append(node)

    def nodes_with(self, resource: str) -> list[str]:
        """Node ids (hex) of the nodes that hold ``resource``, asked from a driver of its own."""
        probe = ("import json, ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
                 "print('NODES', json.dumps({n['NodeID']: sorted(n['Resources']) for n in ray.nodes() "
                 "if n['Alive']}))")
        out = subprocess.run([sys.executable, "-c", probe, self.address], env=self.env, capture_output=True,
                             text=True, timeout=120)
        line = next((x for x in out.stdout.splitlines() if x.startswith("NODES ")), None)
        assert line is not None, out.stdout + out.stderr
        return [node for node, names in json.loads(line[6:]).items() if resource in names]

    def stop(self) -> None:
        stop_nodes(self.nodes)
        for pid in _pids_with_env("RAY_TMPDIR", self.temp_dir):  # workers in process groups of their own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _pids_with_env(name: str, value: str) -> list[int]:
    """Processes of this user whose environment sets ``name=value``."""
    want = f"{name}={value}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if want in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except OSError:  # gone, or not ours
            continue
    return pids
