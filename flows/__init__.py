"""Prefect flows: ``rlcr`` (training, deployment ``rlcr/train``) and ``rlcr-probe`` (deployment ``nightly``)."""

import os

# A busy machine can take a while to start Prefect's ephemeral API server (no-server mode).
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
