#!/usr/bin/env python3
"""Checks what libzsock.so.1 exports (dist/libzsock.map says why).

  check_exports.py LIBZSOCK

Every defined global or weak dynamic symbol must be one of:
  - zs_* in version ZSOCK_1 (the C API);
  - a C++ name in ZSOCK_1 that demangles into namespace zsock (or its
    vtable, type information, or a thunk of one);
  - an unversioned memory-release interposer (free, realloc, reallocarray,
    munmap, mremap, madvise, shmdt, operator delete);
  - a weak definition that libstdc++.so.6 exports too (ld keeps those the
    absl shared libraries reference), or a symbol the linker itself adds
    (_end, _edata, __bss_start).
Nothing of absl's may be exported, nor anything of the providers' or the
engine's internal namespaces. The API must be there: zs_socket and the
rest of the C API, zsock::Fabric::Open, zsock::RegisterProvider.
"""
import subprocess
import sys

INTERPOSERS = {"free", "realloc", "reallocarray", "munmap", "mremap", "madvise", "shmdt"}
LINKER = {"_end", "_edata", "__bss_start"}
REQUIRED = ["zs_socket", "zs_connect", "zs_accept", "zs_send", "zs_recv", "zs_poll",
            "zs_close", "zsock::Fabric::Open(", "zsock::RegisterProvider(",
            "zsock::LoadProviderModules()", "typeinfo for zsock::Fabric",
            "vtable for zsock::Endpoint"]
INTERNAL = ["zsock::unet::", "zsock::tcp::", "zsock::ofi::", "zsock::ucx::", "zsock::verbs::",
            "zsock::sdp::wire::", "zsock::sdp::az::", "(anonymous namespace)", "absl::", "std::"]
THUNKS = ("vtable for ", "typeinfo for ", "typeinfo name for ", "non-virtual thunk to ",
          "virtual thunk to ")


def entity(readable):
    """The qualified name a demangled symbol defines, without its parameters
    or template arguments (so that a zsock function taking an absl type is
    zsock's, and absl's template returning a zsock type is absl's)."""
    for prefix in THUNKS:
        readable = readable.removeprefix(prefix)
    depth = 0
    out = []
    for ch in readable:
        if ch in "<(":
            if ch == "(" and depth == 0:
                break
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            if ch == " " and not "".join(out).endswith("operator"):
                out = []  # a return type came first
                continue
            out.append(ch)
    return "".join(out)


def dynamic_symbols(path):
    """(name, type, version) of each defined global/weak dynamic symbol."""
    out = subprocess.run(["nm", "-D", "--defined-only", "--with-symbol-versions", path],
                         check=True, capture_output=True, text=True).stdout
    syms = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) != 3 or parts[1] not in "TWVDBRiu":
            continue  # local symbols (lower case) are not exported
        name, _, version = parts[2].partition("@")
        syms.append((name, parts[1], version.lstrip("@")))
    return syms


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), check=True,
                         capture_output=True, text=True).stdout
    return out.splitlines()


def libstdcxx_exports():
    path = subprocess.run(["g++", "-print-file-name=libstdc++.so.6"], check=True,
                          capture_output=True, text=True).stdout.strip()
    return {name for name, _, _ in dynamic_symbols(path)}


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    syms = dynamic_symbols(argv[1])
    plain = demangle([s[0] for s in syms])
    stdcxx = None
    bad = []
    for (name, kind, version), readable in zip(syms, plain):
        if version == "ZSOCK_1" and name == "ZSOCK_1":
            continue  # the version definition itself
        what = entity(readable)
        if any(what.startswith(token) for token in INTERNAL) and kind not in "WV":
            bad.append(f"{readable}: internal name exported")
        elif name.startswith("zs_"):
            if version != "ZSOCK_1":
                bad.append(f"{name}: C API symbol not in version ZSOCK_1 ({version or 'none'})")
        elif name in INTERPOSERS or readable.startswith("operator delete"):
            if version:
                bad.append(f"{readable}: interposer is versioned ({version}); it must answer any reference")
        elif name in LINKER:
            pass
        elif version == "ZSOCK_1":
            if not what.startswith("zsock::") or any(what.startswith(t) for t in INTERNAL):
                bad.append(f"{readable}: in ZSOCK_1 but not zsock's API")
        elif kind in "WV":
            if stdcxx is None:
                stdcxx = libstdcxx_exports()
            if name not in stdcxx:
                bad.append(f"{readable}: weak export that libstdc++ does not define")
        else:
            bad.append(f"{readable}: unexpected export ({kind}, version {version or 'none'})")
    for want in REQUIRED:
        if not any(readable.startswith(want) for readable in plain):
            bad.append(f"{want}: missing from the exports")
    api = sum(1 for _, _, v in syms if v == "ZSOCK_1")
    if bad:
        print(f"check_exports: {argv[1]}: {len(bad)} problem(s):", file=sys.stderr)
        for b in bad:
            print(f"  {b}", file=sys.stderr)
        return 1
    print(f"check_exports: {argv[1]}: {api} symbols in ZSOCK_1 "
          f"({sum(1 for n, _, _ in syms if n.startswith('zs_'))} zs_*), "
          f"{len(syms) - api} others, all expected")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
