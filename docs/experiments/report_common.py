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


def check_out_and_train(parser, args, here):
    """Refuses a --quick run writing over the committed report in `here`, and a
    --train that is not an executable."""
    if args.quick and os.path.realpath(args.out) == os.path.realpath(here):
        parser.error("--quick needs --out DIR elsewhere: it must not "
                     "overwrite the committed report")
    if not os.access(args.train, os.X_OK):
        parser.error(f"--train: {args.train} is not an executable "
                     "(build vflow first)")
