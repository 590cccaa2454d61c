# Sourced by setup.sh. No Debian suite the machine reaches has PostgreSQL 16, and upstream's source
# is out of reach; PyPI's pgserver wheel carries a whole PostgreSQL 16.2 build (programs, libraries,
# share files and server headers), built without OpenSSL. It is fetched with pip (its index and proxy
# settings), checked against the SHA-256 pinned here, and unpacked once into /opt/postgresql-16 as
# the wheel lays it out, which its programs' library paths count on.
#
# snowid links the libpq in the server's library directory, and a preloaded library's libpq is the
# one the whole server process uses, its walreceiver's included: it must speak TLS (for a registry)
# and know every option that 16's walreceiver passes. The wheel's speaks no TLS, and Debian 12's
# libpq5 (15) rejects sslcertmode, which 16's walreceiver passes; the libpq of the PostgreSQL 17
# built from source (postgresql-source.sh) does both, so it takes the wheel's libpq's place there.
# The wheel's own programs use a renamed copy of theirs, and keep it.

# wheel_of MAJOR: the pinned pgserver version, the wheel's file name and its SHA-256.
wheel_of() {
    case $1 in
    16) echo "0.1.4 pgserver-0.1.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl d595789b47624a3d963aa9aa6359da9be31beb7e61f1a45541953242068b8813" ;;
    *) echo "no PostgreSQL $1 wheel is pinned" >&2; return 1 ;;
    esac
}

wheel_prefix_of() { echo "/opt/postgresql-$1"; }
# The major whose libpq the wheel of MAJOR gets (see above).
libpq_major_of() { echo 17; }
wheel_marker() { echo "$(wheel_prefix_of "$1")/.unpacked-by-snowid"; }
wheel_pg_config() { echo "$(wheel_prefix_of "$1")/pgserver/pginstall/bin/pg_config"; }

# install_wheel_postgresql MAJOR: the pinned wheel unpacked into its prefix, unless it is there.
install_wheel_postgresql() {
    local major=$1 pinned version file sha256 prefix libpq
    build_postgresql "$(libpq_major_of "$major")"
    libpq=$(source_prefix_of "$(libpq_major_of "$major")")/lib/libpq.so.5
    read -r version file sha256 <<<"$(wheel_of "$major")"
    pinned="$version $file $sha256 $libpq"
    prefix=$(wheel_prefix_of "$major")
    [ "$(cat "$(wheel_marker "$major")" 2>/dev/null)" = "$pinned" ] && return 0
    echo "==> unpacking PostgreSQL $major from PyPI's pgserver $version wheel into $prefix (once)"
    (
        work=$(mktemp -d)
        trap 'rm -rf "$work"' EXIT
        python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
            --platform manylinux2014_x86_64 --dest "$work" "pgserver==$version"
        echo "$sha256  $work/$file" | sha256sum --check --quiet || {
            echo "pgserver $version's wheel does not have the SHA-256 pinned in scripts/postgresql-wheel.sh" >&2
            exit 1
        }
        as_root rm -rf "$prefix"
        # A wheel is a zip archive that records each file's mode, which Python's zipfile module
        # reads but does not apply.
        as_root python3 - "$work/$file" "$prefix" <<'PYTHON'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for member in wheel.infolist():
        path = wheel.extract(member, sys.argv[2])
        mode = member.external_attr >> 16
        if mode and not member.is_dir():
            os.chmod(path, mode & 0o777)
PYTHON
        local lib="$prefix/pgserver/pginstall/lib"
        as_root rm -f "$lib"/libpq.so* "$lib/libpq.a"
        as_root ln -s "$libpq" "$lib/libpq.so.5"
        as_root ln -s libpq.so.5 "$lib/libpq.so"
        as_root chmod -R a+rX "$prefix"
        echo "$pinned" | as_root tee "$(wheel_marker "$major")" >/dev/null
    )
}
