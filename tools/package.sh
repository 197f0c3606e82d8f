#!/usr/bin/env bash
# Builds zsock as users install it (docs/install.md) and either installs it
# under a prefix or makes a Debian package of it, offline, with Debian's own
# tools:
#
#   tools/package.sh                     out/zsock_<version>_amd64.deb
#   tools/package.sh --out DIR           the package in DIR
#   tools/package.sh --prefix DIR        install into DIR (bin, lib, include,
#                                        share); no package, no root needed
#
# The build is bazel build --config=dist //dist:dist (optimized;
# libzsock.so.1 with unet and tcp built in, ofi/ucx/verbs as modules).
# Installed layout (LIBDIR is lib under a prefix, lib/<multiarch> in the
# package):
#   LIBDIR/libzsock.so.<version>, .so.1 and .so links
#   LIBDIR/zsock/prov/libzsock-{ofi,ucx,verbs}.so
#   LIBDIR/pkgconfig/zsock.pc, zsock-cxx.pc
#   LIBDIR/cmake/zsock/zsockConfig.cmake, zsockConfigVersion.cmake
#   include/zsock/{core,core/sdp,sockets}/*.h
#   bin/zsock_info, bin/zsock_bench
#   share/doc/zsock/
# The package's Depends come from dpkg-shlibdeps over libzsock and the
# programs; the modules' libraries (libfabric, UCX, rdma-core) are only
# Recommends, so a host without them still installs and uses unet and tcp.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "usage: tools/package.sh [--out DIR | --prefix DIR]" >&2
  exit 2
}

out_dir=out
prefix=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || usage; out_dir=$2; shift 2 ;;
    --prefix) [ $# -ge 2 ] || usage; prefix=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "package.sh: unknown argument '$1'" >&2; usage ;;
  esac
done

version=$(sed -n 's/^ZSOCK_VERSION = "\(.*\)"$/\1/p' tools/build_defs.bzl)
soversion=$(sed -n 's/^ZSOCK_SOVERSION = "\(.*\)"$/\1/p' tools/build_defs.bzl)
[ -n "$version" ] && [ -n "$soversion" ] || {
  echo "package.sh: ZSOCK_VERSION/ZSOCK_SOVERSION not found in tools/build_defs.bzl" >&2
  exit 1
}

# Headers users compile against: the provider interface and its toolkit,
# the sockets APIs, and the engine headers sockets/socket.h includes. Each
# compiles on its own with only libabsl-dev (tools/package_test.sh checks).
headers=(core/*.h core/sdp/az_guard.h core/sdp/connection.h core/sdp/deadline.h
         core/sdp/engine.h core/sdp/wire.h sockets/readiness.h sockets/socket.h
         sockets/zsock.h)

bazel_flags=(--config=dist)
[ "${CI:-}" = "true" ] && bazel_flags+=(--config=ci)
bazel build "${bazel_flags[@]}" //dist:dist

bin=bazel-bin
for f in "$bin/dist/libzsock.so.$soversion" "$bin/dist/zsock_info" \
         "$bin/bench/zsock_bench_dist" "$bin"/providers/{ofi,ucx,verbs}/libzsock-*.so; do
  [ -f "$f" ] || { echo "package.sh: $f was not built" >&2; exit 1; }
done

# stage ROOT PREFIX LIBDIR_REL RUNPATH: installs the tree under ROOT as it
# will be at PREFIX. RUNPATH ("" for none) is what the programs get.
stage() {
  local root=$1 pfx=$2 librel=$3 runpath=$4
  local lib="$root$pfx/$librel"
  install -d "$lib/zsock/prov" "$lib/pkgconfig" "$lib/cmake/zsock" \
             "$root$pfx/bin" "$root$pfx/include/zsock" "$root$pfx/share/doc/zsock"
  install -m 644 "$bin/dist/libzsock.so.$soversion" "$lib/libzsock.so.$version"
  ln -sf "libzsock.so.$version" "$lib/libzsock.so.$soversion"
  ln -sf "libzsock.so.$soversion" "$lib/libzsock.so"
  install -m 644 "$bin"/providers/{ofi,ucx,verbs}/libzsock-*.so "$lib/zsock/prov/"
  install -m 755 "$bin/dist/zsock_info" "$root$pfx/bin/zsock_info"
  install -m 755 "$bin/bench/zsock_bench_dist" "$root$pfx/bin/zsock_bench"
  # Bazel's build-tree runpaths go; the modules find libzsock.so.1 already
  # loaded, the programs through RUNPATH or the system's library path.
  for f in "$lib/libzsock.so.$version" "$lib"/zsock/prov/*.so; do
    patchelf --remove-rpath "$f"
  done
  for f in "$root$pfx"/bin/*; do
    if [ -n "$runpath" ]; then
      patchelf --set-rpath "$runpath" "$f"
    else
      patchelf --remove-rpath "$f"
    fi
  done
  strip --strip-unneeded "$lib/libzsock.so.$version" "$lib"/zsock/prov/*.so "$root$pfx"/bin/*
  for h in "${headers[@]}"; do
    install -D -m 644 "$h" "$root$pfx/include/zsock/$h"
  done
  # Paths in the pkg-config files: relative to the file itself under a
  # prefix (the tree can move), absolute in the package.
  local pc_prefix=$pfx pc_libdir="\${prefix}/$librel"
  if [ -n "$runpath" ]; then
    pc_prefix='${pcfiledir}/../..'
  fi
  local include_from_libdir
  include_from_libdir=$(python3 -c 'import os,sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' \
                        "$pfx/include" "$pfx/$librel")
  for pc in zsock zsock-cxx; do
    sed -e "s|@PREFIX@|$pc_prefix|" -e "s|@LIBDIR@|$pc_libdir|" \
        -e "s|@INCLUDEDIR@|\${prefix}/include|" -e "s|@VERSION@|$version|g" \
        "dist/$pc.pc.in" > "$lib/pkgconfig/$pc.pc"
  done
  for f in zsockConfig zsockConfigVersion; do
    sed -e "s|@VERSION@|$version|g" -e "s|@SOVERSION@|$soversion|g" \
        -e "s|@INCLUDE_FROM_LIBDIR@|$include_from_libdir|" \
        "dist/$f.cmake.in" > "$lib/cmake/zsock/$f.cmake"
  done
  install -m 644 README.md "$root$pfx/share/doc/zsock/"
  install -d "$root$pfx/share/doc/zsock/docs" "$root$pfx/share/doc/zsock/examples"
  install -m 644 docs/*.md "$root$pfx/share/doc/zsock/docs/"
  if [ -d examples ]; then
    cp -r examples/. "$root$pfx/share/doc/zsock/examples/"
  fi
}

if [ -n "$prefix" ]; then
  mkdir -p "$prefix"
  prefix=$(cd "$prefix" && pwd)
  stage "" "$prefix" lib '$ORIGIN/../lib'
  echo "package.sh: installed zsock $version under $prefix"
  echo "  pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig; CMake: -DCMAKE_PREFIX_PATH=$prefix"
  exit 0
fi

multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# dpkg-shlibdeps works in a source tree's layout: debian/control, the
# package's files under debian/<package>/.
root="$work/debian/zsock"
stage "$root" /usr "lib/$multiarch" ""
lib="$root/usr/lib/$multiarch"
mkdir -p "$root/DEBIAN"
printf 'Source: zsock\n\nPackage: zsock\nArchitecture: any\n' > "$work/debian/control"
# Other packages that link libzsock.so.1 depend on this one.
echo "libzsock $soversion zsock (>= $version)" > "$root/DEBIAN/shlibs"
deps=$(cd "$work" && dpkg-shlibdeps -O -xzsock -l"${lib#"$work"/}" \
         -dDepends "debian/zsock/usr/lib/$multiarch/libzsock.so.$version" debian/zsock/usr/bin/* \
         -dRecommends debian/zsock/usr/lib/"$multiarch"/zsock/prov/*.so 2>"$work/shlibdeps.err") || {
  cat "$work/shlibdeps.err" >&2
  exit 1
}
depends=$(sed -n 's/^shlibs:Depends=//p' <<<"$deps")
recommends=$(sed -n 's/^shlibs:Recommends=//p' <<<"$deps")
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<EOF
Package: zsock
Version: $version
Architecture: $arch
Maintainer: zsock developers <zsock@localhost>
Installed-Size: $size
Depends: $depends
Recommends: ${recommends:+$recommends, }libabsl-dev, pkg-config
Section: net
Priority: optional
Description: user-space sockets and messaging over fast fabrics
 zsock is a transport framework: an SDP protocol core (buffer-copy,
 zero-copy and asynchronous zero-copy) over a provider interface for
 reliable messaging, RDMA read/write, atomics and memory registration.
 This package has libzsock.so.1 (C and C++ API; unet and tcp built in),
 the provider modules for libfabric, UCX and rdma-core verbs, headers,
 pkg-config and CMake files, zsock_info and zsock_bench.
EOF
# libzsock.so.1 is a public shared library: ldconfig after install/remove.
printf 'activate-noawait ldconfig\n' > "$root/DEBIAN/triggers"
mkdir -p "$out_dir"
deb="$out_dir/zsock_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "package.sh: built $deb"
echo "  Depends: $depends"
echo "  Recommends: ${recommends:+$recommends, }libabsl-dev, pkg-config"
