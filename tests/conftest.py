"""Eight emulated CPU devices for every test, set before any backend starts."""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import diloco_lite  # noqa: E402

diloco_lite.emulate_devices(8)

# Many tests train the same tiny model: a persistent compilation cache lets a re-created jitted
# function with identical HLO skip XLA compilation (speed only; results are unaffected).
import tempfile  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="diloco_lite_jax_cache_"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
