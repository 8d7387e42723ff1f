"""Ray's token authentication, checked against the cluster the run joins before the driver joins it.

Ray 2.60 lets a driver in token mode join a cluster that runs without auth: ``ray.init`` succeeds, then
every actor dies "cancelled before it started" (its worker process, started by the cluster's raylet
without a token, cannot talk to the driver). The other way round, a driver without a token is turned
away by a token cluster. So before ``ray.init`` the driver asks the cluster's GCS one question without
a token (``NodeInfoGcsService.CheckAlive``, answered in milliseconds): answered means the cluster runs
without auth, UNAUTHENTICATED means it wants a token; in that case the same question with this
process's token says whether it is the cluster's.

``auth_problems`` is the decision (pure, unit-tested); ``probe_cluster`` asks the cluster. The local
Ray roll_ma starts itself (no address) runs without auth and is not probed. Ray client addresses
(``ray://``) are not probed either.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from roll_ma.config.schema import RunConfig

NO_CLUSTER_FIX = ("start it (`ray start --head`), fix the address, or unset both to run on a local Ray of "
                  "roll_ma's own")
TOKEN_HELP = ("RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token (`ray get-auth-token` on "
              "the head prints it)")


@dataclass(frozen=True)
class LocalAuth:
    """This process's auth settings, as ``ray.init`` will apply them."""

    mode_var: str | None  # RAY_AUTH_MODE as set (None: unset)
    token: str | None  # the token Ray would send (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)
    token_path: str | None  # RAY_AUTH_TOKEN_PATH as set
    auto: bool  # joining with address "auto": an existing token turns token mode on when the mode is unset

    @property
    def token_mode(self) -> bool:
        if self.mode_var is not None:
            return self.mode_var.lower() == "token"
        return self.auto and self.token is not None


@dataclass(frozen=True)
class ClusterAuth:
    """What the cluster's GCS answered: ``wants_token`` None when it could not be asked."""

    reachable: bool
    wants_token: bool | None = None
    accepts_our_token: bool | None = None  # asked only when it wants one and we have one
    detail: str = ""


def local_auth(address: str | None) -> LocalAuth:
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    token = os.environ.get("RAY_AUTH_TOKEN")
    for file in ([Path(path).expanduser()] if path else []) + [Path.home() / ".ray" / "auth_token"]:
        if token:
            break
        if file.is_file():
            token = file.read_text().strip() or None
    return LocalAuth(os.environ.get("RAY_AUTH_MODE"), token or None, path, address == "auto")


def joined_address(cfg: RunConfig) -> str | None:
    """The address ``init_ray`` will pass to ``ray.init`` (``resources.ray_address``, else RAY_ADDRESS),
    with Ray's own rule applied: RAY_ADDRESS wins over an unset or 'auto' address."""
    address = cfg.resources.ray_address or os.environ.get("RAY_ADDRESS") or None
    env = os.environ.get("RAY_ADDRESS")
    if env and address == "auto":
        address = env
    return address


def env_problems(local: LocalAuth, joining: bool) -> list[str]:
    """The auth variables themselves: a mode Ray does not know, a token file that is not there."""
    out = []
    if local.mode_var is not None and local.mode_var.lower() not in ("token", "disabled"):
        out.append(f"RAY_AUTH_MODE: the environment variable is {local.mode_var!r}; Ray knows 'token' and "
                   "'disabled' (or leave it unset)")
    if local.token_path and not Path(local.token_path).expanduser().is_file():
        out.append(f"RAY_AUTH_TOKEN_PATH: {local.token_path} is not a file; point it at the cluster's token "
                   "file or unset it")
    if joining and local.token_mode and local.token is None:
        out.append("RAY_AUTH_MODE: is token but this process has no token to join the cluster with: set "
                   f"{TOKEN_HELP}")
    return out


def auth_problems(address: str, local: LocalAuth, cluster: ClusterAuth) -> list[str]:
    """What is wrong with joining ``address`` given this process's settings and the cluster's answer."""
    if not cluster.reachable:
        return [f"resources.ray_address / RAY_ADDRESS: cannot reach the Ray cluster at {address} "
                f"({cluster.detail}); {NO_CLUSTER_FIX}"]
    if cluster.wants_token is None:
        return []  # it answered something else: leave it to ray.init and its own message
    if not cluster.wants_token and local.token_mode:
        why = ("RAY_AUTH_MODE=token is set" if local.mode_var is not None else
               "a token in ~/.ray (or RAY_AUTH_TOKEN*) turns token mode on when joining with address auto")
        return [f"RAY_AUTH_MODE: the Ray cluster at {address} runs without token authentication but {why}: "
                "the driver would join, then every actor would die 'cancelled before it started'. Set "
                "RAY_AUTH_MODE=disabled for this run (or restart the cluster with token auth: "
                "RAY_AUTH_MODE=token ray start --head ...)"]
    if cluster.wants_token and not local.token_mode:
        return [f"RAY_AUTH_MODE: the Ray cluster at {address} requires token authentication but this "
                f"process joins without a token (RAY_AUTH_MODE is {local.mode_var or 'unset'}): set "
                f"RAY_AUTH_MODE=token and give it the cluster's token in {TOKEN_HELP}"]
    if cluster.wants_token and local.token is not None and cluster.accepts_our_token is False:
        return [f"RAY_AUTH_TOKEN: the Ray cluster at {address} refuses this process's token; give it the "
                f"cluster's token in {TOKEN_HELP}"]
    return []


def probe_cluster(gcs_address: str, token: str | None, timeout_s: float = 5.0) -> ClusterAuth:
    """Ask the GCS at ``host:port`` whether it answers without a token (and with ``token``)."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    def ask(channel: grpc.Channel, metadata: tuple = ()) -> grpc.StatusCode:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            request = gcs_service_pb2.CheckAliveRequest()  # type: ignore[attr-defined]  # protobuf: no message stubs
            stub.CheckAlive(request, timeout=timeout_s, metadata=metadata)
        except grpc.RpcError as err:
            return err.code()
        return grpc.StatusCode.OK

    with grpc.insecure_channel(gcs_address) as channel:
        plain = ask(channel)
        if plain in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return ClusterAuth(False, detail=f"no answer within {timeout_s:.0f} s")
        if plain == grpc.StatusCode.OK:
            return ClusterAuth(True, wants_token=False)
        if plain != grpc.StatusCode.UNAUTHENTICATED:
            return ClusterAuth(True, detail=str(plain))
        accepted = None
        if token is not None:
            accepted = ask(channel, (("authorization", f"Bearer {token}"),)) == grpc.StatusCode.OK
        return ClusterAuth(True, wants_token=True, accepts_our_token=accepted)


def ray_auth_problems(cfg: RunConfig) -> list[str]:
    """The auth variables, and when the run joins a cluster, the cluster's answer (see the module doc)."""
    address = joined_address(cfg)
    local = local_auth(address)
    problems = env_problems(local, joining=address is not None)
    if address is None or address.startswith("ray://") or problems:
        return problems
    try:
        import ray

        if ray.is_initialized():
            return problems  # a driver that joined already (tests, notebooks): init_ray reuses it
        from ray._private.services import canonicalize_bootstrap_address

        gcs = canonicalize_bootstrap_address(address)
    except (ConnectionError, ValueError) as err:
        return [f"resources.ray_address / RAY_ADDRESS: cannot find the Ray cluster {address!r} ({err}); "
                f"{NO_CLUSTER_FIX}"]
    except ImportError:
        return problems  # a Ray without these internals: ray.init says what is wrong
    if gcs is None:
        return problems
    return auth_problems(address, local, probe_cluster(gcs, local.token))
