"""Checks for notebook 07 (real processes, real links): what a sync puts on a ring, by hand.

References: the simulated clock's `clock.exchange_cost` and `Link` (what the library charges,
and what the testbed measured within 1-7%); the classic wrong answers use the other
collective's factor, forget the hops, or mix bits and bytes. A check names the piece.
"""

from __future__ import annotations

from ..clock import Link, exchange_cost
from ._core import Result, exercise, fmt, judge, number


@exercise("all-gather bytes per host", todo="the bytes that leave one host in one ring "
                                             "all-gather of the M hosts' payloads")
def check_gather_bytes(predicted_bytes, *, payload_bytes: int = 434_688,
                       hosts: int = 4) -> Result:
    """`predicted_bytes`: what one host sends in one DiLoCo sync (a ring all-gather)."""
    s, m = payload_bytes, hosts
    factor, _ = exchange_cost(m, gather=True)
    ref = factor * s
    return judge(number(predicted_bytes), ref, rtol=1e-9,
                 success=f"{ref:,.0f} bytes: M − 1 = {m - 1} payloads", mistakes=[
        ("allreduce", 2 * (m - 1) / m * s, "that is what a ring all-reduce sends: the b-bit "
         "payloads are not summed on the way, every host receives all of them"),
        ("all_payloads", m * s, "one payload too many: nobody sends a host its own payload"),
        ("one_payload", s, "one payload is what a host contributes; on a ring it also forwards "
         "the others' payloads"),
        ("bits", 8 * ref, "that is in bits: the question asks for bytes"),
    ], other=f"got {fmt(predicted_bytes)} bytes: neither a ring all-gather nor a classic "
             "mistake; follow one payload around the ring")


@exercise("sync time on the clock", todo="the seconds the simulated clock charges one "
                                          "DiLoCo sync on this ring and link")
def check_sync_time(predicted_s, *, payload_bytes: int = 434_688, hosts: int = 4,
                    gbit_per_s: float = 0.1, latency_s: float = 0.005) -> Result:
    """`predicted_s`: how long the simulated clock charges one DiLoCo sync."""
    s, m, rate = payload_bytes, hosts, gbit_per_s * 1e9
    factor, hops = exchange_cost(m, gather=True)
    ref = Link(gbit_per_s=gbit_per_s).busy_s(factor * s) + hops * latency_s
    wire = factor * s * 8 / rate
    return judge(number(predicted_s), ref, rtol=1e-6,
                 success=f"{ref:.4f} s: {wire:.4f} s on the link and {hops} hops of "
                         f"{latency_s * 1e3:g} ms", mistakes=[
        ("no_hops", wire, "each of the ring's sequential hops also waits one link latency"),
        ("one_latency", wire + latency_s, "the ring's hops are sequential: each waits its own "
         "latency, not one in all"),
        ("allreduce", 2 * (m - 1) / m * s * 8 / rate + 2 * (m - 1) * latency_s, "that is a "
         "ring all-reduce: DiLoCo's sync all-gathers (exercise 1)"),
        ("bytes", wire / 8 + hops * latency_s, "a link's rate is in bits per second, not bytes"),
    ], other=f"got {fmt(predicted_s)} s: neither the clock's time nor a classic mistake; add "
             "the time on the link and the latencies, piece by piece")
