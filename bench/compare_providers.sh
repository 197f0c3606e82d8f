#!/usr/bin/env bash
# Provider-level ping-pong latency and bandwidth of zsock's ofi and ucx
# configurations beside the transports' own tools, on the same transports and
# sizes, in one run, printed as one table with ratios (zsock / peer):
#
#   zsock ofi:tcp;ofi_rxm?iface=lo  vs  fi_pingpong -p "tcp;ofi_rxm" -e rdm -d lo
#   zsock ofi:shm                   vs  fi_pingpong -p shm -e rdm
#   zsock ofi:tcp?iface=lo (MSG)    vs  fi_pingpong -p tcp -e msg -d lo
#         (waiting on its sockets, cq_wait=sockets, the default of ofi:tcp)
#   zsock ofi:tcp?iface=lo&cq_wait=fd (row ofi:msg-fd): the same with
#         FI_WAIT_FD CQs, the default before 2026-11-23
#   zsock ofi:tcp?iface=lo&cq_wait=none (row ofi:msg-nowait), and
#   zsock ofi:tcp;ofi_rxm?iface=lo&cq_wait=none (row ofi:tcp-nowait): the
#         same, with zsock's CQs opened as fi_pingpong opens its own,
#         FI_WAIT_NONE (docs/ofi.md)
#   zsock ucx:tcp                   vs  UCX_TLS=tcp ucx_perftest -t tag_lat / tag_bw
#   zsock ucx:posix,cma             vs  UCX_TLS=posix,cma ucx_perftest -t tag_lat / tag_bw
#   zsock ucx:posix,cma?threads=serialized (row ucx:posix-ser): no
#         worker lock, as ucx_perftest's default thread mode (-M single)
#   zsock ucx:posix,cma (row ucx:posix-mt) vs ucx_perftest -M multi: both
#         thread-safe (docs/ucx.md, "Thread modes")
#   zsock ucx:tcp (row ucx:tcp-err) vs ucx_perftest -e: both with
#         endpoints that handle peer failure (UCP_ERR_HANDLING_MODE_PEER,
#         which zsock always asks for; UCX's large messages over tcp take
#         another protocol with it; docs/ucx.md, "Numbers")
#   zsock ucx:posix,cma (row ucx:posix-err) vs ucx_perftest -e with
#         UCX_MM_ERROR_HANDLING=y (which -e needs over shared memory, and
#         zsock sets): the same, over shared memory
#
# Usage (as root on a fresh Debian 12 clone; installs what is missing):
#   bash bench/compare_providers.sh [--sizes=64,4096,65536,1048576] [--iters=20000]
#                                   [--cores=0,1]
#                                   [--configs=ofi:tcp,ofi:shm,ofi:msg,ofi:msg-fd,ofi:msg-nowait,ucx:tcp,ucx:posix,
#                                              ucx:posix-ser,ucx:posix-mt,ucx:tcp-err,ucx:posix-err]
#                                   (also ofi:tcp-nowait)
#                                   [--repeat=5] [--level=provider|sdp]
#
# --level=sdp measures zsock one layer up: SDP sockets (zsock_bench
# --test=pingpong --mode=bcopy over the zs_* API, blocking calls, the
# library's default spin-then-sleep wait) over the same configuration,
# against the same peer tool; latency only (the bandwidth columns say "-").
#
# Every pair of processes (zsock's, fi_pingpong's, ucx_perftest's) runs on
# 127.0.0.1 with the server pinned to the first core and the client to the
# second (taskset), and every side busy-polls its completion queue:
# provider_bench --wait=spin polls CompletionQueue::Poll, fi_pingpong polls
# fi_cq_read on FI_WAIT_NONE CQs, ucx_perftest polls ucp_worker_progress.
# zsock's tcp CQs keep their FI_WAIT_FD wait object (what a blocking wait
# sleeps on) except in the -nowait rows; shm has none.
#
# Latency is one-way (round trip / 2), in microseconds: the average over the
# timed round trips (fi_pingpong reports only that) and, where the peer
# reports one, the median. Iterations per size are the same for all three:
# --iters below 64 KiB, a tenth of it from 64 KiB, a hundredth from 1 MiB
# (at least 200 and 50). zsock and ucx_perftest first run a tenth as many
# untimed warm-up round trips; fi_pingpong has no warm-up option.
#
# Every measurement runs --repeat rounds, interleaved (each round: zsock
# once over all sizes, then the peer tool at each size), and each number
# printed is the median of its rounds, for zsock and the peers alike. On a
# shared 2-core VM a single run swings by a multiple with what else runs
# and with where the hypervisor places the two vCPUs (ucx_perftest's own
# one-way changes with the placement): interleaving gives both sides the
# same spells, and the median drops the lucky and the unlucky run alike. The
# column "paired" is the median of the ratio of the averages within each
# round (zsock and the peer a few seconds apart), and "rounds" the lowest
# and the highest of those ratios, so a ratio near a target can be read
# with its spread. "ratio" divides two medians that may come from
# different spells; "paired" compares like with like (round_stats).
# "steady" is "paired" over the rounds whose placement held: line_probe
# (bench/placement.h) times a cache line crossing between the two cores
# before zsock's run and after the peer's, and a round is kept when the
# two agree within 1.3x; "kept" says how many rounds that was (steady_stats).
# Each configuration's probes follow its rows.
#
# Bandwidth, in 10^6 bytes per second, is measured the way each peer tool
# measures it: against fi_pingpong, ping-pong bandwidth (size / one-way
# latency, fi_pingpong's MB/sec); against ucx_perftest, streaming bandwidth
# with 32 messages outstanding (tag_bw -O 32; zsock: --window=32), computed
# from the message rate so that UCX's MB (2^20) does not matter.
set -uo pipefail
cd "$(dirname "$0")/.."

sizes=64,4096,65536,1048576
iters=20000
cores=0,1
configs=ofi:tcp,ofi:shm,ofi:msg,ofi:msg-fd,ofi:msg-nowait,ucx:tcp,ucx:posix,ucx:posix-ser,ucx:posix-mt,ucx:tcp-err,ucx:posix-err
repeat=5
level=provider
for arg in "$@"; do
  case "$arg" in
    --sizes=*) sizes=${arg#*=} ;;
    --iters=*) iters=${arg#*=} ;;
    --cores=*) cores=${arg#*=} ;;
    --configs=*) configs=${arg#*=} ;;
    --repeat=*) repeat=${arg#*=} ;;
    --level=*) level=${arg#*=} ;;
    -h|--help) sed -n '2,68p' "$0"; exit 0 ;;
    *) echo "compare_providers: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done
server_core=${cores%,*}
client_core=${cores#*,}
window=32
stream_msgs=200000     # per size, at most (bounds the time of small sizes)
stream_bytes=$((256 << 20))

bash tools/install_deps.sh || exit 1
case "$level" in
  provider|sdp) ;;
  *) echo "compare_providers: --level=$level: provider or sdp" >&2; exit 2 ;;
esac
bazel build -c opt --config=ci //bench:provider_bench //bench:zsock_bench //bench:line_probe || exit 1
# The idle Bazel server's JVM keeps working for a while after a build
# (garbage collection, seen with perf sched inside benchmark points),
# which on two cores lands beside a pinned benchmark process. Stop it
# before measuring; the next bazel command restarts it.
bazel shutdown
bench=$(pwd)/bazel-bin/bench/provider_bench
sdp_bench=$(pwd)/bazel-bin/bench/zsock_bench
line_probe=$(pwd)/bazel-bin/bench/line_probe
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

iters_for() {  # provider_bench's Iters(size)
  local s=$1
  if [ "$s" -ge $((1 << 20)) ]; then echo $(( iters / 100 > 50 ? iters / 100 : 50 ))
  elif [ "$s" -ge $((64 << 10)) ]; then echo $(( iters / 10 > 200 ? iters / 10 : 200 ))
  else echo "$iters"; fi
}
warmup_for() { local n; n=$(iters_for "$1"); echo $(( n / 10 > 10 ? n / 10 : 10 )); }
stream_for() {  # provider_bench's StreamCount(size)
  local n=$(( stream_bytes / $1 ))
  [ "$n" -gt "$stream_msgs" ] && n=$stream_msgs
  [ "$n" -lt 64 ] && n=64
  echo "$n"
}
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_listening() {  # port
  for _ in $(seq 100); do
    ss -Htln "sport = :$1" 2>/dev/null | grep -q . && return 0
    sleep 0.1
  done
  return 1
}
# run_pair PORT -- SERVER... -- CLIENT...: the server pinned to server_core,
# the client to client_core; the client's output is in $tmp/client.out.
run_pair() {
  local port=$1; shift; shift
  local server=() client=()
  while [ "$1" != "--" ]; do server+=("$1"); shift; done
  shift
  client=("$@")
  taskset -c "$server_core" "${server[@]}" >"$tmp/server.out" 2>&1 &
  local spid=$!
  pids+=("$spid")
  if ! wait_listening "$port"; then
    kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
    echo "server never listened: $(tail -1 "$tmp/server.out")" >"$tmp/client.out"
    return 1
  fi
  timeout 600 taskset -c "$client_core" "${client[@]}" >"$tmp/client.out" 2>&1
  local rc=$?
  for _ in $(seq 100); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
  kill "$spid" 2>/dev/null
  wait "$spid" 2>/dev/null
  return $rc
}

# fi_pingpong PROVIDER SIZE [-d DOMAIN] -> "avg_us MBps" or "n/a (...)"
fi_pp() {
  local prov=$1 size=$2; shift 2
  command -v fi_pingpong >/dev/null || { echo "n/a (fi_pingpong missing: apt-get install libfabric-bin)"; return; }
  local port n
  port=$(free_port)
  n=$(iters_for "$size")
  if ! run_pair "$port" -- fi_pingpong -p "$prov" "$@" -I "$n" -S "$size" -B "$port" \
       -- fi_pingpong -p "$prov" "$@" -I "$n" -S "$size" -P "$port" 127.0.0.1; then
    echo "n/a (fi_pingpong failed: $(grep -v '^$' "$tmp/client.out" | tail -1 | cut -c1-80))"
    return
  fi
  # bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
  awk '$1 ~ /^[0-9]/ && NF >= 8 {print $7, $6}' "$tmp/client.out" | tail -1
}

# ucx_perftest TLS TEST SIZE N -> "p50_us avg_us msgrate" or "n/a (...)"
ucx_pt() {
  local tls=$1 test=$2 size=$3 n=$4
  command -v ucx_perftest >/dev/null || { echo "n/a (ucx_perftest missing: apt-get install ucx-utils)"; return; }
  local port w=$(( n / 10 > 10 ? n / 10 : 10 ))
  port=$(free_port)
  if ! run_pair "$port" -- env UCX_TLS="$tls" "${ptenv[@]}" ucx_perftest -p "$port" "${ptextra[@]}" \
       -- env UCX_TLS="$tls" "${ptenv[@]}" ucx_perftest 127.0.0.1 -p "$port" -t "$test" -s "$size" -n "$n" \
          -w "$w" -O "$window" "${ptextra[@]}"; then
    echo "n/a (ucx_perftest failed: $(grep -v '^$' "$tmp/client.out" | tail -1 | cut -c1-80))"
    return
  fi
  # Final: iters p50 avg overall bw_avg bw_overall rate_avg rate_overall
  awk '$1 == "Final:" {print $3, $4, $9}' "$tmp/client.out" | tail -1
}

# The statistics (median, col_median, round_stats, steady_stats).
source bench/compare_stats.sh

# The VM's placement of the two cores now: how long a cache line takes to
# cross between them, in ns (bench/placement.h), or "-".
probe() { "$line_probe" "$server_core,$client_core" 2>/dev/null || echo -; }

# zsock CONFIG: one run over every size, appending "size p50 p99 avg
# pp_MBps stream_MBps" lines to $tmp/zs.all.
# --level=sdp: zsock_bench's ping-pong instead, its JSON turned into the
# same columns (no stream: "-").
zs_run() {
  if [ "$level" = sdp ]; then
    "$sdp_bench" --test=pingpong --provider="$1" --mode=bcopy --sizes="$sizes" \
      --iters="$iters" --server_core="$server_core" --client_core="$client_core" \
      --progress=false --json="$tmp/zs.json" >/dev/null 2>"$tmp/zs.err" || return 1
    python3 -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    s = r["msg_size"]
    print(s, r["lat_us_p50"], r["lat_us_p99"], r["lat_us_avg"], "%.1f" % (s / r["lat_us_avg"]), "-")
' "$tmp/zs.json" >>"$tmp/zs.all"
    return
  fi
  # --rma_read=false: the peer tools' rows here are send/receive only.
  "$bench" --provider="$1" --sizes="$sizes" --iters="$iters" --wait=spin --tsv \
    --baseline_tcp=false --rma_read=false --window="$window" --stream_bytes="$stream_bytes" \
    --stream_max_msgs="$stream_msgs" --cores="$server_core,$client_core" \
    >>"$tmp/zs.all" 2>"$tmp/zs.err"
}

# peer_run SIZE: one run of the peer tool at SIZE, appending "SIZE numbers..."
# to $tmp/peer.all (fi_pingpong: avg MBps; ucx_perftest: p50 avg rate_lat
# bw_rate), or the reason to $tmp/peer.na.
peer_run() {
  local size=$1 out bw
  if [ "$peer" = fi_pingpong ]; then
    out=$(fi_pp "$prov" "$size" "${extra[@]}")
  else
    out=$(ucx_pt "$tls" tag_lat "$size" "$(iters_for "$size")")
    if [[ "$out" != n/a* ]]; then
      bw=$(ucx_pt "$tls" tag_bw "$size" "$(stream_for "$size")")
      if [[ "$bw" == n/a* ]]; then out=$bw; else out+=" $(awk '{ print $3 }' <<<"$bw")"; fi
    fi
  fi
  if [[ "$out" == n/a* ]]; then echo "$out" >"$tmp/peer.na"; return; fi
  echo "$size $out" >>"$tmp/peer.all"
}
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
[ "$level" = sdp ] && echo "level: SDP sockets (zsock_bench --test=pingpong --mode=bcopy) beside the same peer tools"
echo "sizes $sizes; $iters round trips (fewer from 64 KiB); server on core $server_core, client on core $client_core; busy polling; median of $repeat interleaved rounds"
echo
rows=()
row() { rows+=("$(printf '%-14s %-12s %8s | %8s %8s %6s %6s %10s %6s %5s | %8s %8s %6s | %9s %9s %6s' "$@")"); }
fmt() { awk -v a="$1" 'BEGIN { if (a == "" || a == "-") print "-"; else printf "%.2f", a }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || a == "-" || b == "-" || b == 0) print "-"; else printf "%.2fx", a / b }'; }

IFS=, read -ra cfgs <<<"$configs"
IFS=, read -ra size_list <<<"$sizes"
for cfg in "${cfgs[@]}"; do
  ptextra=()  # ucx_perftest's options beside the defaults
  ptenv=()    # and UCX variables beside UCX_TLS
  case "$cfg" in
    ofi:tcp) zs="ofi:tcp;ofi_rxm?iface=lo"; peer=fi_pingpong; prov="tcp;ofi_rxm"; extra=(-e rdm -d lo) ;;
    ofi:shm) zs="ofi:shm"; peer=fi_pingpong; prov=shm; extra=(-e rdm) ;;
    ofi:msg) zs="ofi:tcp?iface=lo"; peer=fi_pingpong; prov=tcp; extra=(-e msg -d lo) ;;
    ofi:msg-fd) zs="ofi:tcp?iface=lo&cq_wait=fd"; peer=fi_pingpong; prov=tcp; extra=(-e msg -d lo) ;;
    ofi:msg-nowait) zs="ofi:tcp?iface=lo&cq_wait=none"; peer=fi_pingpong; prov=tcp; extra=(-e msg -d lo) ;;
    ofi:tcp-nowait) zs="ofi:tcp;ofi_rxm?iface=lo&cq_wait=none"; peer=fi_pingpong; prov="tcp;ofi_rxm"; extra=(-e rdm -d lo) ;;
    ucx:tcp) zs="ucx:tcp"; peer=ucx_perftest; tls=tcp ;;
    ucx:posix) zs="ucx:posix,cma"; peer=ucx_perftest; tls=posix,cma ;;
    ucx:posix-ser) zs="ucx:posix,cma?threads=serialized"; peer=ucx_perftest; tls=posix,cma ;;
    ucx:posix-mt) zs="ucx:posix,cma"; peer=ucx_perftest; tls=posix,cma; ptextra=(-M multi) ;;
    ucx:tcp-err) zs="ucx:tcp"; peer=ucx_perftest; tls=tcp; ptextra=(-e) ;;
    ucx:posix-err) zs="ucx:posix,cma"; peer=ucx_perftest; tls=posix,cma; ptextra=(-e)
      ptenv=(UCX_MM_ERROR_HANDLING=y) ;;
    *) echo "compare_providers: unknown config $cfg" >&2; exit 2 ;;
  esac
  # Interleaved: each round runs zsock once and then the peer at every
  # size, so that both see the same spells of the VM's scheduling.
  : >"$tmp/zs.all"; : >"$tmp/peer.all"; : >"$tmp/probe.all"; rm -f "$tmp/peer.na"
  zs_ok=1
  for r in $(seq "$repeat"); do
    echo "round $r/$repeat: zsock $zs, $peer ($cfg) ..." >&2
    before=$(probe)
    if [ "$zs_ok" = 1 ] && ! zs_run "$zs"; then
      zs_ok=0
      zs_reason=$(grep -v '^$' "$tmp/zs.err" | grep -E '(provider|zsock)_bench:' | head -1 | sed -E 's/^(provider|zsock)_bench: //' | cut -c1-100)
      [ -n "$zs_reason" ] || zs_reason=$(grep -v '^$' "$tmp/zs.err" | tail -1 | cut -c1-100)
    fi
    for size in "${size_list[@]}"; do
      [ -e "$tmp/peer.na" ] || peer_run "$size"
    done
    echo "$before $(probe)" >>"$tmp/probe.all"
  done
  for size in "${size_list[@]}"; do
    zp50=-; zavg=-; zpp=-; zstream=-
    if [ "$zs_ok" = 1 ]; then
      zp50=$(col_median "$tmp/zs.all" "$size" 2)
      zavg=$(col_median "$tmp/zs.all" "$size" 4)
      zpp=$(col_median "$tmp/zs.all" "$size" 5)
      zstream=$(col_median "$tmp/zs.all" "$size" 6)
    fi
    note=""
    [ -e "$tmp/peer.na" ] && note=$(cat "$tmp/peer.na")
    if [ "$peer" = fi_pingpong ]; then
      read -r paired spread <<<"$(round_stats "$size" 2)"
      read -r steady kept <<<"$(steady_stats "$size" 2)"
      pavg=$(col_median "$tmp/peer.all" "$size" 2)
      ppbw=$(col_median "$tmp/peer.all" "$size" 3)
      pp50="-"
      zbw=$zpp
    else
      read -r paired spread <<<"$(round_stats "$size" 3)"
      read -r steady kept <<<"$(steady_stats "$size" 3)"
      pp50=$(col_median "$tmp/peer.all" "$size" 2)
      pavg=$(col_median "$tmp/peer.all" "$size" 3)
      rate=$(col_median "$tmp/peer.all" "$size" 5)
      ppbw=$(awk -v r="$rate" -v s="$size" 'BEGIN { if (r == "-") print "-"; else printf "%.1f", r * s / 1e6 }')
      zbw=$zstream
    fi
    if [ "$level" = sdp ]; then zbw=-; ppbw=-; fi
    [ "$zs_ok" = 1 ] || { spread=-; paired=-; steady=-; kept=-; }
    row "$cfg" "$peer" "$size" "$(fmt "$zavg")" "$(fmt "$pavg")" "$(ratio "$zavg" "$pavg")" "$paired" "$spread" \
        "$steady" "$kept" \
        "$(fmt "$zp50")" "$(fmt "$pp50")" "$(ratio "$zp50" "$pp50")" \
        "$(fmt "$zbw")" "$(fmt "$ppbw")" "$(ratio "$zbw" "$ppbw")"
    [ "$zs_ok" = 1 ] || rows+=("    zsock $zs: n/a ($zs_reason)")
    [ -z "$note" ] || rows+=("    $peer: $note")
  done
  [ "${#ptextra[@]}" = 0 ] && [ "${#ptenv[@]}" = 0 ] || rows+=("    ucx_perftest ran with ${ptextra[*]}${ptenv[*]:+ and ${ptenv[*]}}; zsock as $zs")
  [ "$cfg" != ucx:posix-ser ] || rows+=("    zsock as $zs (no worker lock, as ucx_perftest's default -M single)")
  rows+=("    line crossing (ns), before zsock / after $peer, per round: $(awk '{ printf "%s%s/%s", (NR > 1 ? " " : ""), $1, $2 }' "$tmp/probe.all")")
done

echo "one-way latency (us), average and median (fi_pingpong reports no median); ratios are zsock / peer"
echo "paired: the median over the rounds of the average's ratio within each round; rounds: its lowest-highest"
echo "steady: paired over the rounds whose cache-line crossing between the two cores (bench/placement.h), probed before zsock and after the peer, agreed within 1.3x; kept: how many of all"
echo "bandwidth (10^6 B/s): ofi rows ping-pong (size / one-way latency), ucx rows streaming with $window outstanding"
printf '%-14s %-12s %8s | %8s %8s %6s %6s %10s %6s %5s | %8s %8s %6s | %9s %9s %6s\n' config peer size \
  zs_avg peer_avg ratio paired rounds steady kept zs_p50 peer_p50 ratio zs_bw peer_bw ratio
for r in "${rows[@]}"; do echo "$r"; done
