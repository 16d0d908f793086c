"""Hosts and links you can throttle: each process of a launch in its own network namespace.

    from diloco_lite.clock import Link
    from diloco_lite.distributed import launch
    from diloco_lite.distributed.testbed import Testbed

    with Testbed(hosts=4, link=Link(gbit_per_s=0.1, latency_s=0.002)) as bed:
        before = bed.counters()
        [result] = launch(config, processes=4, devices_per_process=1, testbed=bed)
        sent = bed.sent_since(before)         # bytes that really left each host

Layout (every name starts with `PREFIX`, so that leftovers of a crashed run are found and
removed): a namespace `dlt-sw` holds a bridge; host k is a namespace `dlt-h<k>` whose `eth0`
(10.77.0.<k+1>/24) is one end of a veth pair, the other end a port of the bridge. The link of
`clock.Link` made real, full duplex per host: a `tc` token bucket (tbf) of `gbit_per_s` on the
host's `eth0` (what it sends) and on its bridge port (what it receives), and `netem` delay of
`latency_s` on `eth0` (one way) where the kernel has netem (this machine's does not: then the
latency is not emulated, and the testbed says so). With `fair=True` each of those links is an
htb shared fairly among the host's peers instead of one FIFO bucket (`_fair`). Process k runs
under `ip netns exec dlt-h<k>`; `/etc/netns/dlt-h<k>/hosts` (which `ip netns exec` mounts
over /etc/hosts) maps this machine's host name to the host's address, because gloo binds its
TCP pairs to the address of the host name. Traffic goes only to addresses inside these namespaces.

Needs root and iproute2 (`ip`, `tc`); without them (or where namespaces cannot be made, e.g. an
unprivileged container) it falls back to this machine's loopback with no throttle, says so and
sets `emulated = False`, and `counters()` returns None. `__exit__` deletes everything it made on
every way out (an exception, a KeyboardInterrupt, a SIGTERM); `__enter__` first deletes the
leftovers of an earlier run that could not (killed with SIGKILL). One testbed at a time per
machine (the names are fixed): a second waits for the first's lock (`LOCK`, a flock the kernel
frees when its holder dies, so a crashed run's leftovers are recognised as such).

What the counters count: the bytes of every Ethernet frame that left the host's `eth0`:
gloo's payloads plus TCP/IP/Ethernet headers (66 bytes per segment of ≤ 1448 payload bytes:
+4.6%), the ACKs of what it received, and the coordination service's gRPC (start-up,
heartbeats, barriers). Traffic between devices of the same host stays on its loopback.

Which collective gloo runs (XLA's `GlooCommunicator`, jaxlib ≥ 0.4.3x): the all-reduce is gloo's
RING algorithm (a reduce-scatter then an all-gather around the ring: each rank sends 2(R−1)/R of
the buffer to its right neighbour), the all-gather gloo's ring `allgather` (each rank forwards
R−1 payloads of one rank, in two halves), and XLA's CPU `AllReduceThunk` calls it once per
operand: every tensor would be its own ring, 2(R−1) sequential hops, one or more TCP messages
each. So the library hands gloo one buffer per collective (DDP ravels its gradient, the learners
pack a fragment's payloads with `wire.to_bytes`): one ring per sync. The ring runs over the
ranks of the XLA replica group, in device order, so the devices of one host are neighbours: each
host's `eth0` carries what *one* rank sends to the next host. With one device per host (R = M
hosts) the per-host bytes on the wire are, per sync: DDP 2(M−1)/M × the gradient (booked: one
gradient per worker; in bfloat16, its all-to-all and all-gather move (M−1)/M each), the
DiLoCo family's all-gather (M−1)/M × M payloads = (M−1) payloads (booked: one payload per
worker); with D devices per host the booked bytes are D times larger, the bytes on the wire the
same (but for bfloat16 DDP's all-to-all, which sends each device's chunks to every remote
device: about D times more).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

PREFIX = "dlt-"
SUBNET = "10.77.0"
SWITCH = f"{PREFIX}sw"
ETC_NETNS = Path("/etc/netns")
LOCK = Path(os.environ.get("TMPDIR", "/tmp")) / "diloco_lite-testbed.lock"


class Testbed:
    """`hosts` network namespaces on one bridge, each behind `link` (a `clock.Link`; None: no
    throttle). A context manager; see the module docstring. `tcp`: the hosts' TCP congestion
    control (`net.ipv4.tcp_congestion_control` in each host's namespace: "reno" or "bbr"; None:
    the kernel's default). Through a token bucket at 1 Mbit/s, fp32 DDP's ring ran closer to
    the link's rate with Reno than with this machine's default, BBR (`actors.versus`' full
    runs: its windows 1.04× the clock's with Reno, 1.18× with BBR; docs/systems.md). `fair`:
    each link shares its rate among the host's peers (`_fair`: a class per peer, each sure of
    1/(hosts − 1) of the rate and free to borrow all of it while the others are idle) instead
    of queueing everything in one token bucket's FIFO, where an all-to-all's flows share the
    rate unevenly and a host's ACKs to one peer wait behind its data to another (up to the
    bucket's queue: 200 ms, at least 256 kB, 2 s at 1 Mbit/s); where the kernel has no `htb`,
    the FIFO, said."""

    def __init__(self, hosts: int, link=None, *, quiet: bool = False, tcp: str | None = None,
                 fair: bool = False):
        from ..config import check, check_int

        check_int("hosts", hosts, 1, 200)
        check(tcp in (None, "reno", "bbr"), "tcp", tcp, '"reno", "bbr" or None')
        check(isinstance(fair, bool), "fair", fair, "True or False")
        self.hosts, self.link, self.quiet, self.tcp, self.fair = hosts, link, quiet, tcp, fair
        self.emulated, self.latency_emulated, self.reason = False, False, ""

    # -- the context manager ------------------------------------------------------------------
    def __enter__(self) -> Testbed:
        self.reason = _unavailable()
        if not self.reason:
            self._lock = _take_lock()  # one testbed at a time: the names are fixed
            self._on_term = _exit_on_sigterm()
            cleanup()  # the lock was free: whatever carries the prefix is a crashed run's
            try:
                self._build()
                self.emulated = True
            except (OSError, subprocess.CalledProcessError) as e:
                self.reason = f"could not build the namespaces ({_why(e)})"
                cleanup()
            except BaseException:
                cleanup()
                self.__exit__()
                raise
        if not self.emulated:
            self._say(f"testbed: {self.reason}: the processes run on this machine's loopback, "
                      "with no throttle and no per-host byte counters")
        elif self.link is not None and self.link.latency_s > 0 and not self.latency_emulated:
            self._say(f"testbed: this kernel has no netem qdisc: the links' rate is emulated, "
                      f"their {1e3 * self.link.latency_s:g} ms latency is not")
        return self

    def __exit__(self, *exc) -> None:
        if self.emulated:
            cleanup()
            self.emulated = False
        if getattr(self, "_lock", None) is not None:
            self._lock.close()  # releases the flock
            self._lock = None
        if getattr(self, "_on_term", None) is not None:
            signal.signal(signal.SIGTERM, self._on_term)
            self._on_term = None

    # -- what the launcher and the measurements use --------------------------------------------
    def namespace(self, k: int) -> str:
        return f"{PREFIX}h{k}"

    def address(self, k: int) -> str:
        """Host k's IP address (loopback when not emulated)."""
        return f"{SUBNET}.{k + 1}" if self.emulated else "127.0.0.1"

    def command(self, k: int, cmd: list[str]) -> list[str]:
        """`cmd` run inside host k (unchanged when not emulated)."""
        return ["ip", "netns", "exec", self.namespace(k), *cmd] if self.emulated else list(cmd)

    def counters(self) -> list[dict] | None:
        """Per host: `tx_bytes`, `rx_bytes`, `tx_packets`, `rx_packets` of its `eth0` so far,
        and `retrans_segs`, the TCP segments it sent again (None when not emulated)."""
        return host_counters(self.hosts) if self.emulated else None

    def sent_since(self, before: list[dict] | None) -> list[dict] | None:
        """Per host, the counters' growth since `before` (a `counters()` result)."""
        now = self.counters()
        if now is None or before is None:
            return None
        return [{key: n[key] - b[key] for key in n} for n, b in zip(now, before, strict=True)]

    # -- building ------------------------------------------------------------------------------
    def _build(self) -> None:
        _run("ip", "netns", "add", SWITCH)
        _run("ip", "-n", SWITCH, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", SWITCH, "link", "set", "br0", "up")
        hostname = socket.gethostname()
        for k in range(self.hosts):
            ns, veth, port = self.namespace(k), f"{PREFIX}e{k}", f"{PREFIX}p{k}"
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", port)
            _run("ip", "link", "set", veth, "netns", ns)
            _run("ip", "link", "set", port, "netns", SWITCH)
            _run("ip", "-n", ns, "link", "set", veth, "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", f"{self.address_of(k)}/24", "dev", "eth0")
            for dev in ("lo", "eth0"):
                _run("ip", "-n", ns, "link", "set", dev, "up")
            if self.tcp is not None:
                _run("ip", "netns", "exec", ns, "sysctl", "-qw",
                     f"net.ipv4.tcp_congestion_control={self.tcp}")
            _run("ip", "-n", SWITCH, "link", "set", port, "master", "br0")
            _run("ip", "-n", SWITCH, "link", "set", port, "up")
            (ETC_NETNS / ns).mkdir(parents=True, exist_ok=True)
            (ETC_NETNS / ns / "hosts").write_text(
                f"127.0.0.1 localhost\n{self.address_of(k)} {hostname}\n")
            if self.link is not None:
                self._shape(ns, "eth0", self.link.latency_s, k, "dst")  # what host k sends
                self._shape(SWITCH, port, 0.0, k, "src")  # what it receives

    def address_of(self, k: int) -> str:
        return f"{SUBNET}.{k + 1}"

    def _shape(self, ns: str, dev: str, latency_s: float, k: int, side: str) -> None:
        """Shape `dev` (in namespace `ns`): host k's egress (`side` "dst": its packets by
        destination) or ingress ("src": by source)."""
        if math.isinf(self.link.gbit_per_s):
            return
        parent = ["root", "handle", "1:"]
        if latency_s > 0:
            try:
                _run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:",
                     "netem", "delay", f"{latency_s * 1e6:.0f}us", "limit", "100000")
                self.latency_emulated = True
                parent = ["parent", "1:1", "handle", "10:"]
            except subprocess.CalledProcessError:
                self.latency_emulated = False
        if self.fair and self.hosts > 1:
            try:
                for cmd in _fair(dev, parent, self.link.gbit_per_s, k, self.hosts, side):
                    _run("tc", "-n", ns, *cmd)
                return
            except subprocess.CalledProcessError:  # no htb: its first link's part removed
                where = parent[:1] if parent[0] == "root" else parent[:2]
                subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, *where],
                               capture_output=True, check=False)
                self.fair = False
                self._say("testbed: this kernel has no htb qdisc: each link is one FIFO token "
                          "bucket, not shared fairly among the host's peers")
        _run("tc", "-n", ns, "qdisc", "add", "dev", dev, *parent, *_tbf(self.link.gbit_per_s))

    def _say(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)


def _bucket(gbit_per_s: float) -> tuple[float, int, int]:
    """A link of `gbit_per_s`'s rate (bit/s), burst and queue limit (bytes)."""
    rate = gbit_per_s * 1e9
    burst = max(int(rate / 8 / 250), 16_000)  # one 4 ms tick's worth (HZ=250), ≥ 16 kB
    limit = max(int(rate / 8 * 0.2), 256_000)  # 200 ms of queue: TCP, not drops, paces
    return rate, burst, limit


def _tbf(gbit_per_s: float) -> list[str]:
    """The token bucket of a link of `gbit_per_s`, as `tc` arguments."""
    rate, burst, limit = _bucket(gbit_per_s)
    return ["tbf", "rate", f"{int(rate)}bit", "burst", str(burst), "limit", str(limit)]


def _fair(dev: str, parent: list[str], gbit_per_s: float, k: int, hosts: int, side: str,
          verb: str = "add") -> list[list[str]]:
    """The `tc` commands (after `tc -n <ns>`) of a link of `gbit_per_s` on `dev` shared fairly
    among host k's peers (`Testbed`'s `fair`): an htb under `parent` (`["root", "handle",
    "1:"]`, or below a netem), one class of the whole rate, below it a class per peer (the
    packets to it, `side` "dst", or from it, "src": a u32 filter on its address) sure of an
    equal share and borrowing up to the whole rate, one packet (`quantum`) per turn, each
    with its own FIFO of the token bucket's limit (`_tbf`); anything else (ARP) in a last
    class. `verb` "change": the same shape at a new rate (`set_rate`)."""
    top = parent[-1].rstrip(":")
    rate, burst, limit = _bucket(gbit_per_s)  # each class's burst and FIFO as `_tbf`'s
    peers = [j for j in range(hosts) if j != k]

    def shaped(classid, share, of=f"{top}:1"):
        return ["class", verb, "dev", dev, "parent", of, "classid", classid, "htb",
                "rate", f"{max(int(share), 8)}bit", "ceil", f"{int(rate)}bit", "burst",
                str(burst), "cburst", str(burst), "quantum", "1514"]

    out = [] if verb == "change" else [["qdisc", "add", "dev", dev, *parent, "htb", "default",
                                        "99"]]
    out.append(shaped(f"{top}:1", rate, of=f"{top}:"))
    for i, j in enumerate([*peers, None]):
        classid = f"{top}:{10 + i}" if j is not None else f"{top}:99"
        out.append(shaped(classid, rate / len(peers) if j is not None else rate / 100))
        leaf = f"{100 + i}:"
        out.append(["qdisc", verb, "dev", dev, "parent", classid, "handle", leaf, "bfifo",
                    "limit", str(limit)])
        if j is not None and verb == "add":
            out.append(["filter", "add", "dev", dev, "parent", f"{top}:", "protocol", "ip",
                        "prio", "1", "u32", "match", "ip", side, f"{SUBNET}.{j + 1}/32",
                        "flowid", classid])
    return out


def set_rate(hosts: int, gbit_per_s: float) -> None:
    """Every link of a testbed of `hosts` hosts that exists (root: from any process, e.g. one
    running inside a host) now carries `gbit_per_s` each way: its token buckets replaced (a
    netem delay stays). Lets one set of processes measure several link speeds in turn."""
    from ..validate import check_positive

    check_positive("gbit_per_s", gbit_per_s)  # (a testbed's infinite link has no bucket)
    for k in range(hosts):
        for ns, dev, side in ((f"{PREFIX}h{k}", "eth0", "dst"), (SWITCH, f"{PREFIX}p{k}", "src")):
            shown = _run("tc", "-n", ns, "qdisc", "show", "dev", dev)
            where = (["parent", "1:1", "handle", "10:"] if "netem" in shown
                     else ["root", "handle", "1:"])
            if "qdisc htb" in shown:  # a fair link (`Testbed`'s `fair`)
                for cmd in _fair(dev, where, gbit_per_s, k, hosts, side, verb="change"):
                    _run("tc", "-n", ns, *cmd)
            else:
                _run("tc", "-n", ns, "qdisc", "change", "dev", dev, *where, *_tbf(gbit_per_s))


def host_counters(hosts: int) -> list[dict]:
    """`Testbed.counters()` of a testbed of `hosts` hosts that exists (root: from any process,
    e.g. one running inside a host)."""
    out = []
    for k in range(hosts):
        ns = f"{PREFIX}h{k}"
        [link] = json.loads(_run("ip", "-n", ns, "-s", "-j", "link", "show", "eth0"))
        stats = link["stats64"]
        snmp = _run("ip", "netns", "exec", ns, "cat", "/proc/net/snmp")
        tcp = [line.split() for line in snmp.splitlines() if line.startswith("Tcp:")]
        out.append({"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"],
                    "tx_packets": stats["tx"]["packets"], "rx_packets": stats["rx"]["packets"],
                    "retrans_segs": int(dict(zip(*tcp, strict=True))["RetransSegs"])})
    return out


def cleanup() -> list[str]:
    """Delete every namespace (and its links) and /etc/netns entry whose name starts with
    `PREFIX`; returns the namespaces deleted."""
    gone = []
    if shutil.which("ip"):
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        for line in listed.stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith(PREFIX):
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
                gone.append(name)
    with contextlib.suppress(OSError):
        for path in ETC_NETNS.glob(f"{PREFIX}*"):
            shutil.rmtree(path, ignore_errors=True)
    return gone


def _exit_on_sigterm():
    """In the main thread: make SIGTERM raise SystemExit (so that `__exit__` cleans up; by
    default it ends Python without unwinding); returns the handler to restore."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def leave(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, leave)


def _take_lock(wait_s: float = 600.0):
    """An exclusive flock on `LOCK`, waited for (another testbed is in use) up to `wait_s`. The
    kernel releases it when its holder dies, however it dies."""
    import fcntl
    import time

    f = open(LOCK, "a+")  # noqa: SIM115 - held until __exit__
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.monotonic() > deadline:
                f.close()
                raise RuntimeError(f"another testbed has held {LOCK} for {wait_s:g} s") from None
            time.sleep(0.5)


def _unavailable() -> str:
    """Why namespaces cannot be made here ('' when they can)."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (install iproute2)"
    if os.geteuid() != 0:
        return "not root (network namespaces need root)"
    return ""


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def _why(e: Exception) -> str:
    if isinstance(e, subprocess.CalledProcessError):
        return f"{' '.join(e.cmd)}: {(e.stderr or '').strip() or e.returncode}"
    return str(e)
