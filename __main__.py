"""Not part of the package: ``python -m fastpe`` started in the folder that holds a
checkout named ``fastpe`` runs this file.

There Python finds the checkout itself first (the current directory leads ``sys.path``)
and, as it has no ``__init__.py``, takes it for an empty namespace package named
``fastpe``: ``import fastpe`` succeeds and every name then fails (``AttributeError:
module 'fastpe' has no attribute ...``). An import runs no code of a namespace package,
so that cannot be caught; ``python -m fastpe`` runs this file instead, which says what
happened and what to do. (An ``__init__.py`` here would catch the import too, but pytest
imports a test root's ``__init__.py`` as a package, which would shadow the real one.)
"""

import os
import sys

checkout = os.path.dirname(os.path.abspath(__file__))
sys.exit(f"python -m fastpe: {checkout} is a fastpe source checkout, not the package "
         f"(Python started in {os.path.dirname(checkout)}, the folder holding it, and took "
         f"the checkout for an empty 'fastpe' namespace package). Run Python from another "
         f"folder once fastpe is installed (pip install {checkout}), or inside the checkout "
         f"(cd {checkout}) once the extension is built there (pip install -e {checkout}).")
