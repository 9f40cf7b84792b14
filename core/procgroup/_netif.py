"""Which local address a socket-based backend binds and publishes to its peers.

Default: the address of the interface that routes to the master (rank 0), so a job
across hosts publishes an address the others can reach. ``PROCGROUP_SOCKET_IFNAME``
overrides it: ``eth0`` or ``eth0,ib0`` names interfaces (first that exists wins),
``^lo,docker0`` excludes interfaces and takes the first other one with an IPv4 address.
Shared by the tcp and gloo backends.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import socket
import struct

from .errors import InvalidArgumentError

log = logging.getLogger(__name__)

#: Which interface socket-based backends bind: ``eth0``, ``eth0,ib0`` or ``^lo,docker``.
ENV_SOCKET_IFNAME = "PROCGROUP_SOCKET_IFNAME"

_SIOCGIFADDR = 0x8915


def interface_addresses() -> dict[str, str]:
    """IPv4 address of every interface that has one, by interface name (Linux)."""
    result: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address on this interface
            result[name] = socket.inet_ntoa(packed[20:24])
    return result


def address_routing_to(host: str) -> str:
    """The local address the kernel would use to reach ``host`` (no packet is sent)."""
    try:
        target = socket.gethostbyname(host)
    except OSError:
        return "127.0.0.1"
    if ipaddress.ip_address(target).is_loopback:
        if host not in ("localhost",) and not _is_ip_literal(host):
            log.warning(
                "the master address %r resolves to loopback (%s) here, so this rank publishes "
                "127.0.0.1; ranks on other hosts cannot reach it. Set %s to the interface "
                "they reach this host by, or give MASTER_ADDR as an IP address.",
                host, target, ENV_SOCKET_IFNAME)
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((target, 9))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def choose_address(master_addr: str | None, ifname: str | None = None) -> str:
    """The address to bind and publish: by ``ifname`` (or $PROCGROUP_SOCKET_IFNAME), else by route."""
    spec = ifname if ifname is not None else os.environ.get(ENV_SOCKET_IFNAME, "")
    spec = spec.strip()
    if spec:
        return _by_spec(spec)
    if master_addr:
        return address_routing_to(master_addr)
    return hostname_address()


def hostname_address() -> str:
    """With no master to route to (file://, mpiexec): what this host's name resolves to.

    That is the address a cluster's other nodes know this one by (gloo does the same);
    loopback when the name does not resolve. PROCGROUP_SOCKET_IFNAME overrides it.
    """
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _by_spec(spec: str) -> str:
    addrs = interface_addresses()
    if spec.startswith("^"):
        excluded = {n.strip() for n in spec[1:].split(",") if n.strip()}
        candidates = [n for n in addrs if n not in excluded and not _excluded_prefix(n, excluded)]
        non_loop = [n for n in candidates if not addrs[n].startswith("127.")]
        picks = non_loop or candidates
        if not picks:
            raise InvalidArgumentError(
                f"environment variable {ENV_SOCKET_IFNAME}={spec!r} excludes every interface "
                f"with an IPv4 address (have: {sorted(addrs)})"
            )
        return addrs[picks[0]]
    for name in (n.strip() for n in spec.split(",")):
        if name in addrs:
            return addrs[name]
    raise InvalidArgumentError(
        f"environment variable {ENV_SOCKET_IFNAME}={spec!r} names no interface with an IPv4 "
        f"address here (have: {', '.join(f'{n}={a}' for n, a in sorted(addrs.items()))})"
    )


def _excluded_prefix(name: str, excluded: set[str]) -> bool:
    """NCCL-style: ``^docker`` also excludes docker0, docker1, ..."""
    return any(name.startswith(e) for e in excluded)


__all__ = ["ENV_SOCKET_IFNAME", "address_routing_to", "choose_address", "interface_addresses"]
