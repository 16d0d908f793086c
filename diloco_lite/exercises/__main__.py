"""`python -m diloco_lite.exercises grade NOTEBOOK.ipynb` or `... pack [FOLDER]` (grade.py)."""

import sys

from .grade import main

sys.exit(main())
