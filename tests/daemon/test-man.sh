#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# Every manual page in man/ renders with man -l, and groff warns about nothing
# (undefined macros, bad escapes, unbreakable lines...): the check lintian makes.
# usage: test-man.sh MAN-DIR       TAP output.

set -u
dir=${1:?usage: test-man.sh MAN-DIR}
command -v man >/dev/null || { echo "1..0 # SKIP man is not installed"; exit 0; }

pages=("$dir"/*.[1-8])
[ -e "${pages[0]}" ] || { echo "1..1"; echo "not ok 1 - no manual pages in $dir"; exit 1; }
echo "1..$(( ${#pages[@]} * 2 ))"
n=0 failed=0
for page in "${pages[@]}"; do
        name=$(basename "$page")
        n=$((n + 1))
        warnings=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -E UTF-8 -l -Tutf8 -Z "$page" 2>&1 >/dev/null)
        if [ -z "$warnings" ]; then
                echo "ok $n - $name: no groff warnings"
        else
                echo "not ok $n - $name: groff warnings"
                sed 's/^/# /' <<<"$warnings"
                failed=$((failed + 1))
        fi
        n=$((n + 1))
        # The rendered page: a NAME section and a header carrying the page's title.
        section=${name##*.} title=${name%.*}
        text=$(LC_ALL=C.UTF-8 MANWIDTH=80 man -l "$page" 2>&1)
        if [ $? = 0 ] && grep -q '^NAME' <<<"$text" && head -n 1 <<<"$text" | grep -qiF "$title($section)"; then
                echo "ok $n - $name renders with man -l ($(wc -l <<<"$text") lines)"
        else
                echo "not ok $n - $name renders with man -l"
                head -n 5 <<<"$text" | sed 's/^/# /'
                failed=$((failed + 1))
        fi
done
[ $failed = 0 ]
