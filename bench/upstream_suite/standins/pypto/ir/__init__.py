"""Stand-in for ``pypto.ir``."""
