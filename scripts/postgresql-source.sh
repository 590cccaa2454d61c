# Sourced by setup.sh. Debian 12 ships PostgreSQL 15 only, so the other majors snowid is tested on
# are built once from the upstream source in Debian's own source packages, each into
# /opt/postgresql-MAJOR, and reused after. The source tarball comes from the pool of the Debian
# archive that the machine's own apt sources name (its mirror, if it has one), at a version and
# checksum pinned here: 17.11 of Debian 13's postgresql-17 (17.11-0+deb13u1; the archive's 17.12
# was not fetchable when this was written) and 18.6 of sid's postgresql-18 (18.6-3).

# source_of MAJOR: the pinned upstream version and the SHA-256 of its tarball, as the .dsc of
# Debian's source package lists them.
source_of() {
    case $1 in
    17) echo "17.11 dd27f2b3c59e73ed14aa3324901242bf69a032a6347805f274e6260322d42979" ;;
    18) echo "18.6 555610c24d53e4316da5b7d3fc25c279d96856d5e0e23ee308c328c5fa881d9f" ;;
    *) return 1 ;;
    esac
}

source_prefix_of() { echo "/opt/postgresql-$1"; }

# The Debian archive that the machine's apt sources name, from apt's own list of index targets.
debian_archive() {
    local archive
    archive=$(apt-get indextargets --format '$(REPO_URI)|$(LABEL)' 2>/dev/null | awk -F'|' '$2 == "Debian" { print $1; exit }')
    if [ -z "$archive" ]; then
        # No lists yet (a fresh machine): apt knows its targets once it has fetched them.
        as_root apt-get update -qq
        archive=$(apt-get indextargets --format '$(REPO_URI)|$(LABEL)' 2>/dev/null | awk -F'|' '$2 == "Debian" { print $1; exit }')
    fi
    [ -n "$archive" ] || { echo "the machine's apt sources name no Debian archive" >&2; return 1; }
    echo "${archive%/}"
}

# build_postgresql MAJOR: PostgreSQL MAJOR built and installed into its prefix, unless it is there.
build_postgresql() {
    local major=$1 prefix version sha256 archive tarball
    prefix=$(source_prefix_of "$major")
    read -r version sha256 < <(source_of "$major")
    # Written last: a build that stopped halfway is built again.
    [ -f "$prefix/.built-by-snowid" ] && return 0
    archive=$(debian_archive)
    tarball="postgresql-${major}_$version.orig.tar.bz2"
    echo "==> building PostgreSQL $version from $archive/pool/main/p/postgresql-$major/$tarball into $prefix (about 5 minutes, once)"
    (
        work=$(mktemp -d)
        trap 'rm -rf "$work"' EXIT
        cd "$work"
        curl -fsS --retry 3 -o "$tarball" "$archive/pool/main/p/postgresql-$major/$tarball"
        echo "$sha256  $tarball" | sha256sum -c --quiet
        tar xf "$tarball"
        cd "postgresql-$version"
        # With OpenSSL, as every distribution builds it: gen_random_uuid() (and 18's uuidv7())
        # draw from it.
        ./configure --prefix="$prefix" --with-openssl --with-icu --without-readline >/dev/null
        make -s -j"$(nproc)" >/dev/null
        as_root make -s install >/dev/null
        as_root touch "$prefix/.built-by-snowid"
    )
}
