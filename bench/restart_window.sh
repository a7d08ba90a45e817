#!/usr/bin/env bash
# The restart window (issue 55, item 4): after a restart of the apiserver (or etcd), how long
# from the apiserver's readiness (/readyz, as a client sees it) until a write to a fenced object
# is admitted again, beside the same for a write no fence policy matches (the peer: what any
# write waits for). While the apiserver cannot resolve the lease policy's params kind
# (kubernetes#124237) it refuses fenced writes with `failed to configure policy`.
#
#   bench/restart_window.sh [apiserver|etcd] [RESTARTS]     # default: apiserver 20
#
# Runs on a control plane of its own (FL_CP_DIR, default ${TMPDIR:-/tmp}/fenced-lease-restart-window),
# started fresh and stopped at the end; probes are server-side dry runs (they go through
# admission and write nothing) every 100 ms. Prints one line per restart, then the median, p99
# and worst of each; keeps the log in $BENCH_OUT (default the run directory).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-apiserver}; n=${2:-20}
case $what in apiserver|etcd) ;; *) echo "usage: $0 [apiserver|etcd] [RESTARTS]" >&2; exit 2 ;; esac
export FL_CP_DIR=${FL_CP_DIR:-${TMPDIR:-/tmp}/fenced-lease-restart-window}
out=${BENCH_OUT:-$FL_CP_DIR-out}
mkdir -p "$out"
hack/control-plane down >/dev/null 2>&1 || true
eval "$(hack/control-plane up 2>/dev/null)"
trap 'hack/control-plane down >/dev/null 2>&1 || true' EXIT
K=$(hack/control-plane bin-dir)/kubectl
hack/crds install >/dev/null
ns=restart-window
$K create namespace $ns >/dev/null
$K apply -f - >/dev/null <<YAML
apiVersion: fencing.dev/v1alpha1
kind: FencedLease
metadata: {name: books, namespace: $ns}
spec: {leaseDurationSeconds: 5, fenceObjects: true}
YAML
cat > "$out/fenced.yaml" <<YAML
apiVersion: v1
kind: ConfigMap
metadata: {name: ledger, namespace: $ns, labels: {fencing.dev/lease: books}, annotations: {fencing.dev/token: "1"}}
data: {x: "0"}
YAML
cat > "$out/plain.yaml" <<YAML
apiVersion: v1
kind: ConfigMap
metadata: {name: plain, namespace: $ns}
data: {x: "0"}
YAML
for f in fenced plain; do
  until $K apply -f "$out/$f.yaml" >/dev/null 2>&1; do sleep 0.5; done
done
now() { date +%s%N; }
admitted() { $K --request-timeout=5s apply --dry-run=server -f "$1" >/dev/null 2>"$out/last-refusal"; }
log=$out/restart-window-$what.tsv
printf 'restart\tto_ready_ms\tfenced_ms\tplain_ms\n' > "$log"
for i in $(seq 1 "$n"); do
  t0=$(now)
  hack/control-plane "restart-$what" >/dev/null 2>&1
  until $K --request-timeout=2s get --raw /readyz >/dev/null 2>&1; do sleep 0.1; done
  ready=$(now); fenced=""; plain=""
  # Each probe takes a round trip, so the one sent second waits for the first: the order
  # alternates from one restart to the next.
  while [ -z "$fenced" ] || [ -z "$plain" ]; do
    if (( i % 2 )); then
      [ -n "$fenced" ] || { admitted "$out/fenced.yaml" && fenced=$(now); } || true
      [ -n "$plain" ] || { admitted "$out/plain.yaml" && plain=$(now); } || true
    else
      [ -n "$plain" ] || { admitted "$out/plain.yaml" && plain=$(now); } || true
      [ -n "$fenced" ] || { admitted "$out/fenced.yaml" && fenced=$(now); } || true
    fi
    if [ $(( ($(now) - ready) / 1000000000 )) -gt 300 ]; then echo "restart $i: no admitted write within 300 s" >&2; exit 1; fi
    [ -n "$fenced" ] && [ -n "$plain" ] || sleep 0.1
  done
  row=$(printf '%d\t%d\t%d\t%d' "$i" $(( (ready - t0) / 1000000 )) $(( (fenced - ready) / 1000000 )) $(( (plain - ready) / 1000000 )))
  echo "$row" >> "$log"
  echo "restart-$what $row" | awk -F'\t' '{printf "%s: ready after %.1f s; then a fenced write admitted after %d ms, a plain one after %d ms\n", $1, $2/1000, $3, $4}'
done
# median, p99 and worst of a column (nearest rank)
stats() {
  tail -n +2 "$log" | cut -f"$1" | sort -n | awk '{v[NR]=$1} END {p99=int(NR*0.99+0.999); if (p99<1) p99=1; printf "median %d ms, p99 %d ms, worst %d ms (n=%d)", v[int((NR+1)/2)], v[p99], v[NR], NR}'
}
echo "restart-$what, from the apiserver's readiness to the first admitted write:"
echo "  fenced (the lease policy, params kind FencedLease): $(stats 3)"
echo "  plain (no fence policy matches; the peer):          $(stats 4)"
echo "  within 30 s: $(tail -n +2 "$log" | awk -F'\t' '$3 <= 30000' | wc -l) of $n restarts; log: $log"
