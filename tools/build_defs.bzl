"""Compiler options shared by every zsock target."""

# Warnings are errors in project code only: system headers are included with
# -isystem by the toolchain and do not trip these.
ZSOCK_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
]
