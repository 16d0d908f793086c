"""Eight emulated CPU devices for every test, set before any backend starts."""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import diloco_lite  # noqa: E402

diloco_lite.emulate_devices(8)
