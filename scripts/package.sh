#!/usr/bin/env bash
# scripts/package.sh MAJOR: writes dist/postgresql-MAJOR-snowid_VERSION_amd64.deb, a Debian package
# of snowid for PostgreSQL MAJOR (15, 16, 17 or 18) as Debian's own postgresql-MAJOR lays it out. Its files
# are what `cargo pgrx package` builds, every install and upgrade script in sql/, and the licence as
# Debian's machine-readable copyright file. Prints the package's path last.
major=${1:?usage: scripts/package.sh MAJOR}
PG_MAJOR=$major
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
prepare build
cd "$REPO"

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
echo "==> building snowid $version for PostgreSQL $major (release)" >&2
built=$(mktemp -d)
trap 'rm -rf "$built"' EXIT
# The same release build that scripts/test.sh installs and tests, so that building it again is not
# needed.
cargo pgrx package --pg-config "$PG_CONFIG" --out-dir "$built" >/dev/null
root="target/deb/postgresql-$major-snowid"
rm -rf "$root"
install -d "$root/DEBIAN" "$root/usr/lib/postgresql/$major/lib" "$root/usr/share/postgresql/$major/extension"
cp -a "$built$("$PG_CONFIG" --pkglibdir)/." "$root/usr/lib/postgresql/$major/lib/"
cp -a "$built$("$PG_CONFIG" --sharedir)/extension/." "$root/usr/share/postgresql/$major/extension/"
# No runpath: the package's library finds the libpq of the system it is installed on, which must be
# of the server's major or later (the whole server process, its walreceiver included, uses it).
patchelf --remove-rpath "$root/usr/lib/postgresql/$major/lib/snowid.so"
install -m 644 sql/snowid--*.sql "$root/usr/share/postgresql/$major/extension/"
for tool in patroni prometheus; do
    install -d "$root/usr/share/postgresql/$major/contrib/snowid/$tool"
    install -m 644 contrib/$tool/* "$root/usr/share/postgresql/$major/contrib/snowid/$tool/"
done
# The copyright file in Debian's machine-readable format: LICENSE's terms below its copyright line,
# each line indented by one space and each empty line written as " .".
{
    printf '%s\n' "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/" \
        "Upstream-Name: snowid" "" "Files: *" "Copyright: 2026 the snowid authors" "License: PostgreSQL"
    sed -n '/^Permission/,$p' LICENSE | sed 's/^$/./; s/^/ /'
} >"$built/copyright"
install -d "$root/usr/share/doc/postgresql-$major-snowid"
install -m 644 "$built/copyright" "$root/usr/share/doc/postgresql-$major-snowid/"
cat >"$root/DEBIAN/control" <<CONTROL
Package: postgresql-$major-snowid
Version: $version
Architecture: $(dpkg --print-architecture)
Maintainer: snowid maintainers <maintainers@snowid.dev>
Depends: postgresql-$major, libpq5 (>= $major~), libcurl4, libgcc-s1, libc6
Section: database
Priority: optional
Description: unique, roughly time-ordered 64-bit ids made inside PostgreSQL $major
 snowid makes bigint ids (41 bits of milliseconds, 10 bits of worker id, 12 bits of sequence)
 with snowid_next(), leasing each server's worker id so that no two servers share one.
 License: PostgreSQL (see /usr/share/doc/postgresql-$major-snowid/copyright).
CONTROL
mkdir -p dist
deb="dist/postgresql-$major-snowid_${version}_$(dpkg --print-architecture).deb"
dpkg-deb --build --root-owner-group "$root" "$deb" >/dev/null
echo "$deb"
