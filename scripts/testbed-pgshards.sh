#!/usr/bin/env bash
# Three PostgreSQL clusters on loopback as the shards of gpu-audit's sharded-store tests (docs/scale-out.md):
# Debian's postgresql-15 clusters made with pg_createcluster, each on its own port, each holding one database
# owned by a password-only role, so the tests exercise postgres_fdw user mappings with a real secret.
#
#   bash scripts/testbed-pgshards.sh up       # create (first time) and start the clusters, write the marker
#   bash scripts/testbed-pgshards.sh status   # exit 0 when all three answer and match the marker
#   bash scripts/testbed-pgshards.sh down     # stop the three clusters this script made (data kept)
#   bash scripts/testbed-pgshards.sh purge    # stop and drop them
#
# Clusters gpuaudit_shard1..3 on 127.0.0.1:15441..15443 (PGSHARD_PORT_BASE moves them), database
# gpu_audit_shard_test with the COMMENT below, role gpu_audit_shard whose password lies in $dir/password
# (mode 600). Shards 1 and 2 serve the tests; shard 3 is the one the outage test stops and starts again, so
# no other test uses it. The marker $dir/gpu-audit-testbed names ports, data directories, the database and
# the password file: the tests use a shard only when its data_directory and the database comment match it
# (tests/conftest.py, "Testbed identification"). Settings follow the main test server's (shared_buffers
# 128MB, autovacuum off), so a benchmark of shards against one server compares like with like.
set -euo pipefail

cmd=${1:-up}
root=${TESTBED_ROOT:-/var/lib/gpu-audit-testbed}
dir=$root/pgshards
base=${PGSHARD_PORT_BASE:-15440}
ver=${PGSHARD_VERSION:-15}
db=gpu_audit_shard_test
role=gpu_audit_shard
comment="gpu-audit shard test database (scripts/testbed-pgshards.sh)"  # tests/conftest.py PGSHARD_MARKER
names=(gpuaudit_shard1 gpuaudit_shard2 gpuaudit_shard3)

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=testbed-lib.sh
source "$here/testbed-lib.sh"

port_of() { echo $((base + ${1#gpuaudit_shard})); }
exists() { pg_lsclusters -h | awk '{print $2}' | grep -qx "$1"; }
online() { pg_lsclusters -h | awk -v n="$1" '$2 == n {print $4}' | grep -qx online; }
as_pg() { runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -p "$(port_of "$1")" -tA "${@:2}"; }

case $cmd in
  up) ;;
  down)
    for n in "${names[@]}"; do
      if exists "$n" && online "$n"; then pg_ctlcluster --skip-systemctl-redirect "$ver" "$n" stop; fi
    done
    echo "pgshards stopped (clusters kept; 'purge' drops them)"; exit 0 ;;
  purge)
    for n in "${names[@]}"; do
      if exists "$n"; then pg_dropcluster --stop "$ver" "$n"; fi
    done
    rm -rf "$dir"; echo "pgshards dropped"; exit 0 ;;
  status)
    marker=$dir/gpu-audit-testbed
    [[ -f $marker ]] || { echo "no marker $marker" >&2; exit 1; }
    for n in "${names[@]}"; do
      online "$n" || { echo "$n: not online" >&2; exit 1; }
      got=$(as_pg "$n" -d "$db" -c "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = current_database()")
      [[ $got == "$comment" ]] || { echo "$n: database $db missing or unmarked" >&2; exit 1; }
    done
    echo "pgshards: ${names[*]} online on ports $(port_of 1),$(port_of 2),$(port_of 3)"; exit 0 ;;
  *) echo "usage: $0 up|down|status|purge" >&2; exit 2 ;;
esac

command -v pg_createcluster >/dev/null || { echo "pg_createcluster missing (apt-get install postgresql-common)" >&2; exit 1; }
ls "/usr/share/postgresql/$ver/extension/postgres_fdw.control" >/dev/null \
  || { echo "postgres_fdw missing from postgresql-$ver" >&2; exit 1; }
mkdir -p "$dir"
chmod 700 "$dir"
if [[ ! -s $dir/password ]]; then
  (umask 077; python3 -c 'import secrets; print(secrets.token_urlsafe(24))' > "$dir/password")
fi
pw=$(cat "$dir/password")
datadirs=()
for n in "${names[@]}"; do
  port=$(port_of "$n")
  if ! exists "$n"; then
    pg_createcluster "$ver" "$n" --port "$port" -- --auth-local=peer --auth-host=scram-sha-256 >/dev/null
    conf=/etc/postgresql/$ver/$n/conf.d/gpu-audit-testbed.conf
    printf '%s\n' "# written by scripts/testbed-pgshards.sh" "listen_addresses = '127.0.0.1'" \
      "shared_buffers = 128MB" "autovacuum = off" "max_connections = 100" > "$conf"
  fi
  online "$n" || pg_ctlcluster --skip-systemctl-redirect "$ver" "$n" start
  for _ in $(seq 60); do pg_isready -q -h 127.0.0.1 -p "$port" && break; sleep 0.5; done
  as_pg "$n" -d postgres -c "DO \$\$BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$role') THEN
      CREATE ROLE $role LOGIN; END IF; END\$\$"
  # the password on psql's standard input, not its command line (which every user can read)
  printf "ALTER ROLE %s PASSWORD '%s';\n" "$role" "$pw" | as_pg "$n" -d postgres
  as_pg "$n" -d postgres -c "SET client_min_messages = warning" -c "GRANT pg_read_all_settings TO $role"
  if [[ $(as_pg "$n" -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$db'") != 1 ]]; then
    as_pg "$n" -d postgres -c "CREATE DATABASE $db OWNER $role"
  fi
  as_pg "$n" -d postgres -c "COMMENT ON DATABASE $db IS '$comment'"
  datadirs+=("$(as_pg "$n" -d postgres -c 'SHOW data_directory')")
done
tb_marker "$dir/gpu-audit-testbed" "kind=pgshards" "host=127.0.0.1" \
  "ports=$(port_of 1),$(port_of 2),$(port_of 3)" "clusters=$(IFS=,; echo "${names[*]}")" \
  "data=$(IFS=,; echo "${datadirs[*]}")" "database=$db" "user=$role" "password_file=$dir/password" \
  "version=$ver"
echo "pgshards up: ${names[*]} on 127.0.0.1:$(port_of 1),$(port_of 2),$(port_of 3) (database $db)"
