# Shared settings for pgkvx's scripts; sourced, never run.
# Every value can be overridden from the environment, so that two checkouts
# (or two developers) can run side by side with their own cluster and even
# their own copy of PostgreSQL.
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PG_BINDIR=$("$PG_CONFIG" --bindir)
PG_PKGLIBDIR=$("$PG_CONFIG" --pkglibdir)
PG_PGXS_TEST="$PG_PKGLIBDIR/pgxs/src/test"
PGKVX_PORT=${PGKVX_PORT:-55432}
PGKVX_CLUSTER=${PGKVX_CLUSTER:-/tmp/pgkvx-cluster-$PGKVX_PORT}
PGKVX_DATA="$PGKVX_CLUSTER/data"
PGKVX_SOCK="$PGKVX_CLUSTER/sock"
PGKVX_LOG="$PGKVX_CLUSTER/server.log"
PGKVX_VENV=${PGKVX_VENV:-/var/tmp/pgkvx-venv}
# What the scratch cluster preloads; empty proves the refusal without it.
PGKVX_PRELOAD=${PGKVX_PRELOAD-pgkvx}
# Extra postgresql.conf lines for a new scratch cluster (tests use it for
# small limits), e.g. PGKVX_EXTRA_CONF='pgkvx.max_latches = 64'.
PGKVX_EXTRA_CONF=${PGKVX_EXTRA_CONF:-}
PGKVX_PGRX_DATA=${PGKVX_PGRX_DATA:-/tmp/pgkvx-pgrx-data}
# The OS user the server runs as: Postgres refuses to run as root.
PGKVX_OS_USER=${PGKVX_OS_USER:-postgres}
export PG_CONFIG PGKVX_PORT PGKVX_CLUSTER PGKVX_SOCK PGKVX_VENV
# libpq defaults for every client we start (psql, pg_regress, pytest, pgbench).
export PGHOST="$PGKVX_SOCK" PGPORT="$PGKVX_PORT" PGUSER=postgres

# Run a command as the server's OS user (no-op wrapper when we already are).
as_pg() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u "$PGKVX_OS_USER" -- "$@"
    else
        "$@"
    fi
}
