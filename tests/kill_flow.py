"""Run the `rlcr` flow in this process and SIGKILL it at a chosen stage (for tests/test_kill.py).

    python tests/kill_flow.py '<overrides json>' <run_id> <iterations> [<stage> <iteration> <delay_s>]

With a stage, the process kills itself ``delay_s`` seconds after that stage of that
iteration starts: no exception, no clean-up, exactly what a crash or an OOM kill does.
"""

import json
import os
import signal
import sys
import threading

from flows.train import rlcr_train
from rlcr import events


def main() -> None:
    overrides, run_id, iterations = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    if len(sys.argv) > 4:
        stage, at, delay = sys.argv[4], int(sys.argv[5]), float(sys.argv[6])

        def killer(event: events.StageEvent) -> None:
            if event.phase == "start" and (event.stage, event.iteration) == (stage, at):
                print(f"KILL {stage}@{at} in {delay} s", flush=True)
                threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
                if delay == 0:
                    threading.Event().wait()

        events.subscribe(killer)
    print("SUMMARY", json.dumps(rlcr_train(overrides=overrides, run_id=run_id, iterations=iterations)), flush=True)


if __name__ == "__main__":
    main()
