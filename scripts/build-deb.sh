#!/bin/sh
# scripts/build-deb.sh OUT: GMLake's Debian packages (debian/) built with dpkg-buildpackage from a clean copy of this
# tree (the files git knows, or all but the build folders where there is no git), into OUT: the .debs, the
# .changes and .buildinfo, and lintian.txt. Then lintian on them: a warning or an error fails (each tag the
# packages keep is explained in debian/*.lintian-overrides).
set -eu
cd "$(dirname "$0")/.."
out=${1:-build/deb}
version=$(dpkg-parsechangelog -S Version)
rm -rf "$out" && mkdir -p "$out/src/gmlake-$version"
out=$(cd "$out" && pwd)
src="$out/src/gmlake-$version"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard | xargs -0 sh -c 'for f; do [ -e "$f" ] || [ -L "$f" ] && echo "$f"; done' sh |
    tar -cf - -T - | tar -xf - -C "$src"
else
  tar -cf - --exclude='./build*' --exclude=./.git . | tar -xf - -C "$src"
fi
echo "== dpkg-buildpackage (binary packages, unsigned) in $src"
(cd "$src" && dpkg-buildpackage -b -us -uc) > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; echo "make deb: dpkg-buildpackage failed ($out/build.log)" >&2; exit 1; }
mv "$out/src/"*.deb "$out/src/"*.changes "$out/src/"*.buildinfo "$out/"
rm -rf "$out/src"
ls -l "$out/"*.deb
echo "== lintian"
lintian --info --display-info --pedantic "$out/"*.changes > "$out/lintian.txt" 2>&1 || true
cat "$out/lintian.txt"
if grep -E '^[EW]: ' "$out/lintian.txt" > /dev/null; then
  echo "make deb: lintian has errors or warnings (above, $out/lintian.txt): fix them, or explain each in debian/*.lintian-overrides" >&2
  exit 1
fi
echo "make deb: $(ls "$out/"*.deb | wc -l) packages in $out, lintian: no error, no warning ($(grep -c '^[IP]: ' "$out/lintian.txt" || true) info/pedantic notes)"
