# Sourced by lib.sh. No Debian suite the machine reaches has PostgreSQL 16, and upstream's source
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
wheel_marker() { echo "$(wheel_prefix_of "$1")/.unpacked-by-snowid"; }
wheel_pg_config() { echo "$(wheel_prefix_of "$1")/pgserver/pginstall/bin/pg_config"; }
# The major whose libpq the wheel of MAJOR gets (see above), and that libpq.
libpq_major_of() { echo 17; }
wheel_libpq() { echo "$(source_prefix_of "$(libpq_major_of "$1")")/lib/libpq.so.5"; }
# What the marker of an unpacked wheel of MAJOR holds: the wheel pinned, and the libpq it was given.
wheel_pin() { echo "$(wheel_of "$1") $(wheel_libpq "$1")"; }

# wheel_ready MAJOR: the pinned wheel of MAJOR is unpacked, and the libpq it was given is there.
wheel_ready() {
    [ "$(cat "$(wheel_marker "$1")" 2>/dev/null)" = "$(wheel_pin "$1")" ] && [ -e "$(wheel_libpq "$1")" ]
}

# install_wheel_postgresql MAJOR: the pinned wheel unpacked into its prefix, unless it is there. A
# prefix that snowid did not unpack is never replaced.
install_wheel_postgresql() {
    local major=$1 version file sha256 prefix libpq
    build_postgresql "$(libpq_major_of "$major")"
    wheel_ready "$major" && return 0
    libpq=$(wheel_libpq "$major")
    [ -e "$libpq" ] || {
        echo "$libpq is missing: remove $(source_prefix_of "$(libpq_major_of "$major")") for set-up to build it again" >&2
        return 1
    }
    prefix=$(wheel_prefix_of "$major")
    if [ -e "$prefix" ] && [ ! -e "$(wheel_marker "$major")" ]; then
        echo "$prefix exists and was not unpacked by snowid's set-up: move it away for PostgreSQL $major to be unpacked there" >&2
        return 1
    fi
    read -r version file sha256 <<<"$(wheel_of "$major")"
    echo "==> unpacking PostgreSQL $major from PyPI's pgserver $version wheel into $prefix (once)"
    (
        work=$(mktemp -d)
        unpacking="$prefix.unpacking"
        trap 'rm -rf "$work"; as_root rm -rf "$unpacking"' EXIT
        python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
            --platform manylinux2014_x86_64 --dest "$work" "pgserver==$version"
        echo "$sha256  $work/$file" | sha256sum --check --quiet || {
            echo "pgserver $version's wheel does not have the SHA-256 pinned in scripts/postgresql-wheel.sh" >&2
            exit 1
        }
        as_root rm -rf "$unpacking"
        # A wheel is a zip archive that records each file's mode, which Python's zipfile module
        # reads but does not apply.
        as_root python3 - "$work/$file" "$unpacking" <<'PYTHON'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for member in wheel.infolist():
        path = wheel.extract(member, sys.argv[2])
        mode = member.external_attr >> 16
        if mode and not member.is_dir():
            os.chmod(path, mode & 0o777)
PYTHON
        local lib="$unpacking/pgserver/pginstall/lib"
        as_root rm -f "$lib"/libpq.so* "$lib/libpq.a"
        as_root ln -s "$libpq" "$lib/libpq.so.5"
        as_root ln -s libpq.so.5 "$lib/libpq.so"
        as_root chmod -R a+rX "$unpacking"
        wheel_pin "$major" | as_root tee "$unpacking/$(basename "$(wheel_marker "$major")")" >/dev/null
        # Replaced whole, so that an interrupted run leaves the last unpacked wheel, or none.
        as_root rm -rf "$prefix"
        as_root mv "$unpacking" "$prefix"
    )
}
