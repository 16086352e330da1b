#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# The source tree's layout rules (TAP):
#  - no .c file under src/ or agent/ is over 1000 lines;
#  - the daemon's manager.c, sandbox.c and image.c know nothing of the operations
#    (fork-op.h, branch.h, paused.h, chain.h, pack-op.h): those come to them as
#    callbacks, never as includes;
#  - the repository speaks of what forkd is, not of how it was made: no tracker
#    numbers or work-log words outside the fuzz corpus.
# usage: test-layout.sh SOURCE-DIR

set -u
top=${1:?usage: test-layout.sh SOURCE-DIR}
cd "$top" || exit 1
echo "1..3"

over=$(find src agent -name '*.c' -print0 | xargs -0 wc -l | awk '$2 != "total" && $1 > 1000')
if [ -z "$over" ]; then
        echo "ok 1 - no .c file under src/ or agent/ is over 1000 lines"
else
        echo "not ok 1 - .c files over 1000 lines"
        sed 's/^/# /' <<<"$over"
fi

bad=$(grep -nE '^#include "(fork-op|branch|paused|chain|pack-op)\.h"' \
        src/daemon/manager.c src/daemon/sandbox.c src/daemon/image.c)
if [ -z "$bad" ]; then
        echo "ok 2 - manager.c, sandbox.c and image.c include no operation's header"
else
        echo "not ok 2 - an operation's header is included where it must not be"
        sed 's/^/# /' <<<"$bad"
fi

# ("the[ ]spec" is "the spec" written so that this line is not a hit of the plain pattern.)
pattern='\bissue [0-9]+|\bseeds? 00[0-9]|/shared/(spec|DESIGN)|\blent\b|the[ ]spec.s|fresh[ ]clone of|\b(an|earlier|this|last|next|same) stop\b'
if [ -d .git ] || git rev-parse --git-dir >/dev/null 2>&1; then
        words=$(git grep -nEi "$pattern" -- . ':!tests/fuzz/corpus' ':!tests/unit/test-layout.sh')
else
        words=$(grep -rnEi "$pattern" --exclude-dir=.git --exclude-dir=corpus --exclude=test-layout.sh \
                --exclude-dir='build*' src agent tests tools bench man units dbus polkit README.md meson.build)
fi
if [ -z "$words" ]; then
        echo "ok 3 - no words about how the project was made"
else
        echo "not ok 3 - words about how the project was made"
        sed 's/^/# /' <<<"$words" | head -n 20
fi
[ -z "$over$bad$words" ]
