"""The switch of a simulated cluster: TAP ports, a propagation delay, paced egress ports.

Run as ``python -m procgroup.testing.simcluster._forwarder``, one process per cluster,
by :class:`procgroup.testing.simcluster.SimCluster` (never by hand). It creates one TAP
device named ``eth0`` in each host's network namespace (``setns`` there, open
``/dev/net/tun``, come back), prints ``READY`` and forwards Ethernet frames between them
until its stdin closes or it gets SIGTERM. The TAPs are not persistent: they vanish with
this process, whatever kills it.

Why a user-space switch: this kernel has no ``sch_netem``, so nothing in the kernel can
hold a packet for a delay. Each frame read from host i's TAP is due at the switch after
``delay`` seconds, then waits for the egress port of its destination (a FIFO serialized
at ``rate``: a busy port queues, a full queue drops, as a switch does) and is written
into that host's TAP when its last bit has left. The host's own egress (its uplink) is
limited by ``tc tbf`` on its TAP, set up by the caller.

Speed: the TAPs carry virtio-net headers with TSO/checksum offload (``IFF_VNET_HDR``,
``TUNSETOFFLOAD``), so TCP hands over segments of up to 64 KiB while the MTU stays
1500; one read and one write move ~45 wire frames. The port is paced for the wire
frames the segment stands for (headers and Ethernet framing included), so TCP's goodput
is bounded as on a real 1500-byte link.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import errno
import fcntl
import os
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
TUNSETOFFLOAD = 0x400454D0
TUNSETVNETHDRSZ = 0x400454D8
IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6, TUN_F_TSO_ECN = 0x01, 0x02, 0x04, 0x08
CLONE_NEWNET = 0x40000000
PR_SET_TIMERSLACK = 29
#: struct virtio_net_hdr (no num_buffers): flags, gso_type, hdr_len, gso_size, csum_start, csum_offset
VNET_HDR = struct.Struct("=BBHHHH")
VNET_GSO_NONE = 0
#: the largest frame a TAP with TSO hands over (64 KiB segment + headers) and then some
READ_SIZE = 70_000
#: frames read from one port before looking at the others (fairness, bounded latency)
READ_BATCH = 32
#: a frame due this soon is written now: waking up takes about this long, so the mean
#: delivery time lands nearer the due time than sleeping to the last microsecond would
EARLY_S = 10e-6
#: errors of a TAP write that mean the frame was dropped, not that the switch broke
REFUSED = (errno.EAGAIN, errno.EIO, errno.EINVAL, errno.ENOBUFS)


def _setns(path: str) -> None:
    """Move this (single-threaded) process into the network namespace at ``path``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def open_tap(name: str) -> int:
    """A non-persistent TAP ``name`` in the current namespace, with virtio-net headers and TSO."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    try:
        ifr = struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI | IFF_VNET_HDR)
        fcntl.ioctl(fd, TUNSETIFF, ifr)
        fcntl.ioctl(fd, TUNSETVNETHDRSZ, struct.pack("i", VNET_HDR.size))
        fcntl.ioctl(
            fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN
        )
        os.set_blocking(fd, False)
    except BaseException:
        os.close(fd)
        raise
    return fd


def wire_bits(frame: bytes) -> int:
    """Bits of the 1500-MTU frames one TAP frame stands for (a TSO segment: its frames).

    Counted as ``tc`` counts them (Ethernet header in; preamble, FCS and gap out), so the
    downlink agrees with the uplink's tbf and TCP's goodput is at most 1448/1514 = 95.6 %
    of the rate (timestamps on).
    """
    _flags, gso_type, hdr_len, gso_size, _cs, _co = VNET_HDR.unpack_from(frame)
    length = len(frame) - VNET_HDR.size
    if gso_type == VNET_GSO_NONE or gso_size == 0 or length <= hdr_len:
        return 8 * max(length, 60)
    segments = -(-(length - hdr_len) // gso_size)
    return int(8 * (length + (segments - 1) * hdr_len))


class Switch:
    """Ports by host index; frames go to the port that owns the destination MAC (learnt)."""

    def __init__(
        self, fds: list[int], rate_bps: float, delay_s: float, queue_bytes: int
    ) -> None:
        self.fds = fds
        self.rate = rate_bps
        self.delay = delay_s
        # a port's queue, in seconds of its rate: a frame that would wait longer is dropped
        self.queue_s = 8 * queue_bytes / rate_bps
        self.busy_until = [0.0] * len(fds)
        self.queues: list[collections.deque[tuple[float, bytes]]] = [
            collections.deque() for _ in fds
        ]
        self.macs: dict[bytes, int] = {}
        self.forwarded = self.dropped = self.refused = 0
        self.late = 0.0  # summed over delivered frames: how much after its due time each was written

    def _enqueue(self, port: int, frame: bytes, bits: int, now: float) -> None:
        start = max(now + self.delay, self.busy_until[port])
        if start - now - self.delay > self.queue_s:
            self.dropped += 1
            return
        done = start + bits / self.rate
        self.busy_until[port] = done
        self.queues[port].append((done, frame))

    def take(self, port: int, now: float) -> None:
        """Read what host ``port`` sent (up to READ_BATCH frames) and queue it for delivery."""
        fd, hdr = self.fds[port], VNET_HDR.size
        for _ in range(READ_BATCH):
            try:
                frame = os.read(fd, READ_SIZE)
            except BlockingIOError:
                return
            if len(frame) < hdr + 14:
                continue
            self.macs[frame[hdr + 6 : hdr + 12]] = port
            bits = wire_bits(frame)
            dst = self.macs.get(frame[hdr : hdr + 6]) if not frame[hdr] & 1 else None
            if dst is None:  # broadcast, multicast or not yet learnt: flood
                for other in range(len(self.fds)):
                    if other != port:
                        self._enqueue(other, frame, bits, now)
            elif dst != port:
                self._enqueue(dst, frame, bits, now)

    def deliver(self, now: float) -> float | None:
        """Write every frame whose time has come; the time of the next one (None: none)."""
        nxt = None
        for port, q in enumerate(self.queues):
            fd = self.fds[port]
            while q and q[0][0] <= now:
                due, frame = q.popleft()
                self.late += now - EARLY_S - due
                try:
                    os.write(fd, frame)
                    self.forwarded += 1
                except OSError as exc:
                    # the host's stack refused it: a lost frame, as on a wire
                    if exc.errno not in REFUSED:
                        raise
                    self.refused += 1
            if q and (nxt is None or q[0][0] < nxt):
                nxt = q[0][0]
        return nxt

    def run(self, control: int) -> None:
        """Forward until ``control`` (stdin) reaches end of file."""
        clock = time.monotonic
        ready = list(self.fds) + [control]
        port_of = {fd: i for i, fd in enumerate(self.fds)}
        while True:
            nxt = self.deliver(clock() + EARLY_S)
            timeout = None if nxt is None else max(0.0, nxt - clock())
            readable, _, _ = select.select(ready, [], [], timeout)
            now = clock()
            for fd in readable:
                if fd == control:
                    if not os.read(control, 4096):
                        return
                else:
                    self.take(port_of[fd], now)


def _realtime() -> None:
    """A switch is hardware: the ranks it carries must not delay it. SCHED_FIFO where
    allowed (the kernel's RT throttling still leaves 5 % to everything else), else nice -10."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        return
    except (OSError, AttributeError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    except OSError:
        pass


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--netns",
        action="append",
        required=True,
        help="a host's namespace path (once per host)",
    )
    p.add_argument("--ifname", default="eth0")
    p.add_argument("--rate-bps", type=float, required=True)
    p.add_argument("--delay-s", type=float, required=True)
    p.add_argument("--queue-bytes", type=int, required=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # the parent tears down on Ctrl-C; the end of stdin ends us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # wake-ups within microseconds, not the default 50 us of slack
        ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    _realtime()
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    fds = []
    try:
        for path in args.netns:
            _setns(path)
            fds.append(open_tap(args.ifname))
        _setns(f"/proc/self/fd/{home}")
    finally:
        os.close(home)
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    switch = Switch(fds, args.rate_bps, args.delay_s, args.queue_bytes)
    try:
        switch.run(sys.stdin.fileno())
    finally:
        cpu = os.times()
        sys.stderr.write(
            f"forwarder: {cpu.user + cpu.system:.2f} s of CPU, {switch.forwarded} frames forwarded, {switch.dropped} dropped "
            f"(port queue full), {switch.refused} refused by a host, "
            f"{1e6 * switch.late / max(switch.forwarded, 1):.1f} us late on average\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
