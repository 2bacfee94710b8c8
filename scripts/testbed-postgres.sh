#!/usr/bin/env bash
# The PostgreSQL database of gpu-audit's tests: a dedicated database (default gpu_audit_test) on an already
# running server, carrying a COMMENT the tests identify it by (tests/conftest.py, "Testbed identification").
# The tests never use another database, so no fixture can empty tables of a database it did not create.
#
#   bash scripts/testbed-postgres.sh up       # create the database and its marker comment (idempotent)
#   bash scripts/testbed-postgres.sh status   # exit 0 when the database exists with the marker
#   bash scripts/testbed-postgres.sh down     # nothing to stop: the database is kept (drop it by hand)
#
# PGHOST/PGPORT/PGUSER select the server and a role allowed to create databases (default 127.0.0.1:5432,
# postgres); GPU_AUDIT_TEST_PG_DB the name.
set -euo pipefail
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
DB=${GPU_AUDIT_TEST_PG_DB:-gpu_audit_test}
COMMENT="gpu-audit test database (scripts/testbed-postgres.sh)"  # tests/conftest.py PG_MARKER

[[ $DB =~ ^[a-z_][a-z0-9_]*$ ]] || { echo "database name $DB: only [a-z0-9_]" >&2; exit 2; }
psql_admin() { psql -X -q -v ON_ERROR_STOP=1 -d postgres -tA "$@"; }

case "${1:-}" in
  up)
    if [[ $(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = '$DB'") != 1 ]]; then
      psql_admin -c "CREATE DATABASE \"$DB\""
      echo "created database $DB on $PGHOST:$PGPORT"
    fi
    psql_admin -c "COMMENT ON DATABASE \"$DB\" IS '$COMMENT'"
    echo "database $DB on $PGHOST:$PGPORT marked as gpu-audit's test database" ;;
  status)
    got=$(psql_admin -c "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = '$DB'")
    [[ $got == "$COMMENT" ]] && echo "database $DB: marked" || { echo "database $DB: missing or unmarked" >&2; exit 1; } ;;
  down) echo "database $DB kept (nothing to stop)" ;;
  *) echo "usage: $0 up|status|down" >&2; exit 2 ;;
esac
