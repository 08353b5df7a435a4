"""The `rlcr` flow as the driver of the Ray cluster at ``RAY_ADDRESS`` (for tests/test_multinode.py).

    python tests/multinode_flow.py '<overrides json>' <run_id> <iterations>

Same arguments and ``SUMMARY`` line as tests/kill_flow.py (whose ``main`` it runs, without a kill), plus
what the test asserts placement with, each a line of JSON: ``NODES`` (the cluster's alive nodes, the head
marked), ``DRIVER_NODE`` (the node this process is attached to) and ``ENGINE_NODES`` (the node of each
engine actor of the flow's pool, :attr:`EnginePool.node_ids`).
"""

import json
import os
import sys
import time

import ray

import flows.train as train
import kill_flow
from rlcr.runs.cluster import ensure_ray


def report(key: str, value) -> None:
    """One ``KEY <json>`` line straight to stdout (inside the flow, ``print`` goes to Prefect's logger)."""
    os.write(1, f"{key} {json.dumps(value)}\n".encode())


class RecordingEnginePool(train.EnginePool):
    def wait_started(self) -> None:
        super().wait_started()
        report("ENGINE_NODES", self.node_ids)


def main() -> None:
    from rlcr.config import RLCRConfig

    # what the flow does first (with the run's config: a task from outside rlcr travels in the runtime
    # environment); connected here to report the cluster
    ensure_ray(RLCRConfig.from_dict(json.loads(sys.argv[1])))
    nodes = [{"node_id": n["NodeID"], "head": "node:__internal_head__" in n["Resources"],
              "resources": {k: v for k, v in n["Resources"].items() if not k.startswith("node:")}}
             for n in ray.nodes() if n["Alive"]]
    report("NODES", nodes)
    report("DRIVER_NODE", ray.get_runtime_context().get_node_id())
    train.EnginePool = RecordingEnginePool
    kill_flow.main()
    report("FLOW_RETURNED", time.time())


if __name__ == "__main__":
    main()
