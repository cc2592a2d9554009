"""``python -m fastpe [info | bench | demo]``: see :mod:`fastpe._cli`."""

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
