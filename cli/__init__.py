"""The ``hfai`` command (``hfai.cli.main``) and its commands' modules.

Where this process is the ``hfai`` command (the console script, ``python -m hfai.cli.main``), the
cyclic garbage collector is paused from here on, while click and then the command's module load
(``hfai.cli.main._loading`` freezes what exists then and starts it again): it would run some 15
times over what the imports make, all of which lives as long as the process.
"""

import gc
import os
import sys

#: Whether the collector was paused here (for hfai.cli.main._loading to start it again).
gc_paused = False


def _is_the_command() -> bool:
    argv = getattr(sys, "orig_argv", ())
    if os.path.basename(sys.argv[0] if sys.argv else "") == "hfai":
        return True
    return "-m" in argv and argv[argv.index("-m") + 1:argv.index("-m") + 2] == ["hfai.cli.main"]


if gc.isenabled() and _is_the_command():
    gc.disable()
    gc_paused = True
