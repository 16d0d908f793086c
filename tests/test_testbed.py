"""The testbed (diloco_lite.distributed.testbed): hosts as network namespaces behind throttled
links, cleaned up on every way out, and the bytes a real run puts on the wire against the
bytes it books. Needs root and iproute2 (CI has both); elsewhere only the fallback is tested."""

import subprocess
import sys
import time

import pytest

import diloco_lite as dl
from diloco_lite.clock import Link, ring_factor
from diloco_lite.distributed import launch
from diloco_lite.distributed import testbed as tb

needs_namespaces = pytest.mark.skipif(bool(tb._unavailable()), reason=tb._unavailable() or "-")

SERVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5555)); s.listen(); print("listening", flush=True)
c, _ = s.accept(); n, first = 0, None
while b := c.recv(1 << 16):
    first = time.monotonic() if first is None else first
    n += len(b)
print(n, time.monotonic() - first)
"""
CLIENT = """
import socket, sys
s = socket.create_connection((sys.argv[1], 5555)); s.sendall(b"x" * int(sys.argv[2])); s.close()
"""


def namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(tb.PREFIX)]


def send(bed, nbytes: int, back: bool = False) -> float:
    """Host 0 sends `nbytes` to host 1 over TCP (`back`: host 1 to host 0); returns the seconds
    the receiver took to receive them, from its first byte to the last (neither interpreter's
    start-up is in it)."""
    a, b = (1, 0) if back else (0, 1)
    server = subprocess.Popen(bed.command(b, [sys.executable, "-c", SERVER, bed.address(b)]),
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "listening"
    subprocess.run(bed.command(a, [sys.executable, "-c", CLIENT, bed.address(b), str(nbytes)]),
                   check=True, timeout=60)
    n, seconds = server.communicate(timeout=60)[0].split()
    assert int(n) == nbytes
    return float(seconds)


@needs_namespaces
def test_a_link_is_throttled_counted_and_cleaned_up():
    """1 MB at 10 Mbit/s: 0.8 s of payload, plus TCP/IP headers (+4.6% on the wire, which the
    throttle counts), less the token bucket's first burst: received in 0.76–0.96 s (a throttle
    25% too fast would take 0.67 s). Host 0's counter sees it (+ headers, ≤ 10%), host 1's
    sees only ACKs; the namespaces are gone after the block, also when it raises."""
    with pytest.raises(KeyError), tb.Testbed(2, Link(gbit_per_s=0.01)) as bed:
        assert bed.emulated and sorted(namespaces()) == ["dlt-h0", "dlt-h1", "dlt-sw"]
        before = bed.counters()
        seconds = send(bed, 1_000_000)
        sent = bed.sent_since(before)
        raise KeyError("on the way out")
    assert namespaces() == [] and not list(tb.ETC_NETNS.glob(f"{tb.PREFIX}*"))
    assert 0.95 * 8e6 / 1e7 <= seconds <= 1.2 * 8e6 / 1e7, seconds
    assert 1_000_000 <= sent[0]["tx_bytes"] <= 1_100_000
    assert sent[1]["tx_bytes"] < 100_000  # ACKs


@needs_namespaces
def test_set_rate_changes_every_link_of_a_testbed_that_exists():
    """Built at 100 Mbit/s, set to 10 Mbit/s from outside the `Testbed` object (as a process
    inside a host does): 1 MB takes 0.76–0.96 s as on a testbed built at 10 Mbit/s (0.08 s at
    100); set back to 100 Mbit/s it takes under 0.2 s. Both ways are throttled: host 1 sending
    to host 0 is as slow. A rate of 0 is refused, naming the field."""
    with tb.Testbed(2, Link(gbit_per_s=0.1)) as bed:
        tb.set_rate(2, 0.01)
        assert 0.95 * 0.8 <= send(bed, 1_000_000) <= 1.2 * 0.8
        assert 0.95 * 0.8 <= send(bed, 1_000_000, back=True) <= 1.2 * 0.8
        tb.set_rate(2, 0.1)
        assert send(bed, 1_000_000) < 0.2
        with pytest.raises(ValueError, match="gbit_per_s=0 is invalid"):
            tb.set_rate(2, 0)


ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5556)); s.listen(); print("listening", flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while b := c.recv(1):
    c.sendall(b)
"""
ROUND_TRIPS = """
import socket, statistics, sys, time
s = socket.create_connection((sys.argv[1], 5556))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
times = []
for _ in range(8):
    t = time.monotonic(); s.sendall(b"x"); s.recv(1); times.append(time.monotonic() - t)
    time.sleep(0.05)
print(statistics.median(times))
"""


def round_trip_behind_bulk(bed) -> float:
    """The median round trip of one byte from host 0 to host 2 while host 0 sends 3 MB to
    host 1 (the token bucket's queue full of them)."""
    echo = subprocess.Popen(bed.command(2, [sys.executable, "-c", ECHO, bed.address(2)]),
                            stdout=subprocess.PIPE, text=True)
    sink = subprocess.Popen(bed.command(1, [sys.executable, "-c", SERVER, bed.address(1)]),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert echo.stdout.readline().strip() == sink.stdout.readline().strip() == "listening"
        bulk = subprocess.Popen(bed.command(0, [sys.executable, "-c", CLIENT, bed.address(1),
                                                str(3_000_000)]))
        time.sleep(1.0)  # the bulk flow has filled the queue
        rtt = subprocess.run(bed.command(0, [sys.executable, "-c", ROUND_TRIPS,
                                             bed.address(2)]),
                             capture_output=True, text=True, check=True, timeout=60).stdout
        bulk.wait(timeout=60)
        return float(rtt)
    finally:
        for p in (echo, sink):
            p.kill()
            p.wait()


@needs_namespaces
def test_a_fair_link_gives_one_peer_the_whole_rate_and_queues_no_peer_behind_another():
    """`fair`: alone, a flow gets the whole 10 Mbit/s (1 MB in 0.76–0.96 s, as a FIFO link);
    while host 0's queue holds data to host 1, a one-byte round trip to host 2 takes under 10 ms
    (its own class; measured under 1 ms), where the FIFO token bucket makes it wait behind the
    data (over 20 ms; measured 40–113 ms: the test tells the two apart). TCP Reno fills the
    queue, as in `actors.versus` (BBR keeps it short). `set_rate` changes a fair link's rate."""
    with tb.Testbed(3, Link(gbit_per_s=0.01), fair=True, tcp="reno") as bed:
        assert bed.fair
        assert "qdisc htb" in subprocess.run(["tc", "-n", "dlt-h0", "qdisc", "show"],
                                             capture_output=True, text=True).stdout
        assert 0.95 * 0.8 <= send(bed, 1_000_000) <= 1.2 * 0.8
        assert 0.95 * 0.8 <= send(bed, 1_000_000, back=True) <= 1.2 * 0.8
        assert round_trip_behind_bulk(bed) < 0.01
        tb.set_rate(3, 0.02)
        assert 0.95 * 0.4 <= send(bed, 1_000_000) <= 1.2 * 0.4
    with tb.Testbed(3, Link(gbit_per_s=0.01), tcp="reno") as bed:
        assert round_trip_behind_bulk(bed) > 0.02
    with pytest.raises(ValueError, match="fair=1 is invalid"):
        tb.Testbed(2, fair=1)


def congestion_control(bed, k: int) -> str:
    return subprocess.run(bed.command(k, ["sysctl", "-n", "net.ipv4.tcp_congestion_control"]),
                          capture_output=True, text=True, check=True).stdout.strip()


@needs_namespaces
def test_the_hosts_tcp_congestion_control_is_the_one_asked_for():
    """`tcp="reno"`: every host's namespace runs Reno, whatever the machine's default (BBR
    here); without it, each host keeps the default. An unknown name is refused, naming the
    field, before anything is built."""
    default = subprocess.run(["sysctl", "-n", "net.ipv4.tcp_congestion_control"],
                             capture_output=True, text=True, check=True).stdout.strip()
    with tb.Testbed(2, Link(gbit_per_s=0.1), tcp="reno") as bed:
        assert [congestion_control(bed, k) for k in range(2)] == ["reno", "reno"]
    with tb.Testbed(2, Link(gbit_per_s=0.1)) as bed:
        assert [congestion_control(bed, k) for k in range(2)] == [default, default]
    with pytest.raises(ValueError, match="tcp='vegas' is invalid"):
        tb.Testbed(2, tcp="vegas")
    assert namespaces() == []


@needs_namespaces
def test_leftovers_of_a_crashed_run_are_removed():
    subprocess.run(["ip", "netns", "add", "dlt-h7"], check=True)
    with tb.Testbed(1) as bed:
        assert bed.emulated and sorted(namespaces()) == ["dlt-h0", "dlt-sw"]
    assert namespaces() == []


def test_without_namespaces_it_falls_back_to_loopback_and_says_so(monkeypatch, capsys):
    monkeypatch.setattr(tb.shutil, "which", lambda name: None)
    with tb.Testbed(2, Link(gbit_per_s=0.01)) as bed:
        assert not bed.emulated and bed.counters() is None
        assert bed.address(1) == "127.0.0.1" and bed.command(1, ["x"]) == ["x"]
    assert "ip and tc not found" in capsys.readouterr().err


@pytest.mark.slow
@needs_namespaces
@pytest.mark.parametrize("bits", [32, 16])
def test_ddp_bytes_on_the_wire_are_the_booked_bytes_times_the_ring_factor(bits):
    """2 hosts × 1 device, 8 DDP steps of the default model on 200 Mbit/s links: each host
    sends 2(M−1)/M of one gradient per step (gloo's ring all-reduce; in bfloat16, its all-to-all
    and all-gather), plus TCP/IP headers, ACKs and the coordination service's traffic: within
    +15% of the booked bytes × the factor, and never below."""
    config = dl.RunConfig(algorithm=dl.DDP(bits=bits), workers=2, steps=8, batch_size=4,
                          eval_every=8, eval_batches=1)
    with tb.Testbed(2, Link(gbit_per_s=0.2)) as bed:
        before = bed.counters()
        [result] = launch(config, processes=2, devices_per_process=1, testbed=bed,
                          timeout_s=300, echo=False)
        sent = bed.sent_since(before)
    expected = result.final.comm_bytes / config.workers * ring_factor(config.workers)
    for host in sent:
        assert 1.0 <= host["tx_bytes"] / expected <= 1.15, (host, expected)


@needs_namespaces
def test_a_sigterm_cleans_up_too():
    """SIGTERM ends Python without unwinding by default; inside a testbed it unwinds."""
    code = ("import time\nfrom diloco_lite.distributed.testbed import Testbed\n"
            "with Testbed(2):\n    print('up', flush=True)\n    time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "up" and len(namespaces()) == 3
    child.terminate()
    assert child.wait(timeout=30) == 143 and namespaces() == []
