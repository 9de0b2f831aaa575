"""``python -m probust`` (what ``torchrun -m probust`` runs)."""

import sys

from probust.cli import main

sys.exit(main())
