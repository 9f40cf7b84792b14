"""``rendezvous(init_method)``: parse the URL, pick its handler, bring the ranks together."""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, cast

from procgroup import _auth
from procgroup._settings import timeout_seconds
from procgroup.errors import InvalidArgumentError, RendezvousError

from . import _torchelastic
from ._env import RendezvousEnv
from ._file import FileStore
from ._result import RendezvousResult, job_store, join
from ._tcp import TCPStore

logger = logging.getLogger(__name__)

Handler = Callable[..., RendezvousResult]

_registered: dict[str, Handler] = {}
_registry_lock = threading.Lock()


# ------------------------------------------------------------------ argument checks
def _check_int(value: object, name: str, scheme: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(
            f"{scheme}://: {name} must be an int, got {type(value).__name__} {value!r} "
            "(argument)"
        )
    if value < minimum and value != -1:
        raise InvalidArgumentError(
            f"{scheme}://: {name} must be >= {minimum} (or -1 for 'not given'), got "
            f"{value} (argument)"
        )
    return value


def _check_timeout(timeout: object, scheme: str) -> float:
    return timeout_seconds(timeout, source=f"{scheme}://: timeout")


def _query(url: urllib.parse.SplitResult, scheme: str, allowed: tuple[str, ...]) -> dict[str, str]:
    """The URL's ``?a=b`` parameters; unknown ones are an error."""
    try:
        pairs = urllib.parse.parse_qsl(url.query, keep_blank_values=True, strict_parsing=bool(url.query))
    except ValueError:
        raise InvalidArgumentError(f"{scheme}://: cannot parse the URL query {url.query!r}") from None
    params = dict(pairs)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise InvalidArgumentError(
            f"{scheme}://: unknown URL parameter(s) {unknown}; this init method accepts "
            f"{list(allowed)}"
        )
    return params


def _merge_int(
    arg: int, params: dict[str, str], name: str, scheme: str, minimum: int
) -> tuple[int, str]:
    """The argument if given (not -1), else the URL parameter; returns (value, source)."""
    if arg != -1:
        return arg, "argument"
    if name in params:
        text = params[name]
        try:
            value = int(text)
        except ValueError:
            raise InvalidArgumentError(
                f"{scheme}://: URL parameter {name}={text!r} is not an integer"
            ) from None
        if value < minimum:
            raise InvalidArgumentError(
                f"{scheme}://: URL parameter {name}={value} must be >= {minimum}"
            )
        return value, "URL parameter"
    return -1, ""


def _check_rank(rank: int, world_size: int, scheme: str, rank_src: str, size_src: str) -> None:
    if rank >= world_size:
        raise InvalidArgumentError(
            f"{scheme}://: rank {rank} (from {rank_src}) is out of range for world_size "
            f"{world_size} (from {size_src}); ranks are 0..{world_size - 1}"
        )


def _host_port(url: urllib.parse.SplitResult, scheme: str) -> tuple[str, int]:
    try:
        host, port = url.hostname, url.port
    except ValueError as exc:
        raise InvalidArgumentError(f"{scheme}://: bad address {url.netloc!r}: {exc}") from None
    if not host:
        raise InvalidArgumentError(
            f"{scheme}://: the URL has no host; expected {scheme}://HOST:PORT, got "
            f"{urllib.parse.urlunsplit(url)!r}"
        )
    if port is None:
        raise InvalidArgumentError(
            f"{scheme}://: the URL has no port; expected {scheme}://HOST:PORT, got "
            f"{urllib.parse.urlunsplit(url)!r}"
        )
    if port == 0:
        raise InvalidArgumentError(f"{scheme}://: port 0 in the URL; give a real port")
    return host, port


# ------------------------------------------------------------------ built-in methods
def launcher_hint(world_size: int = -1) -> str:
    """The procgroup-run command line that would start this program with its ranks set."""
    import shlex
    import sys

    argv = list(sys.argv) if sys.argv and sys.argv[0] not in ("", "-c") else ["script.py"]
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and getattr(spec, "name", None):  # started as python -m pkg.mod
        argv = ["-m", spec.name.removesuffix(".__main__"), *argv[1:]]
    n = world_size if world_size > 0 else 4
    return "`procgroup-run --nproc-per-node " + str(n) + " " + shlex.join(argv) + "`"


def env_rendezvous(
    url: urllib.parse.SplitResult,
    *,
    rank: int,
    world_size: int,
    group_name: str,
    timeout: float,
    environ: dict[str, str] | None = None,
    token: str | bytes | None = None,
) -> RendezvousResult:
    """env://: MASTER_ADDR/MASTER_PORT, rank and size from arguments or the launcher."""
    scheme = "env"
    params = _query(url, scheme, ("rank", "world_size"))
    env = RendezvousEnv.from_environ(os.environ if environ is None else environ)
    rank, rank_src = _merge_int(rank, params, "rank", scheme, 0)
    world_size, size_src = _merge_int(world_size, params, "world_size", scheme, 1)
    if rank == -1:
        value, var = env.rank_and_source()
        if value is None:
            raise InvalidArgumentError(
                "env://: RANK is not set, so this process was not started by a launcher. "
                f"Start the program with {launcher_hint(world_size)}, or set RANK, "
                "WORLD_SIZE, MASTER_ADDR and MASTER_PORT (or one of OMPI_COMM_WORLD_RANK, "
                "PMI_RANK, PMIX_RANK, SLURM_PROCID), or pass rank=... and world_size=..."
            )
        rank, rank_src = value, f"environment variable {var}"
    if world_size == -1:
        value, var = env.size_and_source()
        if value is None:
            raise InvalidArgumentError(
                "env://: WORLD_SIZE is not set; pass world_size=... or set one of "
                "WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS (procgroup-run "
                f"sets it: {launcher_hint(-1)})"
            )
        world_size, size_src = value, f"environment variable {var}"
    _check_rank(rank, world_size, scheme, rank_src, size_src)
    addr, _addr_src = env.master_addr_and_source()
    if addr is None:
        raise InvalidArgumentError(
            "env://: MASTER_ADDR is not set (environment variable; under Slurm it "
            "defaults to the first host of SLURM_JOB_NODELIST)"
        )
    port, port_src = env.master_port_and_source()
    if port is None:
        raise InvalidArgumentError(
            "env://: MASTER_PORT is not set (environment variable; inside a Slurm job it "
            "defaults to a port derived from SLURM_JOB_ID and SLURM_STEP_ID)"
        )
    if port_src != "MASTER_PORT":
        logger.debug("env://: master %s:%d (port from %s)", addr, port, port_src)
    environ_ = os.environ if environ is None else environ
    if port_src == "MASTER_PORT" and _torchelastic.agent_store_in_use(environ_):
        return _agent_store_rendezvous(addr, port, rank, world_size, group_name, timeout, token, environ_)
    return _tcp_store_rendezvous(
        scheme, addr, port, rank, world_size, group_name, timeout, token
    )


def _agent_store_rendezvous(
    agent_host: str, agent_port: int, rank: int, world_size: int, group_name: str,
    timeout: float, token: str | bytes | None, environ: Mapping[str, str],
) -> RendezvousResult:
    """Under torchrun, whose agent's store holds MASTER_PORT: rank 0's store on a free port,
    its address passed through the agent's store (:mod:`._torchelastic`)."""
    from procgroup._netif import choose_address

    deadline = time.monotonic() + timeout
    agent = _torchelastic.AgentStore(agent_host, agent_port, timeout)
    key = _torchelastic.address_key(environ, group_name)
    if rank == 0:
        host = choose_address(agent_host)

        def announce(port: int) -> None:
            agent.publish(key, host, port)
            logger.debug("env://: torchrun's agent store holds MASTER_PORT; rank 0's store is at %s:%d",
                         host, port)

        return _tcp_store_rendezvous("env", host, 0, rank, world_size, group_name, timeout, token,
                                     announce=announce, deadline=deadline)
    host, port = agent.fetch(key)
    return _tcp_store_rendezvous("env", host, port, rank, world_size, group_name,
                                 max(deadline - time.monotonic(), 0.001), token, deadline=deadline)


def tcp_rendezvous(
    url: urllib.parse.SplitResult,
    *,
    rank: int,
    world_size: int,
    group_name: str,
    timeout: float,
    token: str | bytes | None = None,
) -> RendezvousResult:
    """tcp://HOST:PORT (rank 0 hosts the store) or tcp://MULTICAST:PORT (automatic ranks)."""
    scheme = "tcp"
    host, port = _host_port(url, scheme)
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        ip = None
    if ip is not None and ip.is_multicast:
        from ._multicast import multicast_rendezvous

        params = _query(url, scheme, ("world_size", "ttl"))
        world_size, _ = _merge_int(world_size, params, "world_size", scheme, 1)
        if world_size == -1:
            raise InvalidArgumentError(
                "tcp://: world_size must be given explicitly (argument or ?world_size=) "
                f"with the multicast address {host}"
            )
        if rank != -1:
            raise InvalidArgumentError(
                f"tcp://: ranks are assigned automatically with the multicast address "
                f"{host}; do not pass rank (got {rank} as argument)"
            )
        ttl, _ = _merge_int(-1, params, "ttl", scheme, 1)
        return multicast_rendezvous(
            host, port, world_size=world_size, group_name=group_name, timeout=timeout,
            ttl=1 if ttl == -1 else ttl, token=token,
        )
    params = _query(url, scheme, ("rank", "world_size"))
    rank, rank_src = _merge_int(rank, params, "rank", scheme, 0)
    world_size, size_src = _merge_int(world_size, params, "world_size", scheme, 1)
    if rank == -1:
        raise InvalidArgumentError(
            "tcp://: rank must be given explicitly (argument rank= or URL ?rank=); "
            "automatic ranks need a multicast address or file://"
        )
    if world_size == -1:
        raise InvalidArgumentError(
            "tcp://: world_size must be given explicitly (argument world_size= or URL "
            "?world_size=)"
        )
    _check_rank(rank, world_size, scheme, rank_src, size_src)
    return _tcp_store_rendezvous(scheme, host, port, rank, world_size, group_name, timeout, token)


def _tcp_store_rendezvous(
    scheme: str, host: str, port: int, rank: int, world_size: int, group_name: str,
    timeout: float, token: str | bytes | None = None, *,
    announce: Callable[[int], None] | None = None, deadline: float | None = None,
) -> RendezvousResult:
    """Rank 0 hosts a TCPStore at host:port (port 0: a free one, which ``announce`` is told),
    the others connect; then every rank joins."""
    deadline = time.monotonic() + timeout if deadline is None else deadline
    from procgroup.errors import StoreTimeoutError

    key = _auth.resolve_token(token, host, where=f"{scheme}://")
    try:
        base = TCPStore(
            host, port, world_size, is_master=rank == 0, timeout=timeout,
            wait_for_workers=False, job_key=key,
        )
    except StoreTimeoutError as exc:
        raise StoreTimeoutError(
            f"{scheme}://: rendezvous timed out after {timeout:g}s: rank {rank} could not "
            f"reach rank 0's store at {host}:{port} ({exc})",
            op="rendezvous", ranks=[0],
        ) from None
    if announce is not None:
        try:
            announce(base.port)
        except BaseException:
            base.close()
            raise
    return join(
        job_store(base, group_name), scheme + "://", rank, world_size, deadline, host,
        total_timeout=timeout, job_key=key,
    )


def file_rendezvous(
    url: urllib.parse.SplitResult,
    *,
    rank: int,
    world_size: int,
    group_name: str,
    timeout: float,
    token: str | bytes | None = None,
) -> RendezvousResult:
    """file:///PATH: a FileStore; ranks from an atomic counter in the file when rank=-1.

    The file is created 0600 and holds a random job token (the first rank puts it
    there): who can read the file may join. A token given as argument or in
    $PROCGROUP_JOB_TOKEN wins over it. Once every rank has arrived the path is removed
    (the ranks keep the file open for the job's Store), so the next job on the same path
    starts afresh even when this one's ranks never call destroy_process_group. A file
    left by a job that died is refused with a RendezvousError saying what to do.
    """
    scheme = "file"
    if url.netloc not in ("", "localhost"):
        raise InvalidArgumentError(
            f"file://: the path must be absolute, as in file:///dir/name; got host part "
            f"{url.netloc!r} in {urllib.parse.urlunsplit(url)!r}"
        )
    path = urllib.parse.unquote(url.path)
    if not path or path.endswith("/"):
        raise InvalidArgumentError(
            f"file://: the URL names no file (path {path!r}); expected file:///dir/name"
        )
    params = _query(url, scheme, ("rank", "world_size"))
    rank, rank_src = _merge_int(rank, params, "rank", scheme, 0)
    world_size, size_src = _merge_int(world_size, params, "world_size", scheme, 1)
    if world_size == -1:
        raise InvalidArgumentError(
            "file://: world_size must be given explicitly (argument world_size= or URL "
            "?world_size=)"
        )
    if rank != -1:
        _check_rank(rank, world_size, scheme, rank_src, size_src)
    deadline = time.monotonic() + timeout
    try:
        base = FileStore(path, world_size, timeout=timeout)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"file://: {exc}") from None
    try:
        st = os.stat(base.path)
        if st.st_mode & 0o077 or st.st_uid != os.getuid():
            logger.warning("file://: %s is readable or owned by other users (mode %o, uid %d): "
                           "anyone who can read it can join this job", base.path,
                           st.st_mode & 0o777, st.st_uid)
    except OSError:
        pass
    leftover = base.leftover()
    if leftover is not None:
        base.close()
        raise RendezvousError(f"file://: {leftover}")
    store = job_store(base, group_name)
    try:
        if token is None:
            token = os.environ.get(_auth.ENV_TOKEN) or None
        if token is None:
            token = store.compare_set("rdzv/token", b"", _auth.new_token().encode())
        key = _auth.job_key(token)
    except BaseException:
        store.close()
        raise
    result = join(
        store, "file://", rank, world_size, deadline, None,
        total_timeout=timeout, assign_rank=rank == -1, job_key=key,
    )
    try:
        # every rank has read the file: remove it now (the 2017 behaviour), so ranks that
        # never close their store (os._exit) do not leave it to the next job on this path
        base.arrived()
    except BaseException:
        store.close()
        raise
    return result


_BUILTIN: dict[str, Handler] = {
    "env": env_rendezvous,
    "tcp": tcp_rendezvous,
    "file": file_rendezvous,
}


# ------------------------------------------------------------------ registry
def _check_scheme(scheme: object) -> str:
    if not isinstance(scheme, str) or not scheme:
        raise InvalidArgumentError(f"init method scheme must be a non-empty str, got {scheme!r}")
    s = scheme.lower().removesuffix("://")
    if not s.replace("+", "").replace("-", "").replace(".", "").isalnum() or not s[0].isalpha():
        raise InvalidArgumentError(
            f"{scheme}: not a valid URL scheme (letters, digits, '+', '-', '.'; starting "
            "with a letter)"
        )
    return s


def register_init_method(scheme: str, handler: Handler) -> None:
    """Add a URL scheme: ``handler(url, *, rank, world_size, group_name, timeout)``.

    The built-in schemes (env, tcp, file) cannot be replaced; registering a scheme
    again replaces the earlier handler.
    """
    s = _check_scheme(scheme)
    if not callable(handler):
        raise InvalidArgumentError(f"{s}://: handler must be callable, got {handler!r}")
    if s in _BUILTIN:
        raise InvalidArgumentError(f"{s}://: is a built-in init method and cannot be replaced")
    with _registry_lock:
        _registered[s] = handler


#: Where schemes contributed by installed plugins come from: set by the core's registry
#: (procgroup.plugins), which sits above this layer, so rendezvous never imports it.
_plugin_source: Callable[[], Mapping[str, Any]] | None = None


def set_plugin_source(source: Callable[[], Mapping[str, Any]] | None) -> None:
    """Let ``source()`` supply plugin schemes (scheme -> handler), asked on first need."""
    global _plugin_source
    _plugin_source = source


def _plugin_methods() -> dict[str, Handler]:
    """Schemes from installed plugins (empty when no registry was connected)."""
    if _plugin_source is None:
        return {}
    return {str(k).lower(): cast(Handler, v) for k, v in dict(_plugin_source()).items()}


def _handler_for(scheme: str) -> Handler:
    if scheme in _BUILTIN:
        return _BUILTIN[scheme]
    with _registry_lock:
        if scheme in _registered:
            return _registered[scheme]
    plugins = _plugin_methods()
    if scheme in plugins:
        return plugins[scheme]
    with _registry_lock:
        known = sorted(set(_BUILTIN) | set(_registered) | set(plugins))
    raise InvalidArgumentError(
        f"{scheme}://: unknown init method; choose one of: "
        + ", ".join(f"{k}://" for k in known)
    )


def rendezvous(
    init_method: str = "env://",
    *,
    rank: int = -1,
    world_size: int = -1,
    group_name: str = "",
    timeout: float = 300.0,
    token: str | bytes | None = None,
) -> RendezvousResult:
    """Bring ``world_size`` processes together through ``init_method``.

    Returns the job's Store (a key space private to ``group_name``), this process's
    rank, the world size, and rank 0's address where there is one. ``rank`` and
    ``world_size`` of -1 mean "not given" (taken from the URL, environment or assigned
    automatically, depending on the method). ``token``: the job's secret (default
    $PROCGROUP_JOB_TOKEN; file:// makes one in its file); the result's ``job_key``.
    """
    if not isinstance(init_method, str) or "://" not in init_method:
        raise InvalidArgumentError(
            f"{init_method!r}: init_method must be a URL such as env://, "
            "tcp://HOST:PORT, tcp://MULTICAST:PORT or file:///PATH"
        )
    url = urllib.parse.urlsplit(init_method)
    scheme = _check_scheme(url.scheme or init_method.split("://")[0])
    rank = _check_int(rank, "rank", scheme, 0)
    world_size = _check_int(world_size, "world_size", scheme, 1)
    if not isinstance(group_name, str):
        raise InvalidArgumentError(
            f"{scheme}://: group_name must be a str, got {type(group_name).__name__} (argument)"
        )
    seconds = _check_timeout(timeout, scheme)
    handler = _handler_for(scheme)
    logger.debug(
        "rendezvous %s rank=%d world_size=%d group=%r", init_method, rank, world_size,
        group_name,
    )
    if token is not None and not isinstance(token, (str, bytes)):
        raise InvalidArgumentError(f"{scheme}://: token must be a str or bytes, got {type(token).__name__}")
    if scheme in _BUILTIN:
        return handler(url, rank=rank, world_size=world_size, group_name=group_name,
                       timeout=seconds, token=token)
    result = handler(url, rank=rank, world_size=world_size, group_name=group_name, timeout=seconds)
    if isinstance(result, RendezvousResult) and result.job_key is None:
        import dataclasses

        key = _auth.resolve_token(token, result.master_addr, where=f"{scheme}://")
        result = dataclasses.replace(result, job_key=key)
    return result
