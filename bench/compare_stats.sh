# compare_stats.sh: the statistics of bench/compare_providers.sh, sourced by
# it and by bench/compare_stats_test.sh. They read $tmp/zs.all (zsock: "SIZE
# p50 p99 avg ..." per round), $tmp/peer.all (the peer: "SIZE numbers..."
# per round) and $tmp/probe.all ("BEFORE AFTER" line-crossing probes, ns,
# per round), all in round order.

# The median of the numbers on stdin ("-" if none; the lower middle one
# of an even count).
median() {
  sort -g | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : "-") }'
}

# Column C's median over the lines of FILE whose first field is KEY.
col_median() {  # FILE KEY C
  awk -v k="$2" -v c="$3" '$1 == k { print $c }' "$1" | median
}

# "ZSOCK PEER" per round at SIZE: zsock's average (column 4 of zs.all)
# beside column C of peer.all; fails unless both have a line in every round.
round_pairs() {  # SIZE C
  local z p
  z=$(awk -v k="$1" '$1 == k { print $4 }' "$tmp/zs.all")
  p=$(awk -v k="$1" -v c="$2" '$1 == k { print $c }' "$tmp/peer.all")
  [ -n "$z" ] && [ "$(wc -l <<<"$z")" = "$(wc -l <<<"$p")" ] || return 1
  paste <(echo "$z") <(echo "$p")
}

# zsock's average latency at SIZE over the peer's (column C of peer.all)
# in the same round, over the rounds: "MEDIAN LO-HI" ("1.08x 1.02-1.31"),
# or "- -" unless both sides have a number in every round (and at least
# two rounds). The median of these paired ratios is the robust one: the
# VM's slow spells last seconds to minutes and move zsock and the peer
# alike (ucx_perftest's own one-way changes by a multiple from one minute
# to the next), so a ratio of two medians taken over different spells can land
# far from what any single round shows, while a round (zsock, then the
# peer, seconds apart) mostly sits inside one spell.
round_stats() {  # SIZE C
  local pairs
  pairs=$(round_pairs "$1" "$2") || { echo "- -"; return; }
  awk '
    $1 + 0 > 0 && $2 + 0 > 0 { print $1 / $2; next }
    { print "bad" }' <<<"$pairs" | sort -g | awk '
    $1 == "bad" { bad = 1; next }
    { v[++n] = $1 }
    END { if (bad || n < 2) print "- -"; else printf "%.2fx %.2f-%.2f\n", v[int((n + 1) / 2)], v[1], v[n] }'
}

# Like round_stats, over the steady rounds only: those whose line-crossing
# probes before zsock and after the peer agree within 1.3x (the VM kept its
# placement, as far as two samples can tell). "MEDIAN K/N" ("1.08x 7/9"),
# "- K/N" with fewer than two such rounds.
steady_stats() {  # SIZE C
  local pairs
  pairs=$(round_pairs "$1" "$2") || { echo "- -"; return; }
  [ "$(wc -l <<<"$pairs")" = "$(wc -l <"$tmp/probe.all")" ] || { echo "- -"; return; }
  paste <(echo "$pairs") "$tmp/probe.all" | awk '
    { n++ }
    $3 + 0 > 0 && $4 + 0 > 0 && $1 + 0 > 0 && $2 + 0 > 0 {
      hi = $3 > $4 ? $3 : $4; lo = $3 > $4 ? $4 : $3
      if (hi <= 1.3 * lo) print $1 / $2
    }
    END { print "n", n }' | sort -g | awk '
    $1 == "n" { total = $2; next }
    { v[++k] = $1 }
    END { if (k < 2) printf "- %d/%d\n", k, total; else printf "%.2fx %d/%d\n", v[int((k + 1) / 2)], k, total }'
}
