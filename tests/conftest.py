"""Eight emulated CPU devices for every test, set before any backend starts."""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

# Compile fast, run slower: the tests' programs are tiny and most of their time is XLA:CPU
# compiling them (LLVM's optimizations took a third of it). The HLO, hence every collective and
# byte the tests read, is the same; the float results agree to rounding. Only this process's
# backend gets the flags (a flag already in XLA_FLAGS wins): the processes it starts (the
# notebooks' kernels in make test, the two-process runs) keep XLA's defaults, as the library.
FAST_COMPILE = {"xla_backend_optimization_level": "0", "xla_llvm_disable_expensive_passes": "true"}
_flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join(
    [_flags, *(f"--{k}={v}" for k, v in FAST_COMPILE.items() if k not in _flags)]).strip()

import diloco_lite  # noqa: E402

diloco_lite.emulate_devices(8)  # adds its own flags to XLA_FLAGS, which its children inherit
import jax  # noqa: E402

jax.devices()  # the backend starts here, with FAST_COMPILE; then children get XLA_FLAGS without
os.environ["XLA_FLAGS"] = " ".join(f for f in os.environ["XLA_FLAGS"].split() if not any(
    f.startswith(f"--{k}=") for k in FAST_COMPILE if k not in _flags))

# Many tests train the same tiny model: a persistent compilation cache lets a re-created jitted
# function with identical HLO skip XLA compilation (speed only; results are unaffected). One
# fresh directory per test process, removed at its end. Not one shared by the xdist workers:
# JAX writes an entry in place, so another process could read it half written, unless a size
# limit turns on its file lock, and then every write scans the whole directory (about 25 µs an
# entry, thousands of entries: minutes of CPU over make test).
import shutil  # noqa: E402
import tempfile  # noqa: E402


def pytest_configure(config):
    config._diloco_lite_xla_cache = tempfile.mkdtemp(prefix="diloco_lite_xla_")
    diloco_lite.enable_compilation_cache(config._diloco_lite_xla_cache)


def pytest_unconfigure(config):
    shutil.rmtree(getattr(config, "_diloco_lite_xla_cache", ""), ignore_errors=True)
