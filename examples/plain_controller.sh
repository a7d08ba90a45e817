#!/usr/bin/env bash
# A controller that knows nothing of fenced-lease: plain kubectl, no label, no token. Each
# round it records itself in ConfigMap `report`, scales Deployment `web` and writes the
# Deployment's status; on SIGTERM it writes a last status, as controllers do on the way out.
#
# Run two replicas, each in its own pod, under `kubectl fence run`, with a lease that fences
# these kinds (examples/plain-controller.yaml):
#
#   kubectl fence run plain-controller -- examples/plain_controller.sh
#
# and only the holder's writes are accepted: a replica that stalled past its lease is refused
# by the apiserver, whatever it writes, until `kubectl fence run` stops it.
#
# Every write is logged as `write N start`, then `write N accepted`, `write N refused: ...` or,
# when a signal ended kubectl, `write N stopped: ...`.
set -u
me=${POD_NAME:-$(hostname)}
stopping=
trap 'stopping=1' TERM INT
# kubectl's answer goes to a file, not into $(...): bash 5.2 can lose a trap whose signal
# arrives as a command substitution starts, and the loop would then never stop.
out=${TMPDIR:-/tmp}/plain-controller.$$
trap 'rm -f "$out"' EXIT

n=0
write() { # what, kubectl args...
  n=$((n + 1))
  local what=$1 rc=0
  shift
  echo "write $n start ($what)"
  kubectl "$@" >"$out" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "write $n accepted ($what)"
  elif [ "$rc" -gt 128 ]; then
    echo "write $n stopped ($what): kubectl ended by signal $((rc - 128))"
  else
    printf 'write %d refused (%s): ' "$n" "$what"
    cat "$out"
  fi
}

while [ -z "$stopping" ]; do
  write report patch configmap report --type=merge -p "{\"data\":{\"writer\":\"$me\",\"round\":\"$n\"}}"
  write scale scale deployment web --replicas=$((n % 3 + 1))
  write status patch deployment web --subresource=status --type=merge \
    -p "{\"status\":{\"observedGeneration\":$n}}"
  sleep 0.2 &
  wait $! # a signal ends the wait at once
done
write "last status" patch configmap report --type=merge -p "{\"data\":{\"writer\":\"$me\",\"state\":\"stopped\"}}"
