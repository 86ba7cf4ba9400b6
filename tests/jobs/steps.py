"""A torch-free job for control-plane tests: N steps of S seconds, resumable, honours suspends.

Progress is kept in ``steps_<HFAI_JOB_ID>.txt`` in the workdir, so a resumed run continues.
"""

import os
import sys
import time

import hfai

steps, step_s = int(sys.argv[1]), float(sys.argv[2])
state = f"steps_{os.environ.get('HFAI_JOB_ID', 'local')}_{os.environ.get('RANK', '0')}.txt"
start = int(open(state).read()) if os.path.exists(state) else 0
print(f"run {os.environ.get('HFAI_RUN_ID')} rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')} "
      f"starts at step {start} pid {os.getpid()}", flush=True)
for step in range(start, steps):
    if hfai.receive_suspend_command():
        with open(state + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(state + ".tmp", state)
        print(f"suspending at step {step}", flush=True)
        hfai.go_suspend()
    time.sleep(step_s)
print("finished", flush=True)
