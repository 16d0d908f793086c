"""Command line: `python -m diloco_lite reproduce | bench | launch`."""

from __future__ import annotations

import argparse
import sys

# `reproduce` trains on 2 emulated devices, 4 workers vmapped on each: on the 2 cores of this
# machine (and of CI or a Colab CPU) that is 14–39% faster than one device per worker (8 device
# threads on 2 cores; measured per 2,400-step protocol run, compilation included: DiLoCo 56 → 45
# s, Streaming 64 → 51 s, Decoupled 65 → 56 s, DDP 73 → 45 s). It is the emulated count that
# matters: a 2-device mesh among 8 emulated devices runs the same program 55% slower. Same
# training, other layout: the numbers agree with the notebooks' (8 devices) to float-rounding
# drift (docs/reproduction.md, "Two commands"), and the run cache serves both.
REPRODUCE_DEVICES = 2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diloco_lite", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("reproduce", help="every experiment behind figures/ and the results "
                         "table (cached: an interrupted run resumes)")
    rep.add_argument("--quick", action="store_true",
                     help="shrink steps (as DILOCO_LITE_QUICK=1); figures go to figures/quick/")
    rep.add_argument("--only", default="training,bandwidth,goodput,links,actors,versus",
                     help="comma-separated subset of: training, bandwidth, goodput, links (real "
                          "processes on throttled links: needs root and iproute2, else times "
                          "on loopback), actors (Decoupled DiLoCo on Ray actors against the "
                          "simulated clock: needs Ray, else skipped), versus (every method, DDP "
                          "to Decoupled DiLoCo, over the testbed's links at four speeds: "
                          "needs Ray, root and iproute2, else skipped; over an hour)")
    rep.add_argument("--groups", default=None,
                     help="comma-separated training groups to run (default: all but "
                          "'scaling', which has its own target: make reproduce-scaling, about "
                          "an hour; it is read from the cache when every run is there); the "
                          "results table keeps the rows of the others")
    rep.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    bench = sub.add_parser("bench", help="speed against a minimal hand-written JAX loop")
    bench.add_argument("--stress", action="store_true",
                       help="instead: several trainings at once, 3 rounds (a busy machine)")
    run = sub.add_parser("launch", help="train CONFIGs on several local processes joined by "
                         "jax.distributed (diloco_lite.distributed.launch)")
    run.add_argument("configs", nargs="+", metavar="CONFIG",
                     help="'module:function' returning RunConfig(s), or an expression such as "
                          "'RunConfig(algorithm=DiLoCo(inner_steps=50), steps=600)'")
    run.add_argument("--processes", type=int, default=2)
    run.add_argument("--devices-per-process", type=int, default=4)
    run.add_argument("--timeout-s", type=float, default=None)
    run.add_argument("--testbed", action="store_true",
                     help="each process in its own network namespace (needs root, iproute2)")
    run.add_argument("--gbit-per-s", type=float, default=None,
                     help="throttle each host's link to this rate (implies --testbed)")
    run.add_argument("--latency-ms", type=float, default=0.0,
                     help="one-way latency of each link (needs the kernel's netem)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    args = parser.parse_args(argv)
    if args.command == "launch":  # the launcher itself starts no JAX backend
        from .distributed.launch import cli

        return cli(args)

    import diloco_lite as dl

    # `$DILOCO_LITE_DEVICES` overrides either count (`emulate_devices`).
    dl.emulate_devices(8 if args.command == "bench" else REPRODUCE_DEVICES)
    if args.command == "bench":
        from .bench import bench, stress

        if args.stress:
            counts = stress()
            return 0 if counts["passed"] == sum(counts.values()) else 1
        bench()
        return 0
    from .reproduce import reproduce

    quick = args.quick or dl.quick_mode()
    split = lambda text: tuple(s.strip() for s in text.split(",") if s.strip())  # noqa: E731
    table = reproduce(quick=quick, only=split(args.only), progress=not args.no_progress,
                      groups=split(args.groups) if args.groups else None)
    print(table.to_string(index=False, max_colwidth=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
