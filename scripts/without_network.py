"""Run a command in this process's network namespace after bringing its loopback up.

Meant to follow ``unshare --net`` (a new network namespace has only a loopback device, and
that one down)::

    unshare --net python scripts/without_network.py pytest -m book tests/book

Inside, 127.0.0.1 works and nothing else is reachable: ``nox -s browser`` checks the book this
way, so a page (or the live mode's in-browser Python) that needs the network fails.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
import sys

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def loopback_up() -> None:
    """Set the ``lo`` device up (what ``ip link set lo up`` does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def offline() -> bool:
    """True if no address off the machine can be reached (no route to 192.0.2.1, a test address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))
        except OSError as error:
            return error.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH)
    return False


def main() -> None:
    """Bring the loopback up, make sure the network is cut, and run the command."""
    if len(sys.argv) < 2:
        sys.exit("usage: unshare --net python scripts/without_network.py COMMAND [ARG...]")
    loopback_up()
    if not offline():
        sys.exit("without_network.py: an outside address is reachable; run it under unshare --net")
    os.environ["BOOK_OFFLINE"] = "1"
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
