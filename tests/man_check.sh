#!/bin/sh
# tests/man_check.sh BUILD: no exported function, installed program or config key without its manual.
# - every function include/gmlake.h marks GML_API is named in the NAME section of a man/man3 page
#   (make install links `man 3 FUNCTION` to it) and has its synopsis line there;
# - every program make install puts in bin/ has a page in man/man1 or man/man8;
# - every option of gmlake-replay --help is in man gmlake-replay;
# - every key of daemon/config.c's option table that the config file takes is in man 5 gmlaked.conf.
# It lists every name missing (not only the first) and fails.
set -e
BUILD=${1:-build}
missing=$(mktemp)
trap 'rm -f "$missing"' EXIT
lack() { echo "  $1" >> "$missing"; }

funcs=$(sed -n 's/^GML_API [^(]*[ *]\([a-z_0-9]*\)(.*/\1/p' include/gmlake.h)
[ "$(echo "$funcs" | wc -l)" -ge 40 ] ||
  { echo "could not read the GML_API functions of include/gmlake.h" >&2; exit 1; }
names=$(mktemp)
trap 'rm -f "$missing" "$names"' EXIT
for p in man/man3/*.3; do scripts/man-names.sh "$p" | sed "s|^|$p |"; done > "$names"  # "PAGE NAME" lines
for f in $funcs; do
  page=$(awk -v f="$f" '$2 == f { print $1; exit }' "$names")
  if [ -z "$page" ]; then
    lack "$f (GML_API in include/gmlake.h): named in no man/man3 page's NAME section"
    continue
  fi
  grep -Eq "^\\.BI? \"[^\"]*[ *]$f\\(" "$page" || lack "$f: no synopsis line in $page (.BI \"... $f(...\")"
done

progs=$(grep '^	install .*\$(DESTDIR)\$(PREFIX)/bin/$' Makefile | tr ' ' '\n' | sed -n 's|^\$(BUILD)/||p')
[ "$(echo "$progs" | wc -l)" -ge 3 ] || { echo "could not read the programs make install puts in bin/" >&2; exit 1; }
for p in $progs; do
  [ -e "man/man1/$p.1" ] || [ -e "man/man8/$p.8" ] || lack "$p (installed in bin/): no man/man1/$p.1 or man/man8/$p.8"
done

ropts=$("$BUILD/gmlake-replay" --help 2>&1 | grep -o -- '--[a-z][a-z-]*' | sort -u)
[ "$(echo "$ropts" | wc -l)" -ge 8 ] || { echo "could not read the options of gmlake-replay --help" >&2; exit 1; }
for o in $ropts; do
  sed 's/\\-/-/g' man/man1/gmlake-replay.1 | grep -Eq -- "^\\.B[IR]* $o( |\\[|\"|$)" ||
    lack "gmlake-replay $o: not in man/man1/gmlake-replay.1"
done

# the table's rows: {"name", ARG, OPT_TYPE, ...; the file takes all but OPT_CONFIG, OPT_VERSION and check-config
# (config.c: "a command, not a setting")
keys=$(sed -n 's/^ *{"\([a-z-]*\)", [^,]*, \(OPT_[A-Z]*\),.*/\1 \2/p' daemon/config.c |
  grep -v ' OPT_CONFIG$\| OPT_VERSION$\|^check-config ' | cut -d' ' -f1)
[ "$(echo "$keys" | wc -l)" -ge 20 ] || { echo "could not read the option table of daemon/config.c" >&2; exit 1; }
for k in $keys; do
  sed 's/\\-/-/g' man/man5/gmlaked.conf.5 | grep -Eq "^\\.BI? \"?$k( =|\"|$)" ||
    lack "config key $k (daemon/config.c): not in man/man5/gmlaked.conf.5"
done

if [ -s "$missing" ]; then
  echo "missing from the manuals ($(wc -l < "$missing")):" >&2
  cat "$missing" >&2
  exit 1
fi
echo "  manuals: $(echo "$funcs" | wc -l) exported functions (man 3), $(echo "$progs" | wc -l) programs," \
  "$(echo "$ropts" | wc -l) gmlake-replay options, $(echo "$keys" | wc -l) config keys (man 5 gmlaked.conf)"
