#!/usr/bin/env bash
# A real VictoriaMetrics (single node, Debian's package `victoria-metrics`) as a second TSDB for the tests,
# holding the same generated DCGM-shaped data as the Prometheus testbed (scripts/testbed-prometheus.sh).
#
#   scripts/testbed-victoriametrics.sh up [rules]    install, generate, import, start, wait until ready
#   scripts/testbed-victoriametrics.sh down [rules]  stop the instance this script started
#
# 127.0.0.1:19093 (its own port: Prometheus testbeds are on 19090-19092 and are not touched). Data: the
# `test` profile of scripts/gen_dcgm_openmetrics.py, with the Prometheus testbed's start time when that
# testbed exists ($TESTBED_ROOT/test/state.json), so both TSDBs hold the same samples. VictoriaMetrics has no
# promtool backfill: the OpenMetrics text (seconds timestamps) is rewritten to Prometheus exposition
# (millisecond timestamps) and POSTed to /api/v1/import/prometheus, then /internal/force_flush makes it
# searchable. The packaged victoria-metrics service is not used; ours runs from $TESTBED_ROOT/victoriametrics.
# The marker $TESTBED_ROOT/victoriametrics/gpu-audit-testbed names its URL and data path: the tests use a
# VictoriaMetrics only when its /flags report that -storageDataPath and the marker is there (tests/conftest.py).
#
# `up rules`: a second, separate instance on 127.0.0.1:19095 (data $TESTBED_ROOT/victoriametrics-rules) with the
# same samples plus the recorded series of deploy/prometheus-recording-rules.yml, computed by Debian's vmalert
# in replay mode (-replay.timeFrom/-replay.timeTo: the rules evaluated over the past window through the
# instance's query API, written back with remote write), from hour 1 on and off the 5-minute grid, as
# scripts/testbed-prometheus.sh's `rules` profile does. The default instance is not touched.
set -euo pipefail

cmd=${1:-up}
profile=${2:-default}
root=${TESTBED_ROOT:-/var/lib/gpu-audit-testbed}
here=$(cd "$(dirname "$0")" && pwd)
case $profile in
  default) port=${VM_PORT:-19093}; dir=$root/victoriametrics ;;
  rules) port=${VM_RULES_PORT:-19095}; dir=$root/victoriametrics-rules ;;
  *) echo "unknown profile $profile (default|rules)" >&2; exit 2 ;;
esac
url=http://127.0.0.1:$port

# shellcheck source=testbed-lib.sh
source "$here/testbed-lib.sh"
stop() { tb_stop "$dir/vm.pid"; }
ready() { tb_ready "$url/health"; }

if [[ $cmd == down ]]; then stop; echo "victoria-metrics ($profile) stopped"; exit 0; fi
if [[ $cmd != up ]]; then echo "usage: $0 up|down [rules]" >&2; exit 2; fi

if ! command -v victoria-metrics >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends \
    victoria-metrics
fi

marker() {
  if [[ $profile == rules ]]; then
    tb_marker "$dir/gpu-audit-testbed" "kind=victoriametrics" "profile=rules" "url=$url" "data=$dir/data"
  else
    tb_marker "$dir/gpu-audit-testbed" "kind=victoriametrics" "url=$url" "data=$dir/data"
  fi
}

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
  if [[ $profile == rules ]]; then
    read -r t0 t1 < <(python3 -c 'import json,sys,datetime as d; s=json.load(open(sys.argv[1])); a=s["start"] // 300 * 300
f=lambda t: d.datetime.fromtimestamp(t, d.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
print(f(a + 3600 + 137), f(a + int(s["hours"] * 3600) + 900))' "$dir/state.json")
    vmalert -rule="$here/../deploy/prometheus-recording-rules.yml" -datasource.url="$url" \
      -remoteWrite.url="$url" -replay.timeFrom="$t0" -replay.timeTo="$t1" -replay.rulesDelay=0s \
      -replay.disableProgressBar -httpListenAddr=127.0.0.1:0 > "$dir/vmalert.log" 2>&1 \
      || { tail -20 "$dir/vmalert.log" >&2; stop; exit 1; }
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=60).read()' \
      "$url/internal/force_flush"
  fi
  touch "$dir/imported"
fi
marker
echo "victoria-metrics ($profile) ready at $url (data $dir)"
