"""``partitioning train ARGS`` in this process, optionally frozen after a step so a test can SIGKILL it.

Usage: python tests/multihost/train_worker.py [train args...]
With ``PAUSE_AFTER=K`` and ``PAUSE_FLAG=PATH`` in the environment, the run
stops after step K's hooks, once every checkpoint it started is on disk,
touches ``PATH.<process index>`` and sleeps until it is killed: a test can then
SIGKILL every process at a known point, as a preemption would, without racing
the training loop.
"""

import os
import sys
import time
from pathlib import Path

pause = int(os.environ.get("PAUSE_AFTER", "0"))
if pause:
    import jax

    from partitioning.checkpoint.hook import CheckpointHook

    original = CheckpointHook.on_step_end

    def on_step_end(self, step, state, metrics=None):
        original(self, step, state, metrics)
        if step == pause:
            self.manager.wait()
            Path(f"{os.environ['PAUSE_FLAG']}.{jax.process_index()}").touch()
            time.sleep(3600)

    CheckpointHook.on_step_end = on_step_end

from partitioning.cli import main

sys.exit(main(["train", *sys.argv[1:]]))
