#!/usr/bin/env bash
# compare_peers.sh: the same message sizes through the transports a user would
# pick instead of zsock, on this machine, in one run, as one table with each
# peer's ratio to kernel TCP:
#
#   kernel TCP        zsock_bench's baseline (pingpong + stream, TCP_NODELAY)
#   zsock P/M         zsock_bench --provider=P --mode=M --baseline=tcp
#   fi shm            fi_pingpong -p shm -e rdm            (libfabric-bin)
#   fi tcp;ofi_rxm    fi_pingpong -p "tcp;ofi_rxm" -e rdm  (libfabric-bin)
#   ucx posix,cma     ucx_perftest -t tag_lat / tag_bw, UCX_TLS=posix,cma (ucx-utils)
#   ucx tcp           ucx_perftest -t tag_lat / tag_bw, UCX_TLS=tcp
#
# Every pair runs over 127.0.0.1 with the server pinned to core 0 and the
# client to core 1 (taskset). A peer that cannot run here keeps its column
# and says why below the table.
#
#   bash bench/compare_peers.sh [--sizes=8,64,512,4K,64K,1M] [--iters=2000]
#                               [--provider=unet] [--mode=bcopy] [--timeout=120]
#   bazel run -c opt //bench:compare_peers -- --sizes=8,64K
#
# Latency is one-way in microseconds (round trip / 2): p50 where the tool
# reports it, and the average (fi_pingpong reports only the average).
# Bandwidth is 10^9 bytes/s of a uni-directional stream (fi_pingpong has no
# streaming test). "(2.0x)" = twice as good as kernel TCP at that point
# (latency: TCP / peer; bandwidth: peer / TCP).
set -euo pipefail

sizes="8,64,512,4K,64K,1M"
iters=2000
provider="unet"
mode="bcopy"
timeout_s=120
server_core=0
client_core=1
for arg in "$@"; do
  case "$arg" in
    --sizes=*) sizes="${arg#*=}" ;;
    --iters=*) iters="${arg#*=}" ;;
    --provider=*) provider="${arg#*=}" ;;
    --mode=*) mode="${arg#*=}" ;;
    --timeout=*) timeout_s="${arg#*=}" ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "compare_peers: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$iters" =~ ^[1-9][0-9]*$ ]] || { echo "compare_peers: bad --iters='$iters': a positive integer" >&2; exit 2; }
[[ "$timeout_s" =~ ^[1-9][0-9]*$ ]] || { echo "compare_peers: bad --timeout='$timeout_s'" >&2; exit 2; }
case "$mode" in bcopy|zcopy|azcopy) ;; *) echo "compare_peers: bad --mode='$mode': bcopy, zcopy or azcopy" >&2; exit 2 ;; esac

# Sizes in bytes (K, M = 1024, 1024^2), validated here once for every tool.
size_bytes=()
IFS=',' read -r -a size_items <<<"$sizes"
for s in "${size_items[@]}"; do
  if [[ "$s" =~ ^([1-9][0-9]*)([KkMm]?)$ ]]; then
    n="${BASH_REMATCH[1]}"
    case "${BASH_REMATCH[2]}" in K|k) n=$((n * 1024)) ;; M|m) n=$((n * 1048576)) ;; esac
    size_bytes+=("$n")
  else
    echo "compare_peers: bad --sizes='$sizes': '$s' is not a size (write e.g. 8,64,4K,1M)" >&2
    exit 2
  fi
done

# zsock_bench: $COMPARE_PEERS_BENCH (not a ZSOCK_ name: zsock rejects unknown
# ZSOCK_ variables), the runfiles of `bazel run`, or built here.
if [[ -n "${COMPARE_PEERS_BENCH:-}" ]]; then
  bench="$COMPARE_PEERS_BENCH"
elif [[ -x "${RUNFILES_DIR:-$0.runfiles}/zsock/bench/zsock_bench" ]]; then
  bench="${RUNFILES_DIR:-$0.runfiles}/zsock/bench/zsock_bench"
else
  repo="$(cd "$(dirname "$0")/.." && pwd)"
  (cd "$repo" && bazel build -c opt //bench:zsock_bench >&2)
  bench="$(cd "$repo" && bazel info -c opt bazel-bin 2>/dev/null)/bench/zsock_bench"
fi
[[ -x "$bench" ]] || { echo "compare_peers: zsock_bench not found at $bench" >&2; exit 1; }

work="$(mktemp -d /tmp/compare_peers.XXXXXX)"
results="$work/results.tsv"   # peer <TAB> metric <TAB> size <TAB> value
notes="$work/notes.tsv"       # peer <TAB> why it has no numbers
: >"$results"
: >"$notes"
server_pid=""
cleanup() {
  # Only the server this script started, by its PID.
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

note() { printf '%s\t%s\n' "$1" "$2" >>"$notes"; }
result() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$results"; }
progress() { echo "compare_peers: $*" >&2; }
have() { command -v "$1" >/dev/null 2>&1; }

free_port() {
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 40000))
    if ! ss -Htan "( sport = :$p or dport = :$p )" 2>/dev/null | grep -q .; then
      echo "$p"
      return
    fi
  done
  echo $((20000 + RANDOM % 40000))
}

# Waits until something listens on TCP $1 (the server we just started), or it died.
wait_listen() {
  local port="$1"
  for _ in $(seq 1 100); do
    ss -Hltn "( sport = :$port )" 2>/dev/null | grep -q . && return 0
    kill -0 "$server_pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

stop_server() {
  if [[ -n "$server_pid" ]]; then
    if kill -0 "$server_pid" 2>/dev/null; then kill "$server_pid" 2>/dev/null || true; fi
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}

# ---- zsock_bench (kernel TCP and zsock) ----

# zsock over $provider/$mode with --baseline=tcp, so kernel TCP runs in the
# same invocation; if zsock cannot run at all (exit 2: e.g. an unknown
# provider), its column says why and kernel TCP runs alone.
# Records go to the column of their transport ("tcp" = kernel TCP).
run_zsock_bench() {
  local zpeer="zsock $provider/$mode" test json err rc
  for test in pingpong stream; do
    json="$work/$test.json"
    err="$work/$test.err"
    : >"$json"
    progress "zsock_bench --test=$test --provider=$provider --mode=$mode --baseline=tcp"
    rc=0
    timeout "$timeout_s" "$bench" --test="$test" --sizes="$sizes" --iters="$iters" \
      --json="$json" --progress=false --server_core="$server_core" \
      --client_core="$client_core" --provider="$provider" --mode="$mode" --baseline=tcp \
      >"$work/$test.out" 2>"$err" || rc=$?
    if [[ $rc -eq 2 ]]; then
      note "$zpeer" "$(grep -v '^#' "$err" | tail -n 1 | sed 's/^zsock_bench: //')"
      progress "zsock_bench --test=$test --provider=tcp"
      rc=0
      timeout "$timeout_s" "$bench" --test="$test" --sizes="$sizes" --iters="$iters" \
        --json="$json" --progress=false --server_core="$server_core" \
        --client_core="$client_core" --provider=tcp >"$work/$test.out" 2>"$err" || rc=$?
    fi
    if [[ $rc -ne 0 ]]; then
      # Failed runs are named on stderr ("FAILED: <test> over <transport>/<mode>: why").
      grep 'FAILED: ' "$err" | sed 's/^zsock_bench: FAILED: //' | while read -r why; do
        case "$why" in
          *" over tcp/"*) note "kernel TCP" "$why" ;;
          *) note "$zpeer" "$why" ;;
        esac
      done
      grep -q 'FAILED: ' "$err" || note "kernel TCP" "zsock_bench --test=$test failed: $(tail -n 1 "$err")"
    fi
    python3 - "$json" "$zpeer" "$test" >>"$results" <<'EOF'
import json, sys
path, zpeer, test = sys.argv[1:]
for line in open(path):
    r = json.loads(line)
    peer = "kernel TCP" if r["transport"] == "tcp" else zpeer
    if test == "pingpong":
        print(f"{peer}\tlat_p50\t{r['msg_size']}\t{r['lat_us_p50']}")
        print(f"{peer}\tlat_avg\t{r['msg_size']}\t{r['lat_us_avg']}")
    else:
        print(f"{peer}\tbw\t{r['msg_size']}\t{r['bw_gbps']}")
EOF
  done
}

# ---- fi_pingpong ----

run_fi() {
  local peer="$1" prov="$2" size port out line
  if ! have fi_pingpong; then note "$peer" "fi_pingpong not installed (apt-get install libfabric-bin)"; return; fi
  for size in "${size_bytes[@]}"; do
    progress "$peer: fi_pingpong -p '$prov' -S $size"
    port="$(free_port)"
    timeout "$timeout_s" taskset -c "$server_core" fi_pingpong -p "$prov" -e rdm -I "$iters" \
      -S "$size" -B "$port" >"$work/fi_server.out" 2>&1 &
    server_pid=$!
    if ! wait_listen "$port"; then
      stop_server
      note "$peer" "fi_pingpong server did not start: $(tail -n 1 "$work/fi_server.out")"
      return
    fi
    if ! out="$(timeout "$timeout_s" taskset -c "$client_core" fi_pingpong -p "$prov" -e rdm \
        -I "$iters" -S "$size" -P "$port" 127.0.0.1 2>&1)"; then
      stop_server
      note "$peer" "fi_pingpong failed at $size bytes: $(echo "$out" | tail -n 1)"
      return
    fi
    stop_server
    # The header names the columns; the next line has the numbers.
    line="$(echo "$out" | awk '
      /usec\/xfer/ { for (i = 1; i <= NF; i++) if ($i == "usec/xfer") col = i; next }
      col && NF >= col { print $col; exit }')"
    if [[ "$line" =~ ^[0-9.]+$ ]]; then
      result "$peer" lat_avg "$size" "$line"
    else
      note "$peer" "could not read fi_pingpong's output at $size bytes: $(echo "$out" | tail -n 1)"
      return
    fi
  done
}

# ---- ucx_perftest ----

# ucx_final TEST SIZE N TLS: prints the numbers of the "Final:" line.
ucx_final() {
  local test="$1" size="$2" n="$3" tls="$4" port out
  port="$(free_port)"
  UCX_TLS="$tls" timeout "$timeout_s" taskset -c "$server_core" ucx_perftest -p "$port" \
    >"$work/ucx_server.out" 2>&1 &
  server_pid=$!
  if ! wait_listen "$port"; then
    stop_server
    echo "ucx_perftest server did not start: $(tail -n 1 "$work/ucx_server.out")" >&2
    return 1
  fi
  if ! out="$(UCX_TLS="$tls" timeout "$timeout_s" taskset -c "$client_core" ucx_perftest \
      127.0.0.1 -p "$port" -t "$test" -s "$size" -n "$n" -w $((n / 10 + 1)) 2>&1)"; then
    stop_server
    echo "ucx_perftest -t $test failed at $size bytes: $(echo "$out" | grep -v '^\s*$' | tail -n 1)" >&2
    return 1
  fi
  stop_server
  # "Final:  iters  p50  avg  overall  bw_avg  bw_overall  rate_avg  rate_overall"
  echo "$out" | awk '$1 == "Final:" && NF >= 9 { $1 = ""; print; found = 1 }
                     END { exit !found }'
}

run_ucx() {
  local peer="$1" tls="$2" size n final err
  if ! have ucx_perftest; then note "$peer" "ucx_perftest not installed (apt-get install ucx-utils)"; return; fi
  for size in "${size_bytes[@]}"; do
    progress "$peer: ucx_perftest -t tag_lat/tag_bw -s $size"
    if ! final="$(ucx_final tag_lat "$size" "$iters" "$tls" 2>"$work/ucx.err")"; then
      note "$peer" "$(tail -n 1 "$work/ucx.err")"
      return
    fi
    read -r _ p50 avg _ <<<"$final"
    result "$peer" lat_p50 "$size" "$p50"
    result "$peer" lat_avg "$size" "$avg"
    # Stream about as many bytes as zsock_bench's stream test does.
    n=$(( 1073741824 / size ))
    (( n > iters * 10 )) && n=$((iters * 10))
    (( n < 100 )) && n=100
    if ! final="$(ucx_final tag_bw "$size" "$n" "$tls" 2>"$work/ucx.err")"; then
      note "$peer" "$(tail -n 1 "$work/ucx.err")"
      return
    fi
    read -r _ _ _ _ bw_mib _ <<<"$final"
    # ucx_perftest's MB/s are 2^20 bytes per second.
    result "$peer" bw "$size" "$(awk -v m="$bw_mib" 'BEGIN { printf "%.6g", m * 1048576 / 1e9 }')"
  done
}

peers=("kernel TCP" "zsock $provider/$mode" "fi shm" "fi tcp;ofi_rxm" "ucx posix,cma" "ucx tcp")
run_zsock_bench
run_fi "fi shm" shm
run_fi "fi tcp;ofi_rxm" "tcp;ofi_rxm"
run_ucx "ucx posix,cma" "posix,cma"
run_ucx "ucx tcp" tcp

echo "# compare_peers: one-way latency (us) and stream bandwidth (10^9 B/s) per size;"
echo "# 127.0.0.1, server on core $server_core, client on core $client_core; $(nproc) online CPUs;" \
  "$(date -u +%Y-%m-%dT%H:%MZ); load average $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$results" "$notes" "${peers[@]}" -- "${size_bytes[@]}" <<'EOF'
import sys
args = sys.argv[1:]
results_path, notes_path = args[0], args[1]
sep = args.index("--")
peers, sizes = args[2:sep], [int(s) for s in args[sep + 1:]]
vals = {}
for line in open(results_path):
    peer, metric, size, value = line.rstrip("\n").split("\t")
    try:
        vals[(peer, metric, int(size))] = float(value)
    except ValueError:
        pass
notes = []
for l in open(notes_path):
    n = l.rstrip("\n").split("\t", 1)
    if len(n) == 2 and n not in notes:
        notes.append(n)
noted = {n[0] for n in notes}

def label(n):
    for unit, shift in (("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)

rows = [["metric", "size"] + peers]
for metric in ("lat_p50", "lat_avg", "bw"):
    for size in sizes:
        row = [{"lat_p50": "lat p50 us", "lat_avg": "lat avg us", "bw": "bw GB/s"}[metric], label(size)]
        base = vals.get(("kernel TCP", metric, size))
        for peer in peers:
            v = vals.get((peer, metric, size))
            if v is None:
                row.append("n/a" if peer in noted else "-")
                continue
            cell = f"{v:.3f}" if metric == "bw" else f"{v:.2f}"
            if peer != "kernel TCP" and base and v > 0:
                ratio = base / v if metric.startswith("lat") else v / base
                cell += f" ({ratio:.2f}x)"
            row.append(cell)
        rows.append(row)
width = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
for r in rows:
    print("  ".join(c.ljust(width[i]) if i < 2 else c.rjust(width[i]) for i, c in enumerate(r)).rstrip())
print("# (Nx) = N times better than kernel TCP (latency: TCP/peer; bandwidth: peer/TCP);"
      " '-' = the tool has no such measurement")
for peer, why in notes:
    print(f"# {peer}: {why}")
EOF
