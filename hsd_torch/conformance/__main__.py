"""``python -m hsd_torch.conformance kit --out DIR``: the same as ``hsd conformance kit --out DIR``."""

import sys

from .cli import main

sys.exit(main())
