#!/usr/bin/env bash
# A real Prometheus for the tests: Debian's package, backfilled with generated DCGM-shaped OpenMetrics.
#
#   scripts/testbed-prometheus.sh up [test|bench|jobstats|rules]    install, generate, backfill, start, wait until ready
#   scripts/testbed-prometheus.sh down [test|bench|jobstats|rules]  stop the instance this script started
# A second `up` reuses the backfilled data (set TESTBED_FRESH=1 to generate and backfill it again).
#
# test  : 127.0.0.1:19090, 6 h of 30 s samples from 3 days ago (see scripts/gen_dcgm_openmetrics.py)
# bench : 127.0.0.1:19091, BENCH_GPUS GPUs (default 1024) x 7 days x 8 metrics, one sample per
#         BENCH_INTERVAL s (default 300: 1024 x 7 d of 30 s samples is 165 M samples, too much to backfill
#         on a 2-core CI machine; the 5-min buckets the benchmark pulls are the same size either way).
# jobstats : 127.0.0.1:19092, 6 h of 30 s samples from 3 days ago under Princeton jobstats' exporter names
#         (nvidia_gpu_duty_cycle, ..._milliwatts, nvidia_gpu_jobId as the job); see the generator.
# rules : 127.0.0.1:19094, the `test` profile's samples (the test testbed's start time when it exists) plus the
#         recorded series of deploy/prometheus-recording-rules.yml, backfilled with
#         `promtool tsdb create-blocks-from rules` from hour 1 on (as if installed then: the first 55 min
#         have raw series only), evaluated off the 5-minute grid as a live Prometheus's hashed evaluation
#         phase would be. Its own instance and data dir: the other profiles are not touched.
# The packaged prometheus service is not used (nothing here starts it); ours runs from its own data dir
# under $TESTBED_ROOT (default /var/lib/gpu-audit-testbed) with 100 years of retention. The marker file
# $TESTBED_ROOT/<profile>/gpu-audit-testbed names its URL and TSDB path: the tests use a Prometheus only when it
# reports that TSDB path (/api/v1/status/flags) and the marker is there (tests/conftest.py).
set -euo pipefail

cmd=${1:-up}
profile=${2:-test}
root=${TESTBED_ROOT:-/var/lib/gpu-audit-testbed}
here=$(cd "$(dirname "$0")" && pwd)
case $profile in
  test) port=19090 ;;
  bench) port=19091 ;;
  jobstats) port=19092 ;;
  rules) port=19094 ;;
  *) echo "unknown profile $profile (test|bench|jobstats|rules)" >&2; exit 2 ;;
esac
dir=$root/$profile
url=http://127.0.0.1:$port

# shellcheck source=testbed-lib.sh
source "$here/testbed-lib.sh"
stop() { tb_stop "$dir/prometheus.pid"; }
ready() { tb_ready "$url/-/ready"; }

if [[ $cmd == down ]]; then stop; echo "prometheus ($profile) stopped"; exit 0; fi
if [[ $cmd != up ]]; then echo "usage: $0 up|down [test|bench|jobstats|rules]" >&2; exit 2; fi

if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends prometheus
fi

marker() { tb_marker "$dir/gpu-audit-testbed" "kind=prometheus" "profile=$profile" "url=$url" "tsdb=$dir/tsdb"; }

if [[ -z ${TESTBED_FRESH:-} && -f $dir/prometheus.pid ]] && kill -0 "$(cat "$dir/prometheus.pid")" 2>/dev/null \
   && ready; then
  marker
  echo "prometheus ($profile) already up at $url (data $dir)"; exit 0
fi
stop
if [[ -f $dir/state.json && -f $dir/backfilled && -z ${TESTBED_FRESH:-} ]]; then
  echo "reusing the backfilled data in $dir (TESTBED_FRESH=1 regenerates it)"
else
  rm -rf "$dir"
  mkdir -p "$dir/tsdb"
  if [[ $profile == rules ]]; then
    start_args=()
    if [[ -f $root/test/state.json ]]; then  # the same samples as the test testbed
      start_args=(--start "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["start"])' \
        "$root/test/state.json")")
    fi
    python3 "$here/gen_dcgm_openmetrics.py" --out "$dir" --profile test --hours 6 --interval 30 "${start_args[@]}"
  elif [[ $profile == test || $profile == jobstats ]]; then
    python3 "$here/gen_dcgm_openmetrics.py" --out "$dir" --profile "$profile" --hours 6 --interval 30
  else
    now=$(date +%s)
    start=$(( (now - 8 * 86400) / 86400 * 86400 ))
    python3 "$here/gen_dcgm_openmetrics.py" --out "$dir" --profile bench --start "$start" --hours 168 \
      --interval "${BENCH_INTERVAL:-300}" --gpus "${BENCH_GPUS:-1024}"
  fi
  promtool tsdb create-blocks-from openmetrics --max-block-duration=24h "$dir/data.om" "$dir/tsdb" \
    > "$dir/promtool.log" 2>&1 || { tail -20 "$dir/promtool.log" >&2; exit 1; }
  rm -f "$dir/data.om"
  [[ $profile == rules ]] || touch "$dir/backfilled"
fi

cat > "$dir/prometheus.yml" <<EOF
global:
  scrape_interval: 1h
scrape_configs: []
EOF
nohup prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
  --storage.tsdb.retention.time=100y --web.listen-address="127.0.0.1:$port" \
  --query.max-samples=100000000 > "$dir/prometheus.log" 2>&1 &
echo $! > "$dir/prometheus.pid"

tb_wait "prometheus ($profile)" "$dir/prometheus.pid" "$dir/prometheus.log" "$url/-/ready" || exit 1
if [[ $profile == rules && ! -f $dir/backfilled ]]; then
  # The recording rules evaluated by promtool against this instance's raw samples, written as blocks, moved
  # into its TSDB and picked up by a restart.
  read -r t0 t1 < <(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); a=s["start"] // 300 * 300
print(a + 3600 + 137, a + int(s["hours"] * 3600) + 900)' "$dir/state.json")
  rm -rf "$dir/rule-blocks"
  promtool tsdb create-blocks-from rules --url="$url" --start="$t0" --end="$t1" --output-dir="$dir/rule-blocks" \
    "$here/../deploy/prometheus-recording-rules.yml" > "$dir/promtool-rules.log" 2>&1 \
    || { tail -20 "$dir/promtool-rules.log" >&2; stop; exit 1; }
  stop
  mv "$dir"/rule-blocks/*/ "$dir/tsdb/"
  rm -rf "$dir/rule-blocks"
  touch "$dir/backfilled"
  nohup prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
    --storage.tsdb.retention.time=100y --web.listen-address="127.0.0.1:$port" \
    --query.max-samples=100000000 > "$dir/prometheus.log" 2>&1 &
  echo $! > "$dir/prometheus.pid"
  tb_wait "prometheus ($profile)" "$dir/prometheus.pid" "$dir/prometheus.log" "$url/-/ready" || exit 1
fi
marker
echo "prometheus ($profile) ready at $url (data $dir)"
