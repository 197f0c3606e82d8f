#!/usr/bin/env bash
# Regenerates docs/performance.md and its figures (docs/perf/) from one run
# on this machine:
#
#   1. SDP sockets (zsock_bench over the zs_* API) on unet in every mode
#      beside kernel TCP, blocking and busy-polled, in the same invocation:
#      pingpong, stream, msgrate;
#   2. the peers a user would pick instead (bench/compare_peers.sh):
#      kernel TCP, fi_pingpong (shm, tcp;ofi_rxm), ucx_perftest (posix/cma,
#      tcp), beside zsock;
#   3. zsock's ofi and ucx providers beside libfabric's and UCX's own tools
#      (bench/compare_providers.sh), and SDP sockets over ofi:tcp;ofi_rxm and
#      ucx:tcp beside the same tools (compare_providers.sh --level=sdp);
#   4. the CPU cost of one call, both ends in one thread on one core
#      (bench/socket_ops_bench for the zs_* calls, bench/endpoint_ops_bench
#      for the unet provider beneath them).
#
# The page holds only what this run printed. Why the code is as it is, and
# the measurements behind each choice, are hand-written in docs/decisions/.
#
#   bash tools/perf_report.sh [--quick]
#
# --quick: fewer sizes and iterations (a smoke run; the page says so).
# Run it on a quiet machine: numbers taken while other work shares the two
# cores are several times worse and vary from run to run.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "perf_report: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done

bash tools/install_deps.sh
bazel build -c opt --config=ci //bench:zsock_bench //bench:provider_bench \
  //bench:socket_ops_bench //bench:endpoint_ops_bench //bench:wakeup_bench
# The idle Bazel server's JVM keeps working for a while after a build
# (garbage collection), which on two cores lands beside a pinned benchmark
# process. Stop it before measuring; the next bazel command restarts it
# (docs/decisions/0037-benchmark-hygiene.md).
bazel shutdown
bench=bazel-bin/bench/zsock_bench

if [ "$quick" = 1 ]; then
  sizes=8,4096,1048576
  peer_sizes=8,64K
  prov_args=(--sizes=64,65536 --iters=5000 --repeat=1)
  sdp_prov_args=(--sizes=64 --iters=5000 --repeat=1)
  ops_reps=2
  msgrate_iters=10000
  stream_bytes=268435456
  wakeup_rounds=100
else
  stream_bytes=1073741824
  sizes=8,64,1024,4096,65536,1048576
  peer_sizes=8,64,512,4K,64K,1M
  prov_args=()
  sdp_prov_args=(--sizes=8,64,4096 --repeat=5)
  ops_reps=5
  msgrate_iters=50000
  wakeup_rounds=1000
fi

out=docs/perf
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf "$out"
mkdir -p "$out"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

run() {  # name, then the command; keeps its stdout for the page
  local name=$1
  shift
  echo "=== $*" >&2
  printf '%q ' "$@" | sed 's/ $//' >"$tmp/$name.cmd"
  "$@" | tee "$tmp/$name.out"
}

run pingpong "$bench" --test=pingpong --provider=unet --mode=all --sizes="$sizes" \
  --baseline=all --json="$out/pingpong.json" --plot="$out"
# stream: 1 GiB per point, zsock_bench's default (256 MiB with --quick),
# so that a point at 1 MiB outlasts one of the VM's scheduling spells.
run stream "$bench" --test=stream --provider=unet --mode=all --sizes="$sizes" \
  --bytes="$stream_bytes" --baseline=all --json="$out/stream.json" --plot="$out"
# msgrate: 500,000 messages per point (100,000 with --quick), for the same
# reason: at several million messages a second, 100,000 are over within
# one spell.
run msgrate "$bench" --test=msgrate --provider=unet --mode=bcopy --sizes=8,64 \
  --iters="$msgrate_iters" --baseline=all --json="$out/msgrate.json" --plot="$out"
# AZ-SDP (figures 6-8 of the AZ-SDP paper): 64 KiB goes zero-copy only
# with the threshold lowered to it (the default is 128K).
mkdir -p "$out/az"
run azstream env ZSOCK_ZCOPY_THRESHOLD=64K "$bench" --test=stream --provider=unet \
  --mode=all --sizes=65536,1048576 --bytes="$stream_bytes" --baseline=tcp --json="$out/az/stream.json" --plot="$out/az"
# What AZ-SDP and zcopy pull with on unet, measured alone: RDMA reads
# (process_vm_readv) between two pinned processes, no SDP protocol around
# them (docs/azsdp.md, "Performance on unet").
run azceiling bazel-bin/bench/provider_bench --provider=unet --sizes=65536,1048576 \
  --baseline_tcp=false --wait=spin --stream_bytes=268435456
run overlap env ZSOCK_ZCOPY_THRESHOLD=64K "$bench" --test=overlap --provider=unet \
  --mode=all --sizes=65536,1048576 --compute_us=0,50,100,200 --baseline=tcp \
  --json="$out/az/overlap.json" --plot="$out/az"
run pagefault env ZSOCK_ZCOPY_THRESHOLD=64K "$bench" --test=pagefault --provider=unet \
  --mode=all --sizes=65536,1048576 --window=1,4,16,64 --baseline=tcp \
  --json="$out/az/pagefault.json" --plot="$out/az"
# Many endpoints on one CQ: the measured pair beside N idle connections
# (a receive posted on each) on both processes' CQs (docs/unet.md,
# "Notification": beyond 16 endpoints unet reads its CQ bell).
run manyeps bash -c 'for n in 0 16 100 500; do
  bazel-bin/bench/provider_bench --provider=unet --sizes=8,4096 --idle=$n --wait=spin \
    --baseline_tcp=false --rma_read=false --stream_max_msgs=200000 --iters=10000 --tsv |
    sed "s/^/idle=$n\t/"; done'
# Sporadic traffic: round trips 1 ms apart with both sides asleep in
# between, processes unpinned (as a service's would be): the wake-up path,
# which the busy benchmarks above never take. The sockets level runs kernel
# TCP first, with the same gaps.
run sporadic bash -c 'for p in unet "ofi:tcp;ofi_rxm?iface=lo"; do
  bazel-bin/bench/wakeup_bench --level=provider --provider="$p" --rounds='"$wakeup_rounds"'; done
  bazel-bin/bench/wakeup_bench --level=sockets --provider=unet --rounds='"$wakeup_rounds"
run peers bash bench/compare_peers.sh --sizes="$peer_sizes"
run providers bash bench/compare_providers.sh "${prov_args[@]}"
run sdp_providers bash bench/compare_providers.sh --level=sdp --configs=ofi:tcp,ofi:tcp-nowait,ucx:tcp \
  "${sdp_prov_args[@]}"
# One core for both ends (and the sockets layer's progress thread, which
# otherwise polls beside them from the other core); medians of 5
# repetitions (2 with --quick).
core=$(( $(nproc) - 1 ))
run socket_ops taskset -c "$core" bazel-bin/bench/socket_ops_bench --provider=unet \
  --benchmark_repetitions="$ops_reps" --benchmark_report_aggregates_only=true
run endpoint_ops taskset -c "$core" bazel-bin/bench/endpoint_ops_bench --config=unet \
  --benchmark_filter='BM_SendRecv/(8|64|4096)$' --benchmark_repetitions="$ops_reps" \
  --benchmark_report_aggregates_only=true

python3 - "$tmp" "$out" "$quick" "$load_before" >docs/performance.md <<'EOF'
import datetime, glob, os, platform, subprocess, sys

tmp, out, quick, load_before = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]

def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""

def block(name):
    cmd = open(os.path.join(tmp, name + ".cmd")).read().strip()
    text = open(os.path.join(tmp, name + ".out")).read().rstrip()
    return f"```sh\n{cmd}\n```\n\n```text\n{text}\n```\n"

model = sh("lscpu | sed -n 's/^Model name: *//p'") or platform.processor()
mem = sh("free -g | awk '/^Mem:/ {print $2}'")
print("# Performance\n")
print("<!-- Generated by tools/perf_report.sh from one run; do not edit: run the script again. -->\n")
print("Every table below comes from one run of `bash tools/perf_report.sh`"
      + (" --quick (fewer sizes and iterations: a smoke run, not a measurement)" if quick else "")
      + ", which ran each command shown, in this order, with zsock and its peers side by side"
        " in the same invocation. Ratios compare numbers of the same run only.\n")
print(f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
print(f"- Machine: {model}, {os.cpu_count()} cores, {mem} GiB, {platform.system()} {platform.release()}")
print(f"- OS: {sh('. /etc/os-release && echo $PRETTY_NAME')}; compiler: {sh('gcc --version | head -1')}; build: `-c opt`")
fabric_v = sh("dpkg-query -W -f='${Version}' libfabric1")
ucx_v = sh("dpkg-query -W -f='${Version}' libucx0")
print(f"- libfabric {fabric_v}, UCX {ucx_v}")
print(f"- Load average before the run: {load_before}")
print("- Client and server are separate processes pinned to different cores.\n")

print("## SDP sockets on unet beside kernel TCP\n")
print("`zsock_bench` over the `zs_*` API (docs/benchmarks.md explains each test"
      " and the columns). Two kernel TCP baselines ran in the same invocation, both"
      " TCP_NODELAY: `tcp` with blocking calls (a waiting receiver sleeps and is woken),"
      " `tcp-busy` busy-polled (non-blocking calls in a loop, SO_BUSY_POLL; a core per"
      " waiting process). `vs_tcp` and `vs_tcp_busy` are zsock over each"
      " (docs/benchmarks.md, \"The two kernel TCP baselines\").\n")
for name, title in (("pingpong", "Ping-pong (one-way latency)"),
                    ("stream", "Stream (uni-directional throughput)"),
                    ("msgrate", "Message rate")):
    print(f"### {title}\n")
    print(block(name))
pngs = sorted(glob.glob(os.path.join(out, "*.png")))
if pngs:
    print("Figures (gnuplot, from the JSON next to them in docs/perf/):\n")
    for p in pngs:
        rel = os.path.relpath(p, "docs")
        print(f"![{os.path.basename(p)}]({rel})\n")

print("## AZ-SDP beside bcopy, zcopy and kernel TCP (figures 6-8 of the AZ-SDP paper)\n")
print("docs/azsdp.md explains the scheme. `overlap` computes the given microseconds"
      " between sends; `pagefault` rewrites the send buffer every W sends (each rewrite"
      " faults on a protected buffer in azcopy mode).\n")
for name, title in (("azstream", "Stream, 64 KiB and 1 MiB (zcopy_threshold 64K)"),
                    ("azceiling", "The data mover alone: unet RDMA read (`read_GB/s`), provider level"),
                    ("overlap", "Computation/communication overlap"),
                    ("pagefault", "Page-fault impact (buffer rewritten every W sends)")):
    print(f"### {title}\n")
    print(block(name))
az_pngs = sorted(glob.glob(os.path.join(out, "az", "*.png")))
for p in az_pngs:
    rel = os.path.relpath(p, "docs")
    print(f"![az {os.path.basename(p)}]({rel})\n")

print("## Many connections on one completion queue\n")
print("unet provider level: an 8 B and a 4 KiB ping-pong and stream on one pair beside N idle"
      " connections on both processes' CQs (`provider_bench --idle`). Columns: idle"
      " connections, size, one-way p50, p99, average (us), ping-pong MB/s, stream MB/s"
      " (200,000 messages), read MB/s (`-`: not measured).\n")
print(block("manyeps"))
print("## Sporadic traffic: the wake-up path\n")
print("`wakeup_bench`: 64-byte round trips 1 ms apart, both processes asleep in between and"
      " not pinned; the provider level waits in `CompletionQueue::Wait`, the sockets level in"
      " `zs_recv` (SDP, the progress thread running) after kernel TCP with the same gaps."
      " Round trip in microseconds (docs/benchmarks.md).\n")
print(block("sporadic"))
print("## Beside the peers a user would pick instead\n")
print(block("peers"))
print("## zsock's providers beside libfabric's and UCX's own tools\n")
print(block("providers"))
print("## SDP sockets over ofi and ucx beside the same tools\n")
print("The same comparison one layer up: zsock_bench's ping-pong over the zs_* sockets API"
      " (SDP bcopy, blocking calls) on `ofi:tcp;ofi_rxm` and `ucx:tcp`, against fi_pingpong"
      " and ucx_perftest on the same transports. The row"
      " `ofi:tcp-nowait` is `ofi:tcp;ofi_rxm` with `cq_wait=none` (CQs without a wait object,"
      " as fi_pingpong opens its own; docs/ofi.md).\n")
print(block("sdp_providers"))
print("## The CPU cost of one call\n")
print("Both ends of one connection in one thread, pinned to one core (Google Benchmark;"
      " the `_median` and `_stddev` rows are over the repetitions): no wire wait, so this is"
      " what the software costs per message, and it moves far less with the VM's phase"
      " than the two-process numbers above. `socket_ops_bench` times the `zs_*` calls (sockets"
      " layer, SDP engine and unet); `BM_SendRecv` is one send and one receive, `BM_Burst/N`"
      " N sends of 8 bytes then N receives (per item: one send plus one receive, most"
      " appended to a queued message). `endpoint_ops_bench` times the unet provider alone"
      " (post a receive, send, poll both queues).\n")
print(block("socket_ops"))
print(block("endpoint_ops"))
EOF
echo "wrote docs/performance.md and $out/" >&2
