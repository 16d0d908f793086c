"""Eight emulated CPU devices for every test, set before any backend starts."""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import diloco_lite  # noqa: E402

diloco_lite.emulate_devices(8)

# Many tests train the same tiny model: a persistent compilation cache lets a re-created jitted
# function with identical HLO skip XLA compilation (speed only; results are unaffected).
import tempfile  # noqa: E402

diloco_lite.enable_compilation_cache(tempfile.mkdtemp(prefix="diloco_lite_xla_"))
