"""Register and serve the deployments: ``rlcr/train`` (and ``rlcr-probe/nightly``).

    python -m flows.serve            # against $PREFECT_API_URL (e.g. a local `prefect server start`)

then, from anywhere that reaches the same server:

    prefect deployment run rlcr/train -p config=configs/tiny.yaml -p run_id=my-run

The serving process executes the flow runs (Ray via $RAY_ADDRESS, or a local Ray).
"""

from __future__ import annotations

import argparse

from prefect import serve

from flows.probe import probe_deployment
from flows.train import rlcr_train


def deployments(config: str | None = None, probe_cron: str | None = None, probe_suite: str | None = None):
    params = {"config": config} if config else {}
    deps = [rlcr_train.to_deployment(
        name="train", parameters=params,
        description="RLCR training: resumable iterations (rollouts → update → eval → commit)")]
    deps.append(probe_deployment(config=config, cron=probe_cron, suite=probe_suite))
    return deps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="default config file for the deployments' runs")
    ap.add_argument("--probe-cron", help="cron (UTC) of the nightly probe; default: the config's probe.cron "
                                         "(03:00 UTC unless set)")
    ap.add_argument("--probe-suite", help="an evaluation suite file the nightly probe also runs "
                                          "(configs/suites/ood.yaml): its figures per family in the report and "
                                          "in MLflow; a run of the deployment may set -p suite=… instead")
    a = ap.parse_args()
    serve(*deployments(a.config, a.probe_cron, a.probe_suite))


if __name__ == "__main__":
    main()
