"""``python -m proofs``: validate the proofs and run the tests they name (see :mod:`proofs.check`)."""

from .check import main

raise SystemExit(main())
