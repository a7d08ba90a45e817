#!/usr/bin/env bash
# Issue 42, pass 2: the scheduler with due timers ahead of commands (after2) against 8ca21d6,
# interleaved, on the control plane of pass 1.
set -uo pipefail
cd /work/main
export FL_CP_DIR=/tmp/fl-cp-bench42
eval "$(hack/control-plane up)"
B=/tmp/bench-42
for i in 2 3; do for v in before after2; do
  echo "== $(date +%T) scale 10000 $v $i"
  $B/before/bench_scale --operator $B/$v/fenced-lease-operator --sizes 10000 --beat-rate 150 --beat-seconds 10 \
    --log-dir $B/logs/s10000-$v-$i --results $B/out/s10000-$v-$i.tsv > $B/logs/s10000-$v-$i.out 2>&1 || echo "FAILED s10000 $v $i"
done; done
for i in 4 5 6; do for v in before after2; do
  echo "== $(date +%T) scale 1000 $v $i"
  $B/before/bench_scale --operator $B/$v/fenced-lease-operator --sizes 1000 --beat-rate 100 \
    --log-dir $B/logs/s1000-$v-$i --results $B/out/s1000-$v-$i.tsv > $B/logs/s1000-$v-$i.out 2>&1 || echo "FAILED s1000 $v $i"
done; done
echo "== $(date +%T) done"
