"""``python -m corel.native build [--force] [--optional]``: compile corel's fused nodes for
this environment (see :mod:`corel.native`). ``--optional``: a machine without a C++
compiler keeps the Python nodes, with a warning, rather than failing. The build goes to
``--dir``, else ``COREL_NATIVE_DIR``, else ``<sys.prefix>/corel-native``; the compiler is
``CXX`` (default g++)."""

from __future__ import annotations

import argparse
import os
import sys

from corel.native import build, module, using


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m corel.native", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build"])
    parser.add_argument("--force", action="store_true", help="compile even if built")
    parser.add_argument("--optional", action="store_true", help="warn, not fail, if it cannot compile")
    parser.add_argument("--dir", default=os.environ.get("COREL_NATIVE_DIR") or None,
                        help="where builds live (default: COREL_NATIVE_DIR, else <sys.prefix>/corel-native)")
    args = parser.parse_args(argv)
    try:
        path = build(args.dir, force=args.force, cxx=os.environ.get("CXX") or "g++")
    except (RuntimeError, OSError) as exc:
        print(f"{exc}\ncorel.native: not built; the Python nodes run instead (the same numbers, slower)",
              file=sys.stderr)
        return 0 if args.optional else 1
    with using(True, args.dir):
        loaded = module()
    if loaded is None:
        print(f"corel.native: built {path}, but it does not load", file=sys.stderr)
        return 0 if args.optional else 1
    print(f"corel.native: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
