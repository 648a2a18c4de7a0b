"""ctest python-mypy: mypy --strict (python/mypy.ini) over the mhccl package as the build
assembled it (with the extension's generated stub, _mhccl.pyi) and over a user's view of its
public API (typing_public_api.py).

    python mypy_check.py BUILD/python

Exit code: mypy's (0: no issues), 77 (ctest's SKIP_RETURN_CODE) where mypy is not installed
(scripts/install-deps.sh installs it), 2 where the package was not built there.
"""

import importlib.util
import os
import subprocess
import sys

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "..", "mypy.ini")
USER_CODE = os.path.join(HERE, "typing_public_api.py")


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.abspath(sys.argv[1])
    if importlib.util.find_spec("mypy") is None:
        print(f"SKIPPED: mypy is not installed for {sys.executable} "
              "(scripts/install-deps.sh installs it)")
        return SKIP
    package = os.path.join(root, "mhccl")
    for f in ("__init__.py", "_mhccl.pyi"):
        if not os.path.exists(os.path.join(package, f)):
            print(f"mypy_check: {os.path.join(package, f)} is missing: build the Python "
                  "package first (scripts/build.sh)", file=sys.stderr)
            return 2
    # Run from the build tree's python/ so that `mhccl` is the built package (the source tree's
    # has no stub and no _version.py); the cache stays in the build tree.
    cmd = [sys.executable, "-m", "mypy", "--config-file", os.path.abspath(CONFIG),
           "--cache-dir", os.path.join(root, ".mypy_cache"), "mhccl", os.path.abspath(USER_CODE)]
    print("mypy_check:", " ".join(cmd), flush=True)
    env = dict(os.environ, MYPYPATH="")
    return subprocess.call(cmd, cwd=root, env=env)


if __name__ == "__main__":
    sys.exit(main())
