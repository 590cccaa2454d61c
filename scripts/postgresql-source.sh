# Sourced by lib.sh. Debian 12 ships PostgreSQL 15 only, so the other majors snowid is tested on
# are built once from the upstream source in Debian's own source packages, each into
# /opt/postgresql-MAJOR, and reused after. The tarball comes from the pool of a Debian archive that
# the machine's own apt sources name (its mirror, if it has one, which must carry the source pool),
# fetched by apt's own downloader (its proxy and authentication settings), at a version and checksum
# pinned here: the checksum of 18.6 is the one sid's signed Sources index lists for postgresql-18
# 18.6-3; that of 17.11, the one the .dsc of postgresql-17 17.11-0+deb13u1 lists (Debian 13's
# archive moved on to 17.12, whose tarball was not fetchable when this was written).

# source_of MAJOR: the pinned upstream version and the SHA-256 of its tarball.
source_of() {
    case $1 in
    17) echo "17.11 dd27f2b3c59e73ed14aa3324901242bf69a032a6347805f274e6260322d42979" ;;
    18) echo "18.6 555610c24d53e4316da5b7d3fc25c279d96856d5e0e23ee308c328c5fa881d9f" ;;
    *) echo "no PostgreSQL $1 source is pinned" >&2; return 1 ;;
    esac
}

source_prefix_of() { echo "/opt/postgresql-$1"; }

# What the prefix's marker holds once a build of the pinned source is installed there.
source_marker() { echo "$(source_prefix_of "$1")/.built-by-snowid"; }

# The Debian archives that the machine's apt sources name, from apt's own list of index targets.
debian_archives() {
    apt-get indextargets --format '$(REPO_URI)|$(LABEL)' 2>/dev/null | awk -F'|' '$2 == "Debian" { print $1 }' | sort -u
}

# build_postgresql MAJOR: PostgreSQL MAJOR built from the pinned source and installed into its
# prefix, unless that very build is there.
build_postgresql() {
    local major=$1 pinned version sha256 prefix archives archive tarball
    pinned=$(source_of "$major")
    read -r version sha256 <<<"$pinned"
    prefix=$(source_prefix_of "$major")
    [ "$(cat "$(source_marker "$major")" 2>/dev/null)" = "$pinned" ] && return 0
    archives=$(debian_archives)
    if [ -z "$archives" ]; then
        # No lists yet (a fresh machine): apt knows its targets once it has fetched them.
        as_root apt-get update -qq >&2
        archives=$(debian_archives)
    fi
    [ -n "$archives" ] || { echo "the machine's apt sources name no Debian archive" >&2; return 1; }
    tarball="postgresql-${major}_$version.orig.tar.bz2"
    echo "==> building PostgreSQL $version from Debian's $tarball into $prefix (about 5 minutes, once)"
    (
        work=$(mktemp -d)
        trap 'rm -rf "$work"' EXIT
        cd "$work"
        for archive in $archives; do
            as_root /usr/lib/apt/apt-helper -o APT::Sandbox::User=root download-file \
                "${archive%/}/pool/main/p/postgresql-$major/$tarball" "$work/$tarball" "SHA256:$sha256" >/dev/null 2>&1 && break
        done
        [ -f "$tarball" ] || {
            echo "no Debian archive of the machine's apt sources ($archives) has $tarball with SHA-256 $sha256: update the pin in scripts/postgresql-source.sh to a version the archive carries" >&2
            exit 1
        }
        tar xf "$tarball"
        cd "postgresql-$version"
        # With OpenSSL, as every distribution builds it: gen_random_uuid() (and 18's uuidv7())
        # draw from it.
        ./configure --prefix="$prefix" --with-openssl --with-icu --without-readline >/dev/null
        make -s -j"$(nproc)" >/dev/null
        as_root make -s install >/dev/null
        echo "$pinned" | as_root tee "$(source_marker "$major")" >/dev/null
    )
}
