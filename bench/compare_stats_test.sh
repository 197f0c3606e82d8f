#!/usr/bin/env bash
# Tests of bench/compare_stats.sh: the medians and the paired and steady
# ratios that compare_providers.sh prints, on made-up rounds.
set -u
here=$(cd "$(dirname "$0")" && pwd)
source "$here/compare_stats.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
expect() {  # WHAT WANT GOT
  if [ "$2" == "$3" ]; then echo "ok   $1"; else echo "FAIL $1: want '$2', got '$3'"; failures=$((failures + 1)); fi
}
# rounds: zsock's avg is column 4 of zs.all; the peer's is column C of peer.all.
rounds() {  # ZS_AVGS PEER_AVGS PROBES (space-separated; probes as B/A)
  : >"$tmp/zs.all"; : >"$tmp/peer.all"; : >"$tmp/probe.all"
  for v in $1; do echo "64 0.1 0.2 $v 1 -" >>"$tmp/zs.all"; done
  for v in $2; do echo "64 $v 1" >>"$tmp/peer.all"; done
  for v in $3; do echo "${v%/*} ${v#*/}" >>"$tmp/probe.all"; done
}

expect "median of an odd count" 2 "$(printf '3\n1\n2\n' | median)"
expect "median of an even count is the lower middle" 2 "$(printf '4\n1\n2\n3\n' | median)"
expect "median of nothing" - "$(printf '' | median)"

rounds "1.0 2.0 1.5" "1.0 1.0 1.0" "50/55 50/240 60/70"
expect "col_median" 1.5 "$(col_median "$tmp/zs.all" 64 4)"
expect "paired over every round" "1.50x 1.00-2.00" "$(round_stats 64 2)"
expect "steady keeps the rounds whose probes agree within 1.3x" "1.00x 2/3" "$(steady_stats 64 2)"

rounds "1.0 2.0 1.5" "1.0 1.0 1.0" "50/55 50/65 60/78"
expect "probes 30% apart still agree" "1.50x 3/3" "$(steady_stats 64 2)"
rounds "1.0 2.0 1.5" "1.0 1.0 1.0" "50/55 50/65 60/79"
expect "probes more than 30% apart do not" "1.00x 2/3" "$(steady_stats 64 2)"

rounds "1.0 2.0 1.5" "1.0 1.0 1.0" "50/240 -/60 240/50"
expect "no steady round" "- 0/3" "$(steady_stats 64 2)"
rounds "1.0 2.0" "1.0 1.0" "50/55 60/60"
expect "two steady rounds give the lower ratio" "1.00x 2/2" "$(steady_stats 64 2)"

rounds "1.0 2.0 1.5" "1.0 1.0" "50/55 50/55 50/55"
expect "paired needs a peer number in every round" "- -" "$(round_stats 64 2)"
expect "steady too" "- -" "$(steady_stats 64 2)"
rounds "1.0 2.0" "1.0 1.0" "50/55"
expect "steady needs a probe pair in every round" "- -" "$(steady_stats 64 2)"
rounds "1.0 0" "1.0 1.0" "50/55 50/55"
expect "a zero time is no ratio" "- -" "$(round_stats 64 2)"
rounds "1.0" "1.0" "50/55"
expect "one round is no median" "- -" "$(round_stats 64 2)"

if [ "$failures" -ne 0 ]; then echo "$failures failed"; exit 1; fi
echo "all passed"
