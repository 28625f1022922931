"""Build of the optional C kernel: ``blockprep._engine._kernel`` (the table engine) and
``blockprep._differ`` (the block-list encoders' step).

The extensions are ``optional``: where no C compiler or Python headers exist, the build warns and
the install carries on without them, and blockprep runs its pure-Python twin
(``blockprep.kernel_backend()`` says which runs). The kernel uses the CPython C API and the buffer
protocol only: no NumPy or torch headers, so one build serves every NumPy and torch version.
"""

from setuptools import Extension, setup

FLAGS = ["-O2", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"]

setup(
    ext_modules=[
        Extension(
            "blockprep._engine._kernel",
            sources=["blockprep/_engine/_kernel.c", "blockprep/_engine/stage.c",
                     "blockprep/_engine/ops.c",
                     "blockprep/_engine/marks.c", "blockprep/_engine/records.c",
                     "blockprep/_engine/dynamic.c", "blockprep/_engine/apply_row.c"],
            depends=["blockprep/_engine/kernel.h", "blockprep/_engine/stage.h"],
            extra_compile_args=FLAGS,
            optional=True,
        ),
        Extension(  # the encoders' step: a module of its own, so blockprep.wire can import it
            "blockprep._differ",
            sources=["blockprep/_engine/differ.c"],
            depends=["blockprep/_engine/kernel.h"],
            extra_compile_args=FLAGS,
            optional=True,
        ),
    ]
)
