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
# directory per pytest run, made by the process that starts it; under pytest-xdist (make test)
# its workers inherit the path and share the programs any of them compiled.
import shutil  # noqa: E402
import tempfile  # noqa: E402

CACHE_ENV = "DILOCO_LITE_TEST_XLA_CACHE"


def pytest_configure(config):
    made_here = CACHE_ENV not in os.environ
    if made_here:
        os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="diloco_lite_xla_")
        config._diloco_lite_xla_cache = os.environ[CACHE_ENV]  # removed at the end
    diloco_lite.enable_compilation_cache(os.environ[CACHE_ENV])
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # several processes on one directory: a size limit turns on JAX's file lock around each
        # read and write (without it a worker could read a program another is still writing)
        import jax

        jax.config.update("jax_compilation_cache_max_size", 8 << 30)


def pytest_unconfigure(config):
    path = getattr(config, "_diloco_lite_xla_cache", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)
        os.environ.pop(CACHE_ENV, None)
