"""The shell commands a document shows, as written: for tests that run them verbatim."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

_SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)


def sh_blocks(doc: str, section: str | None = None) -> list[str]:
    """The ```sh blocks of ``doc`` (a path under the repository), or of its ``## section``."""
    text = (REPO_ROOT / doc).read_text(encoding="utf-8")
    if section is not None:
        start = text.index(f"\n## {section}\n")
        end = text.find("\n## ", start + 1)
        text = text[start:end if end >= 0 else len(text)]
    return _SH_BLOCK.findall(text)


def commands(block: str) -> list[list[str]]:
    """Each command of a block as its arguments, continuation lines joined and comments
    dropped, as the shell splits them."""
    found = []
    for line in block.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            found.append(argv)
    return found


def exports(block: str) -> dict[str, str]:
    """The variables a block's ``export NAME=value`` lines set."""
    return dict(argv[1].split("=", 1) for argv in commands(block) if argv[0] == "export")
