"""The scaling-law sweep (issue 19): its design (`scaling_design`: sizes, grids, recorded
choices, the runs), its analyses (`scaling_findings`: the choices on the tune plays, the gaps,
the batch rises, the cause checks) and its report (`scaling_report`: the paper's findings,
figures and rows), as one module: the group `scaling` of `experiments`, and what notebook 02
and `make reproduce-scaling` use."""

from .scaling_design import *  # noqa: F403
from .scaling_design import __doc__ as DESIGN  # noqa: F401  (the sweep's rationale)
from .scaling_findings import *  # noqa: F403
from .scaling_report import *  # noqa: F403
