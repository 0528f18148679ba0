"""Helpers shared by the experiment scripts in docs/experiments/."""
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def command_line():
    """The command that is running, with the script relative to the root."""
    argv = list(sys.argv)
    script = os.path.abspath(argv[0])
    if script.startswith(ROOT + os.sep):
        argv[0] = os.path.relpath(script, ROOT)
    return shlex.join(argv)


def revision():
    """The checkout's commit, or None (read-only git query)."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short",
                              "HEAD"], capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None
