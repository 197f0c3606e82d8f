#!/usr/bin/env bash
# Checks that a test run left the machine as it found it.
#
#   tools/machine_state.sh snapshot DIR   before the run: what exists now
#   tools/machine_state.sh check DIR      after it: exit 1, naming each
#                                         leftover, if the run left any
#
# Leftovers are: files in /dev/shm that were not there before (shared-memory
# segments of peers that died without cleaning up), network namespaces that
# were not there before, and live processes started from the suite's
# binaries (anything whose executable lies in Bazel's output tree or a
# zsock fuzzing directory). The check never ends a process: it names them.
set -uo pipefail
cmd="${1:-}"
dir="${2:-}"
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 snapshot|check DIR" >&2
  exit 2
fi
cd "$(dirname "$0")/.."

list_shm() { ls -1A /dev/shm 2>/dev/null | sort; }
list_netns() { ip netns list 2>/dev/null | awk '{print $1}' | sort; }
# PID and executable of every process whose executable belongs to the suite.
list_procs() {
  local roots=("/tmp/zsock-fuzz")
  local base
  base=$(bazel info output_base 2>/dev/null) && roots+=("$base")
  for p in /proc/[0-9]*; do
    local exe
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    for r in "${roots[@]}"; do
      case "$exe" in "$r"/*) echo "${p#/proc/} $exe"; break ;; esac
    done
  done | sort
}

case "$cmd" in
  snapshot)
    mkdir -p "$dir"
    list_shm > "$dir/shm"
    list_netns > "$dir/netns"
    ;;
  check)
    bad=0
    new_shm=$(comm -13 "$dir/shm" <(list_shm))
    if [ -n "$new_shm" ]; then
      echo "machine_state: the run left files in /dev/shm (a process died without removing them):"
      echo "$new_shm" | sed 's/^/  \/dev\/shm\//'
      bad=1
    fi
    new_ns=$(comm -13 "$dir/netns" <(list_netns))
    if [ -n "$new_ns" ]; then
      echo "machine_state: the run left network namespaces:"
      echo "$new_ns" | sed 's/^/  /'
      bad=1
    fi
    procs=$(list_procs)
    if [ -n "$procs" ]; then
      echo "machine_state: processes of the suite are still alive (pid, executable):"
      echo "$procs" | sed 's/^/  /'
      bad=1
    fi
    [ "$bad" -eq 0 ] && echo "machine_state: the run left nothing behind (/dev/shm, network namespaces, processes)"
    exit "$bad"
    ;;
  *)
    echo "usage: $0 snapshot|check DIR" >&2
    exit 2
    ;;
esac
