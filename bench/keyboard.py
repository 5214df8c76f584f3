"""Ctrl-C read as a key, so that ``make demo`` exits with the demo's own code.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group, make
included, and GNU make answers any SIGINT by waiting for its recipe and then
killing itself with it: ``make demo`` exited 130 after printing CLEAN. While the
demo runs on a terminal, the terminal is told not to turn Ctrl-C into a signal
(``ISIG`` off); a thread reads the key and sends SIGINT to this process alone,
where the usual handler stops the demo. The terminal's mode is restored on exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import termios
import threading
from collections.abc import Iterator

CTRL_C = b"\x03"


@contextlib.contextmanager
def ctrl_c_as_a_key(fd: int) -> Iterator[bool]:
    """While inside: Ctrl-C typed on terminal ``fd`` is SIGINT to this process only.
    Yields False (and changes nothing) when ``fd`` is not a terminal."""
    if not os.isatty(fd):
        yield False
        return
    saved = termios.tcgetattr(fd)
    mode = termios.tcgetattr(fd)
    mode[3] &= ~(termios.ICANON | termios.ECHO | termios.ISIG)  # local modes
    mode[6][termios.VMIN], mode[6][termios.VTIME] = 1, 0  # a read returns each key
    termios.tcsetattr(fd, termios.TCSANOW, mode)
    threading.Thread(target=_read_keys, args=(fd,), name="ctrl-c", daemon=True).start()
    try:
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _read_keys(fd: int) -> None:
    while True:
        try:
            key = os.read(fd, 1)
        except OSError:
            return
        if not key:
            return
        if key == CTRL_C:
            os.kill(os.getpid(), signal.SIGINT)
