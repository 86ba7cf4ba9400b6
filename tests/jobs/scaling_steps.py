"""A torch-free elastic job for the scheduler's sizing tests: N steps, resumable, honours suspends.

Each step sleeps S seconds, divided by the run's world size when the job "scales" (its third
argument is 1): its steps/s grow with its nodes as a data-parallel job's would; otherwise they
stay the same however many nodes it holds. Every rank steps; rank 0 keeps the progress in
``scaling_<HFAI_JOB_ID>.txt`` in the workdir (every node of a local cluster shares it), so a
resumed run, at whatever size, continues where the last stopped.
"""

import os
import sys
import time

import hfai

steps, step_s, scales = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
state = f"scaling_{os.environ.get('HFAI_JOB_ID', 'local')}.txt"
start = int(open(state).read()) if os.path.exists(state) else 0
pause = step_s / world if scales else step_s
print(f"run {os.environ.get('HFAI_RUN_ID')} rank {rank} of {world} starts at step {start}", flush=True)
for step in range(start, steps):
    if hfai.receive_suspend_command():
        if rank == 0:
            with open(state + ".tmp", "w") as f:
                f.write(str(step))
            os.replace(state + ".tmp", state)
        print(f"suspending at step {step}", flush=True)
        hfai.go_suspend()
    time.sleep(pause)
print("finished", flush=True)
