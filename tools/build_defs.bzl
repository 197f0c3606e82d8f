"""Compiler options and the version shared by every zsock target."""

# zsock's version: the one place it is written. The package, zsock.pc,
# zsockConfigVersion.cmake and zsock_info read it from here; the shared
# library's soname carries the major number (libzsock.so.1).
ZSOCK_VERSION = "0.1.0"
ZSOCK_SOVERSION = "1"

# Warnings are errors in project code only: system headers are included with
# -isystem by the toolchain and do not trip these.
ZSOCK_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
]

def zsock_provider_module(name, srcs, deps = []):
    """A provider as a loadable module, libzsock-<name>.so (--config=dist).

    The provider's sources are compiled against core's headers and linked
    against libzsock.so.1, never against core itself: the module then uses
    the one registry, configuration and memory hooks of the process. Its own
    symbols stay local (dist/module.map); --no-undefined makes a core symbol
    that libzsock.so.1 does not export a link error rather than a load error.
    Tagged manual: built by tools/package.sh, not by bazel build //....
    """
    native.cc_binary(
        name = "libzsock-%s.so" % name,
        srcs = srcs,
        copts = ZSOCK_COPTS,
        linkshared = True,
        additional_linker_inputs = ["//dist:module.map"],
        linkopts = [
            "-fuse-ld=bfd",  # as libzsock.so.1 (dist/BUILD.bazel)
            "-Wl,--version-script=$(location //dist:module.map)",
            "-Wl,--no-undefined",
        ],
        tags = ["manual"],
        deps = deps + [
            "//core:headers",
            "//dist:libzsock",
        ],
        visibility = ["//visibility:public"],
    )

# alwayslink for the libraries that make up libzsock.so.1: in --config=dist
# every object goes into the shared library (modules and programs use what
# nothing inside it calls); elsewhere only what a binary uses is linked.
ZSOCK_DIST_ALWAYSLINK = select({
    "//tools:dist": True,
    "//conditions:default": False,
})
