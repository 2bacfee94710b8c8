# Shared by the TSDB testbed scripts (testbed-prometheus.sh, testbed-victoriametrics.sh); source it, don't run it.
# One copy of "stop the daemon we started", "is it ready" and "start it and wait", so both testbeds behave alike.

# tb_stop PIDFILE: stop the daemon whose pid is in PIDFILE (if it still runs) and wait up to 20 s for it to exit.
tb_stop() {
  local pidfile=$1 pid
  [[ -f $pidfile ]] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  fi
  rm -f "$pidfile"
}

# tb_ready URL: exit status 0 when URL answers HTTP 200 within 2 s.
tb_ready() { python3 - "$1" <<'PY'
import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=2).status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

# tb_wait NAME PIDFILE LOG READY_URL: wait up to 60 s until READY_URL answers; on failure (the daemon died or
# never became ready) print the last log lines, stop it and return 1.
tb_wait() {
  local name=$1 pidfile=$2 logfile=$3 url=$4
  for _ in $(seq 120); do
    tb_ready "$url" && return 0
    kill -0 "$(cat "$pidfile")" 2>/dev/null || break
    sleep 0.5
  done
  echo "$name did not become ready; last log lines:" >&2
  tail -20 "$logfile" >&2
  tb_stop "$pidfile"
  return 1
}

# tb_marker FILE KEY=VALUE...: write the marker the tests identify a testbed by (tests/conftest.py, section
# "Testbed identification"): they use a live service only when it is the one this file describes, never
# whatever answers on the port. Written atomically; rewriting it with the same values is a no-op in effect.
tb_marker() {
  local file=$1; shift
  mkdir -p "$(dirname "$file")"
  { echo "# gpu-audit testbed marker, written by scripts/$(basename "$0"); tests/conftest.py reads it"
    printf '%s\n' "$@"; } >"$file.tmp"
  mv -f "$file.tmp" "$file"
}
