#!/bin/sh
# man-names.sh PAGE: the names a man page's NAME section lists (before its "\-"), one a line.
# make install links `man 3 NAME` to the page; tests/run.sh checks every exported function is named.
sed -n '/^\.SH NAME/,/^\.SH/{/^\.SH/d;p}' "$1" | tr '\n' ' ' | sed 's/ \\- .*//; s/\\-/-/g' | tr ', ' '\n\n' | grep -v '^$'
