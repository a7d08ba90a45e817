#!/usr/bin/env bash
# Prints the figures of issue 42's before/after runs, one line per run.
cd "$(dirname "$0")"
echo "throughput: run | 100 queued: hand-overs/s, gap median/p99/worst ms | 1 waiter: hand-overs/s, gap median/p99/worst | grant latency at 20/s median/p99/worst"
for f in tp-*.tsv; do
  awk -F'\t' -v f="$f" '
    $3=="hand-overs/s, one lease, 100 queued" {q=$5}
    $3=="hand-over gap, one lease, 100 queued" {qg=$5"/"$6"/"$7}
    $3=="hand-overs/s, one lease, 1 waiter" {w=$5}
    $3=="hand-over gap, one lease, 1 waiter" {wg=$5"/"$6"/"$7}
    $3=="grant latency at 20 claims/s" {g=$5"/"$6"/"$7}
    END {print f" | "q", "qg" | "w", "wg" | "g}' "$f"
done
echo
echo "scale: run | grants/s at start | probe during start ms | finalized/s | probe during deletion ms | expiry median/p99/worst ms"
for f in s1000-*.tsv s10000-*.tsv; do
  [ -f "$f" ] || continue
  awk -F'\t' -v f="$f" '
    $3 ~ /grants\/s, start over/ {g=$5; match($9, /probe in another namespace: [0-9.]+ ms/); p=substr($9, RSTART+28, RLENGTH-28)}
    $3 ~ /leases finalized\/s/ {d=$5; match($9, /meanwhile granted in [0-9.]+ ms/); pd=substr($9, RSTART+21, RLENGTH-21)}
    $3 ~ /expiry lateness/ {e=$5"/"$6"/"$7}
    END {print f" | "g" | "p" | "d" | "pd" | "e}' "$f"
done
