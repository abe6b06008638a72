"""``python -m minigpt.bench``: see :mod:`minigpt.bench.cli`."""
import sys

from .cli import main

sys.exit(main())
