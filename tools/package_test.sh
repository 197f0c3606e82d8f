#!/usr/bin/env bash
# The installed-library checks (the test command's package tier): builds the
# Debian package, installs it with dpkg -i, and checks what a user outside
# the tree gets. One step per call, so that each counts on its own:
#
#   tools/package_test.sh WORK install    tools/package.sh, then dpkg -i
#   tools/package_test.sh WORK exports    libzsock.so.1 exports only its API
#   tools/package_test.sh WORK headers    each installed header compiles alone
#   tools/package_test.sh WORK modules    zsock_info finds the modules; a
#                                         module that cannot load is reported
#   tools/package_test.sh WORK c-example  examples/c (make, pkg-config) over
#                                         unet and ofi:tcp;ofi_rxm
#   tools/package_test.sh WORK cpp-example  examples/cpp (CMake) likewise
#   tools/package_test.sh WORK missing-libs  a host without UCX, and one
#                                         without libfabric, UCX and verbs
#                                         (hidden in a mount namespace): the
#                                         other providers still work
#   tools/package_test.sh WORK stale-key  a key is refused after free() in a
#                                         program linked with -lzsock
#   tools/package_test.sh WORK prefix     tools/package.sh --prefix, and the
#                                         examples built against that tree
#   tools/package_test.sh WORK remove     dpkg -r (the machine as before)
#
# WORK is a scratch directory the steps share.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: tools/package_test.sh WORK STEP" >&2; exit 2; }
work=$1
step=$2
mkdir -p "$work"
work=$(cd "$work" && pwd)
providers=(unet "ofi:tcp;ofi_rxm")
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libdir=/usr/lib/$multiarch

fail() {
  echo "package_test $step: FAILED: $*" >&2
  exit 1
}

# run_each env|arg PROGRAM: runs it once per provider, chosen by
# ZSOCK_PROVIDER (env) or as its argument (arg), each bounded in time.
run_each() {
  local how=$1 prog=$2 p
  for p in "${providers[@]}"; do
    if [ "$how" = env ]; then
      echo "  ZSOCK_PROVIDER='$p' $prog"
      ZSOCK_PROVIDER=$p timeout 120 "$prog" || fail "$prog over $p"
    else
      echo "  $prog '$p'"
      timeout 120 "$prog" "$p" || fail "$prog over $p"
    fi
  done
}

case "$step" in
  install)
    bash tools/package.sh --out "$work/deb"
    deb=$(ls "$work"/deb/zsock_*_amd64.deb)
    dpkg -i "$deb"
    dpkg -s zsock | grep -q "^Status: install ok installed" || fail "dpkg -i did not install zsock"
    ;;

  exports)
    python3 tools/check_exports.py "$libdir/libzsock.so.1"
    ;;

  headers)
    # Only the installed tree and Debian's libabsl-dev: no -I into the
    # source tree. zsock.h is also C.
    # One compiler per header, two at a time (the machine's cores).
    find /usr/include/zsock -name '*.h' | sort | sed 's|^/usr/include/zsock/||' > "$work/headers.txt"
    n=$(wc -l < "$work/headers.txt")
    xargs -P 2 -I{} sh -c 'printf "#include \"%s\"\n#include \"%s\"\n" "$1" "$1" |
        g++ -std=c++20 -fsyntax-only -Wall -Werror -I/usr/include/zsock -x c++ - ||
        { echo "package_test headers: FAILED: $1 does not compile on its own (C++20)" >&2; exit 255; }' _ {} \
      < "$work/headers.txt" || fail "a header does not compile on its own (above)"
    printf '#include "sockets/zsock.h"\n' |
      gcc -std=c11 -fsyntax-only -Wall -Werror -I/usr/include/zsock -x c - ||
      fail "sockets/zsock.h does not compile as C11"
    [ "$n" -ge 30 ] || fail "only $n headers installed"
    echo "  $n headers compile alone (C++20), sockets/zsock.h also as C11"
    ;;

  modules)
    out=$(zsock_info)
    for m in ofi ucx verbs; do
      grep -q "$libdir/zsock/prov/libzsock-$m.so: loaded ($m)" <<<"$out" ||
        fail "zsock_info does not list libzsock-$m.so as loaded: $out"
    done
    # A module whose library is missing: reported with the loader's reason,
    # and the other providers still work.
    mods="$work/modules"
    rm -rf "$mods"
    mkdir -p "$mods"
    echo 'int zsock_test_missing_dep(void) { return 1; }' > "$mods/dep.c"
    gcc -shared -fPIC -o "$mods/libzsocktestdep.so" "$mods/dep.c"
    echo 'int zsock_test_missing_dep(void); int f(void) { return zsock_test_missing_dep(); }' > "$mods/m.c"
    gcc -shared -fPIC -o "$mods/libzsock-broken.so" "$mods/m.c" -L"$mods" -lzsocktestdep
    rm "$mods/libzsocktestdep.so" "$mods"/*.c
    out=$(ZSOCK_PROVIDER_PATH=$mods zsock_info)
    grep -q "provider modules: $mods (ZSOCK_PROVIDER_PATH)" <<<"$out" || fail "module path not reported: $out"
    grep -q "libzsock-broken.so: FAILED TO LOAD: libzsocktestdep.so: cannot open shared object file" <<<"$out" ||
      fail "the broken module's reason is not reported: $out"
    grep -q "^unet: " <<<"$out" || fail "unet missing beside a broken module"
    out=$(ZSOCK_PROVIDER_PATH=$mods zsock_info --provider=broken)
    grep -q "UNAVAILABLE: provider 'broken' is in module $mods/libzsock-broken.so, which failed to load" <<<"$out" ||
      fail "opening the broken module's provider does not say why: $out"
    echo "  modules loaded: ofi ucx verbs; a module with a missing library is reported and skipped"
    ;;

  c-example)
    rm -rf "$work/c"
    cp -r examples/c "$work/c"
    make -C "$work/c"
    run_each env "$work/c/zsock_echo"
    ;;

  cpp-example)
    rm -rf "$work/cpp"
    cmake -S examples/cpp -B "$work/cpp" >/dev/null
    cmake --build "$work/cpp"
    run_each arg "$work/cpp/provider_example"
    ;;

  missing-libs)
    # Each library is hidden by mounting /dev/null over it in a private
    # mount namespace: the loader then fails on it as on a host that lacks
    # it, and nothing outside the namespace is touched.
    without() {
      local libs=$1
      shift
      local mounts=""
      for l in $libs; do
        mounts+="mount --bind /dev/null $(readlink -f "$libdir/$l") && "
      done
      unshare -m sh -c "${mounts}exec \"\$@\"" sh "$@"
    }
    [ -x "$work/c/zsock_echo" ] || fail "run the c-example step first"
    # No UCX: the ucx module is reported; unet and ofi work.
    out=$(without libucp.so.0 zsock_info)
    grep -q "libzsock-ucx.so: FAILED TO LOAD: .*libucp.so.0" <<<"$out" ||
      fail "without libucp, zsock_info does not report the ucx module's failure: $out"
    grep -q "libzsock-ofi.so: loaded (ofi)" <<<"$out" || fail "without libucp, ofi did not load: $out"
    for p in unet "ofi:tcp;ofi_rxm"; do
      ZSOCK_PROVIDER=$p without libucp.so.0 timeout 120 "$work/c/zsock_echo" ||
        fail "without libucp, the C example over $p"
    done
    # No libfabric, UCX or verbs libraries: unet and tcp work.
    hidden="libfabric.so.1 libucp.so.0 libibverbs.so.1"
    out=$(without "$hidden" zsock_info)
    for m in ofi ucx verbs; do
      grep -q "libzsock-$m.so: FAILED TO LOAD: " <<<"$out" ||
        fail "without $hidden, the $m module's failure is not reported: $out"
    done
    out=$(ZSOCK_PROVIDER=ucx:tcp without "$hidden" "$work/c/zsock_echo" 2>&1) &&
      fail "the C example ran over ucx:tcp without libucp"
    grep -q "failed to load" <<<"$out" || fail "opening ucx without libucp does not say why: $out"
    for p in unet tcp; do
      ZSOCK_PROVIDER=$p without "$hidden" timeout 120 "$work/c/zsock_echo" ||
        fail "without $hidden, the C example over $p"
    done
    echo "  without libucp: ucx reported, unet and ofi work; without libfabric, UCX, verbs: unet and tcp work"
    ;;

  stale-key)
    rm -rf "$work/stale"
    cmake -S tests/package -B "$work/stale" >/dev/null
    cmake --build "$work/stale"
    readelf -d "$work/stale/stale_key_after_free" | grep -q "NEEDED.*libzsock.so.1" ||
      fail "stale_key_after_free is not linked with libzsock.so.1"
    run_each arg "$work/stale/stale_key_after_free"
    ;;

  prefix)
    # No package: a prefix install, and the examples built against it
    # (pkg-config and CMake find it through the usual variables).
    pfx="$work/prefix"
    rm -rf "$pfx" "$work/prefix-c" "$work/prefix-cpp"
    bash tools/package.sh --prefix "$pfx"
    cp -r examples/c "$work/prefix-c"
    PKG_CONFIG_PATH=$pfx/lib/pkgconfig make -C "$work/prefix-c"
    readelf -d "$work/prefix-c/zsock_echo" | grep -q "$pfx/lib" ||
      fail "the C example was not linked against $pfx/lib"
    ZSOCK_PROVIDER=unet "$work/prefix-c/zsock_echo" || fail "C example against the prefix install"
    cmake -S examples/cpp -B "$work/prefix-cpp" -DCMAKE_PREFIX_PATH="$pfx" >/dev/null
    cmake --build "$work/prefix-cpp"
    "$work/prefix-cpp/provider_example" unet || fail "C++ example against the prefix install"
    "$pfx/bin/zsock_info" | grep -q "$pfx/lib/zsock/prov/libzsock-ofi.so: loaded" ||
      fail "the prefix install's zsock_info does not load its own modules"
    ;;

  remove)
    if dpkg -s zsock >/dev/null 2>&1; then dpkg -r zsock >/dev/null; fi
    ! dpkg -s zsock >/dev/null 2>&1 || fail "zsock is still installed"
    ;;

  *)
    echo "package_test.sh: unknown step '$step'" >&2
    exit 2
    ;;
esac
echo "package_test $step: ok"
