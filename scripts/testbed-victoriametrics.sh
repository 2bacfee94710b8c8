#!/usr/bin/env bash
# A real VictoriaMetrics (single node, Debian's package `victoria-metrics`) as a second TSDB for the tests,
# holding the same generated DCGM-shaped data as the Prometheus testbed (scripts/testbed-prometheus.sh).
#
#   scripts/testbed-victoriametrics.sh up     install, generate, import, start, wait until ready
#   scripts/testbed-victoriametrics.sh down   stop the instance this script started
#
# 127.0.0.1:19093 (its own port: Prometheus testbeds are on 19090-19092 and are not touched). Data: the
# `test` profile of scripts/gen_dcgm_openmetrics.py, with the Prometheus testbed's start time when that
# testbed exists ($TESTBED_ROOT/test/state.json), so both TSDBs hold the same samples. VictoriaMetrics has no
# promtool backfill: the OpenMetrics text (seconds timestamps) is rewritten to Prometheus exposition
# (millisecond timestamps) and POSTed to /api/v1/import/prometheus, then /internal/force_flush makes it
# searchable. The packaged victoria-metrics service is not used; ours runs from $TESTBED_ROOT/victoriametrics.
# The marker $TESTBED_ROOT/victoriametrics/gpu-audit-testbed names its URL and data path: the tests use a
# VictoriaMetrics only when its /flags report that -storageDataPath and the marker is there (tests/conftest.py).
set -euo pipefail

cmd=${1:-up}
root=${TESTBED_ROOT:-/var/lib/gpu-audit-testbed}
here=$(cd "$(dirname "$0")" && pwd)
port=${VM_PORT:-19093}
dir=$root/victoriametrics
url=http://127.0.0.1:$port

# shellcheck source=testbed-lib.sh
source "$here/testbed-lib.sh"
stop() { tb_stop "$dir/vm.pid"; }
ready() { tb_ready "$url/health"; }

if [[ $cmd == down ]]; then stop; echo "victoria-metrics stopped"; exit 0; fi
if [[ $cmd != up ]]; then echo "usage: $0 up|down" >&2; exit 2; fi

if ! command -v victoria-metrics >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends \
    victoria-metrics
fi

marker() { tb_marker "$dir/gpu-audit-testbed" "kind=victoriametrics" "url=$url" "data=$dir/data"; }

if [[ -z ${TESTBED_FRESH:-} && -f $dir/vm.pid ]] && kill -0 "$(cat "$dir/vm.pid")" 2>/dev/null && ready; then
  marker
  echo "victoria-metrics already up at $url (data $dir)"; exit 0
fi
stop
fresh=0
if [[ ! -f $dir/imported || -n ${TESTBED_FRESH:-} ]]; then
  rm -rf "$dir"
  mkdir -p "$dir/data"
  start_args=()
  if [[ -f $root/test/state.json ]]; then
    start_args=(--start "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["start"])' \
      "$root/test/state.json")")
  fi
  python3 "$here/gen_dcgm_openmetrics.py" --out "$dir" --profile test --hours 6 --interval 30 "${start_args[@]}"
  fresh=1
fi

nohup victoria-metrics -httpListenAddr="127.0.0.1:$port" -storageDataPath="$dir/data" -retentionPeriod=100y \
  -search.latencyOffset=0s -search.disableCache > "$dir/vm.log" 2>&1 &
echo $! > "$dir/vm.pid"
tb_wait victoria-metrics "$dir/vm.pid" "$dir/vm.log" "$url/health" || exit 1

if [[ $fresh == 1 ]]; then
  python3 - "$url" "$dir/data.om" <<'EOF'
import sys, urllib.request
url, path = sys.argv[1], sys.argv[2]
def post(lines):
    req = urllib.request.Request(url + "/api/v1/import/prometheus", data="".join(lines).encode(), method="POST")
    urllib.request.urlopen(req, timeout=120).read()
batch, n = [], 0
with open(path, encoding="utf-8") as fh:
    for line in fh:
        if line.startswith("#") or not line.strip():
            continue
        head, value, ts = line.rsplit(" ", 2)
        batch.append(f"{head} {value} {int(ts) * 1000}\n")  # exposition format: milliseconds
        if len(batch) >= 50_000:
            post(batch); n += len(batch); batch = []
if batch:
    post(batch); n += len(batch)
urllib.request.urlopen(url + "/internal/force_flush", timeout=60).read()
print(f"imported {n} samples")
EOF
  rm -f "$dir/data.om"
  touch "$dir/imported"
fi
marker
echo "victoria-metrics ready at $url (data $dir)"
