"""The actor runtime's machinery (`diloco_lite.actors.runtime`, `actors.ray_actors`): where its
local Ray instance listens, no spin loop, lost messages recovered, warm spares, clock offsets.

The tests that start Ray are `slow` and skipped where Ray is not installed (the `cluster`
extra); the source checks run anyway.
"""

import ast
from pathlib import Path

import pytest

from tests.test_actors import needs_ray, ray_processes

ACTORS = Path(__file__).resolve().parents[1] / "diloco_lite" / "actors"


@needs_ray
def test_the_local_ray_instance_listens_on_loopback_only():
    """Its node (daemons, workers) is 127.0.0.1, also as an actor sees it; and the cluster mode
    the call turned off is back on afterwards (a later `ray.init(address=...)` joins a cluster
    on the routable address)."""
    import os

    import ray
    from ray._private import ray_constants

    from diloco_lite.actors.runtime import start_local_ray

    was = ray_constants.ENABLE_RAY_CLUSTER
    start_local_ray(ray)
    try:
        @ray.remote(num_cpus=0)
        def where():
            return ray.util.get_node_ip_address()

        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
        assert ray.get(where.remote()) == "127.0.0.1"
        assert ray_constants.ENABLE_RAY_CLUSTER == was
        assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ
    finally:
        ray.shutdown()
    assert ray_processes() == []
