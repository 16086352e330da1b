/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * The last lines of a guest's console log, made fit for an error message
 * (a D-Bus error, a JSON string, a terminal): read from at most the last
 * CONSOLE_TAIL_READ_MAX bytes of the file; carriage returns and blank lines
 * dropped; every byte that is not printable ASCII shown as '?'; each line cut
 * at CONSOLE_TAIL_LINE_MAX characters (then "..."), indented by two spaces;
 * the lines joined with '\n', none after the last.
 */

#define CONSOLE_TAIL_READ_MAX (16u << 10)
#define CONSOLE_TAIL_LINE_MAX 160u
#define CONSOLE_TAIL_LINES_MAX 100u

/* At most n_lines (1 to CONSOLE_TAIL_LINES_MAX) lines; *ret is "" when the
 * log holds none. *ret is untouched on failure (-errno of open() and read(),
 * -EBADF for a file that is not a regular one, -EINVAL for a bad n_lines). */
int console_tail(const char *path, unsigned n_lines, char **ret);
