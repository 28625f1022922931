"""Stand-in for ``pypto.backend``."""

import enum


class BackendType(enum.Enum):
    Ascend910B = "Ascend910B"
    Ascend950 = "Ascend950"
