#!/usr/bin/python3
"""A ``python3`` for the config writer that corrupts the config at the read-back (tests only).

It stands for a filesystem that loses or mangles a write (a full or failing disk, a
pmxcfs hiccup): it runs the writer program it is given (``-I -c PROGRAM ARGS``, exactly
as the real interpreter would) but the first time the program reads the config back
after its rename, the file on disk is overwritten with other bytes just before the
read. The writer must then notice and put the old bytes back.
"""

from __future__ import annotations

import builtins
import sys

CORRUPT = b"arch: amd64\n# half-written garbage\n"


def main(argv: list[str]) -> None:
    program, args = argv[2], argv[3:]  # -I -c PROGRAM ARGS...
    conf = args[1]
    real_open = builtins.open
    reads = {"n": 0}

    def faulty_open(file, mode="r", *rest, **kw):
        if file == conf and mode == "rb":
            reads["n"] += 1
            if reads["n"] == 2:  # 1: the compare, 2: the read-back after the rename
                with real_open(conf, "wb") as out:
                    out.write(CORRUPT)
        return real_open(file, mode, *rest, **kw)

    builtins.open = faulty_open
    sys.argv = ["-c", *args]
    exec(compile(program, "<writer>", "exec"), {"__name__": "__main__"})


if __name__ == "__main__":
    main(sys.argv[1:])
