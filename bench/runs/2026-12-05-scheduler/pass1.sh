#!/usr/bin/env bash
# Issue 42: the scheduler before (8ca21d6) and after, interleaved, one fresh control plane.
set -uo pipefail
cd /work/main
export FL_CP_DIR=/tmp/fl-cp-bench42 CARGO_TARGET_DIR=/root/.cache/fenced-lease/target
hack/control-plane down >/dev/null 2>&1
eval "$(hack/control-plane up)"
kubectl=$(hack/control-plane bin-dir)/kubectl
"$kubectl" apply --server-side --force-conflicts -f crds/ >/dev/null
KUBECONFIG=$KUBECONFIG KUBECTL=$kubectl hack/crds wait
B=/tmp/bench-42
mkdir -p $B/out $B/logs
for i in 1 2 3; do for v in after before; do
  echo "== $(date +%T) throughput $v $i"
  $B/before/bench_throughput --operator $B/$v/fenced-lease-operator --raw-concurrency 64 --raw-seconds 3 \
    --rates 20 --log-dir $B/logs/tp-$v-$i --results $B/out/tp-$v-$i.tsv > $B/logs/tp-$v-$i.out 2>&1 || echo "FAILED tp $v $i"
done; done
for i in 1 2 3; do for v in after before; do
  echo "== $(date +%T) scale 1000 $v $i"
  $B/before/bench_scale --operator $B/$v/fenced-lease-operator --sizes 1000 --beat-rate 100 \
    --log-dir $B/logs/s1000-$v-$i --results $B/out/s1000-$v-$i.tsv > $B/logs/s1000-$v-$i.out 2>&1 || echo "FAILED s1000 $v $i"
done; done
for v in after before; do
  echo "== $(date +%T) scale 10000 $v"
  $B/before/bench_scale --operator $B/$v/fenced-lease-operator --sizes 10000 --beat-rate 150 --beat-seconds 10 \
    --log-dir $B/logs/s10000-$v --results $B/out/s10000-$v.tsv > $B/logs/s10000-$v.out 2>&1 || echo "FAILED s10000 $v"
done
echo "== $(date +%T) done"
