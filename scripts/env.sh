# Shared settings for pgkvx's scripts; sourced, never run.
# Every value can be overridden from the environment, so that two checkouts
# (or two developers) can run side by side with their own cluster and even
# their own copy of PostgreSQL.
PGKVX_PORT=${PGKVX_PORT:-55432}
# The system's PostgreSQL: only `make install` (scripts/install with
# PG_CONFIG set to it) ever writes there.
PGKVX_SYSTEM_PG_CONFIG=${PGKVX_SYSTEM_PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
# Everything else -- builds, tests, the demo, benchmarks -- installs into
# and runs from a private copy of it (scripts/pgtree), one per port.
PGKVX_TREE=${PGKVX_TREE:-/var/tmp/pgkvx-pg15-$PGKVX_PORT}
_sys_bindir=$("$PGKVX_SYSTEM_PG_CONFIG" --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
_sys_pkglibdir=$("$PGKVX_SYSTEM_PG_CONFIG" --pkglibdir 2>/dev/null || echo /usr/lib/postgresql/15/lib)
PGKVX_TREE_PG_CONFIG="$PGKVX_TREE$_sys_bindir/pg_config"
PG_CONFIG=${PG_CONFIG:-$PGKVX_TREE_PG_CONFIG}
if [ "$PG_CONFIG" = "$PGKVX_TREE_PG_CONFIG" ]; then
    # Known before the tree is made (scripts/pgtree makes it).
    PG_BINDIR="$PGKVX_TREE$_sys_bindir"
    PG_PKGLIBDIR="$PGKVX_TREE$_sys_pkglibdir"
else
    PG_BINDIR=$("$PG_CONFIG" --bindir)
    PG_PKGLIBDIR=$("$PG_CONFIG" --pkglibdir)
fi
PG_PGXS_TEST="$PG_PKGLIBDIR/pgxs/src/test"
# cargo-pgrx's configuration (which pg_config bindgen reads) for this tree.
PGRX_HOME=${PGKVX_PGRX_HOME:-$PGKVX_TREE/pgrx}
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
PGKVX_PGRX_DATA=${PGKVX_PGRX_DATA:-/tmp/pgkvx-pgrx-data-$PGKVX_PORT}
# The OS user the server runs as: Postgres refuses to run as root.
PGKVX_OS_USER=${PGKVX_OS_USER:-postgres}
export PG_CONFIG PGKVX_PORT PGKVX_CLUSTER PGKVX_SOCK PGKVX_VENV PGKVX_TREE PGKVX_SYSTEM_PG_CONFIG PGRX_HOME
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

_pgkvx_scripts=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Makes (or checks) the private PostgreSQL tree when that is what we use.
ensure_tree() {
    if [ "$PG_CONFIG" = "$PGKVX_TREE_PG_CONFIG" ]; then
        "$_pgkvx_scripts/pgtree"
    fi
}

# The first port from $1 up that nothing listens on (TCP on loopback, or a
# socket in /tmp): tests and helpers never assume a port is free.
free_port() {
    local p=$1
    while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || [ -e "/tmp/.s.PGSQL.$p" ]; do
        p=$((p + 1))
    done
    echo "$p"
}
