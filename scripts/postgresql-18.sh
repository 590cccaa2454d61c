# Sourced by setup.sh when PostgreSQL 18 is wanted: Debian 12 ships only PostgreSQL 15, so this
# builds 18 once from Debian's source package (suite sid) into PG18_PREFIX, and reuses it after.
# The source is fetched with a private apt configuration; the machine's own sources stay as they are.

PG18_PREFIX=${PG18_PREFIX:-/opt/postgresql-18}

build_postgresql_18() {
    # Written last: a build that stopped halfway is built again.
    [ -f "$PG18_PREFIX/.built-by-snowid" ] && return 0
    echo "==> building PostgreSQL 18 from Debian's source package into $PG18_PREFIX (about 3 minutes, once)"
    (
        work=$(mktemp -d)
        trap 'rm -rf "$work"' EXIT
        mkdir -p "$work/state/lists/partial" "$work/cache/archives/partial"
        echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main" \
            >"$work/sources.list"
        apt_options=(
            -o "Dir::Etc::sourcelist=$work/sources.list" -o Dir::Etc::sourceparts=/nonexistent
            -o "Dir::State=$work/state" -o "Dir::Cache=$work/cache" -o APT::Sandbox::User=root
        )
        cd "$work"
        apt-get "${apt_options[@]}" -qq update
        apt-get "${apt_options[@]}" -qq source --download-only postgresql-18 >/dev/null
        tar xf postgresql-18_*.orig.tar.*
        cd postgresql-18.*/
        # With OpenSSL, as every distribution builds it: gen_random_uuid() and uuidv7() draw from it.
        ./configure --prefix="$PG18_PREFIX" --with-openssl --with-icu --without-readline >/dev/null
        make -s -j"$(nproc)" >/dev/null
        as_root make -s install >/dev/null
        as_root touch "$PG18_PREFIX/.built-by-snowid"
    )
}
