"""``python -m sidecar.cli``: the console script ``sidecar`` (pyproject.toml ``sidecar.cli:main``)."""

import sys

from . import main

if __name__ == "__main__":  # guarded: tests/test_engine_seam.py imports every module of the package
    sys.exit(main())
