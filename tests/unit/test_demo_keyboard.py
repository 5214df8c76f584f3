"""``make demo`` ends with the demo's exit code: Ctrl-C on its terminal is read as a
key and becomes SIGINT to the demo alone (make, which got the terminal's SIGINT too,
exited 130 after CLEAN). A real pseudo-terminal, a real signal."""

from __future__ import annotations

import os
import pty
import signal
import termios
import threading
import time
from types import FrameType

from bench.keyboard import CTRL_C, ctrl_c_as_a_key


def test_ctrl_c_on_the_terminal_signals_only_this_process_and_the_mode_comes_back() -> None:
    leader, follower = pty.openpty()
    before = termios.tcgetattr(follower)
    got = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        got.set()

    previous = signal.signal(signal.SIGINT, handle)
    try:
        with ctrl_c_as_a_key(follower) as active:
            assert active
            assert not termios.tcgetattr(follower)[3] & termios.ISIG  # no SIGINT to the group
            os.write(leader, CTRL_C)
            deadline = time.monotonic() + 5
            while not got.is_set() and time.monotonic() < deadline:
                time.sleep(0.01)  # the handler runs on this (the main) thread
        assert got.is_set()
        assert termios.tcgetattr(follower) == before
    finally:
        signal.signal(signal.SIGINT, previous)
        os.close(leader)
        os.close(follower)


def test_without_a_terminal_nothing_changes() -> None:
    read, write = os.pipe()
    try:
        with ctrl_c_as_a_key(read) as active:
            assert not active
    finally:
        os.close(read)
        os.close(write)
