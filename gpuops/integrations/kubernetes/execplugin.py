"""A kubeconfig's exec credential plugin run with a deadline.

The official client runs a kubeconfig's ``exec:`` plugin with no timeout (its
``ExecProvider.run`` waits on ``communicate()``), so a plugin that hangs would hang the
executor's action, and the engine's workers with it. ``gpuops.integrations.kubernetes.client``
therefore hands the client a kubeconfig whose plugin command is this file, run by the engine's
interpreter (``python -I execplugin.py SECONDS COMMAND ARGS...``): it starts the plugin in a
session of its own, with the client's environment, working folder, standard output and error,
and waits. A plugin still running after SECONDS is killed with its whole process group, and
this exits 124 saying so on standard error, which the client's error then carries.

Only the standard library: the interpreter runs it isolated (``-I``), importing nothing of gpuops.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

TIMED_OUT = 124
"""The exit status when the plugin ran past its deadline (as coreutils' ``timeout``)."""

NOT_STARTED = 127
"""The exit status when the plugin cannot be started (no such command, not executable)."""


def main(argv: list[str]) -> int:
    """Run ``argv[1:]`` for at most ``argv[0]`` seconds; its exit status, or ``TIMED_OUT``."""
    seconds, command = float(argv[0]), argv[1:]
    try:
        plugin = subprocess.Popen(command, start_new_session=True)
    except OSError as exc:
        print(f"exec plugin {command[0]!r} cannot be started: {exc.strerror}", file=sys.stderr)
        return NOT_STARTED
    try:
        return plugin.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(plugin.pid, signal.SIGKILL)  # its children too: they hold the output pipe
        except ProcessLookupError:  # it ended just now
            pass
        plugin.wait()
        print(
            f"exec plugin {command[0]!r} gave no credentials within {seconds:g} s "
            "(executors.kubernetes.exec_timeout_s): killed",
            file=sys.stderr,
        )
        return TIMED_OUT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
