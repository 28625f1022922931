"""Stand-in for ``pypto.language``: the marker of a runtime (unspecialised) scalar."""

RUNTIME = object()
