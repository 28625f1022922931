"""Build of the optional C kernel, ``blockprep.engine._kernel``.

The extension is ``optional``: where no C compiler or Python headers exist, the build warns and
the install carries on without it, and ``blockprep.engine`` runs its pure-Python twin
(``blockprep.kernel_backend()`` says which runs). The kernel uses the CPython C API and the buffer
protocol only: no NumPy or torch headers, so one build serves every NumPy and torch version.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "blockprep.engine._kernel",
            sources=["blockprep/engine/_kernel.c", "blockprep/engine/stage.c",
                     "blockprep/engine/marks.c", "blockprep/engine/records.c",
                     "blockprep/engine/differ.c"],
            depends=["blockprep/engine/kernel.h"],
            extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
