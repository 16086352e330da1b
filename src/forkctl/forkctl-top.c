/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* forkctl top: the sandboxes' usage, live. Each second one ListSandboxes
 * (usage included); CPU%, disk and net rates are the differences to the
 * sample before, divided by the time between them. */

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

#include "bus-json.h"
#include "forkctl.h"
#include "table.h"
#include "time-util.h"

#define TOP_INTERVAL_USEC USEC_PER_SEC

struct top_row {
        char id[80];
        char state[24];
        uint64_t cpu_usec, mem_private_kib, mem_shared_kib, disk_bytes, net_bytes;
        double cpu_percent, disk_rate, net_rate; /* since the sample before; bytes/s */
};

struct top_sample {
        struct top_row *rows;
        size_t n;
        uint64_t at; /* now_usec() */
};

static void top_sample_clear(struct top_sample *s) {
        free(s->rows);
        *s = (struct top_sample) {};
}

static uint64_t usage_u64(struct json_object *u, const char *key) {
        struct json_object *v;

        return json_object_object_get_ex(u, key, &v) ? (uint64_t) json_object_get_uint64(v) : 0;
}

static int top_take_sample(sd_bus *bus, struct top_sample *ret) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_json_ struct json_object *list = NULL;
        struct error_context ctx = { .verb = "top" };
        struct top_sample s = {};
        size_t n;
        int r;

        r = sd_bus_call_method(bus, BUS_NAME, BUS_PATH, BUS_INTERFACE, "ListSandboxes", &error, &reply, "");
        if (r < 0)
                return report_error(&error, r, &ctx);
        s.at = now_usec();
        r = bus_message_read_dict_array_json(reply, &list);
        if (r < 0)
                return report_error(NULL, r, &ctx);
        n = json_object_array_length(list);
        s.rows = calloc(n ? n : 1, sizeof(struct top_row));
        if (!s.rows)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                struct json_object *sb = json_object_array_get_idx(list, i), *u;
                struct top_row *row = &s.rows[s.n];

                /* paused ones have no VMM, hence no usage */
                if (!json_object_object_get_ex(sb, "usage", &u) || !json_object_is_type(u, json_type_object))
                        continue;
                snprintf(row->id, sizeof row->id, "%s", jstr(sb, "id") ?: "?");
                snprintf(row->state, sizeof row->state, "%s", jstr(sb, "state") ?: "?");
                row->cpu_usec = usage_u64(u, "cpu_usec");
                row->mem_private_kib = usage_u64(u, "memory_private_kib");
                row->mem_shared_kib = usage_u64(u, "memory_shared_kib");
                row->disk_bytes = usage_u64(u, "disk_read_bytes") + usage_u64(u, "disk_written_bytes");
                row->net_bytes = usage_u64(u, "net_rx_bytes") + usage_u64(u, "net_tx_bytes");
                s.n++;
        }
        *ret = s;
        return 0;
}

/* The rates of now against before, for the sandboxes in both (a new one: 0). */
static void top_rates(struct top_sample *now, const struct top_sample *before) {
        double secs = now->at > before->at ? (double) (now->at - before->at) / 1e6 : 0;

        for (size_t i = 0; i < now->n; i++) {
                struct top_row *r = &now->rows[i];

                for (size_t k = 0; secs > 0 && k < before->n; k++) {
                        const struct top_row *b = &before->rows[k];

                        if (strcmp(r->id, b->id) != 0)
                                continue;
                        if (r->cpu_usec >= b->cpu_usec)
                                r->cpu_percent = (double) (r->cpu_usec - b->cpu_usec) / 1e4 / secs;
                        if (r->disk_bytes >= b->disk_bytes)
                                r->disk_rate = (double) (r->disk_bytes - b->disk_bytes) / secs;
                        if (r->net_bytes >= b->net_bytes)
                                r->net_rate = (double) (r->net_bytes - b->net_bytes) / secs;
                        break;
                }
        }
}

static const char *top_sort = "cpu";

static double top_key(const struct top_row *r) {
        if (streq(top_sort, "mem"))
                return (double) r->mem_private_kib;
        if (streq(top_sort, "disk"))
                return r->disk_rate;
        if (streq(top_sort, "net"))
                return r->net_rate;
        return r->cpu_percent;
}

static int top_compare(const void *a, const void *b) {
        const struct top_row *x = a, *y = b;
        double kx = top_key(x), ky = top_key(y);

        if (kx != ky)
                return kx > ky ? -1 : 1; /* the largest first */
        return strcmp(x->id, y->id);
}

static int top_print_table(const struct top_sample *s) {
        static const char *const headers[] = { "ID", "STATE", "CPU%", "MEM PRIVATE", "MEM SHARED", "DISK/S", "NET/S" };
        _cleanup_table_ struct table *t = table_new(ELEMENTSOF(headers), headers);

        if (!t)
                return -ENOMEM;
        for (size_t i = 0; i < s->n; i++) {
                const struct top_row *r = &s->rows[i];
                char cpu[32], mp[32], ms[32], disk[40], net[40], b[32];

                snprintf(cpu, sizeof cpu, "%.1f", r->cpu_percent);
                format_bytes(mp, sizeof mp, r->mem_private_kib * 1024);
                format_bytes(ms, sizeof ms, r->mem_shared_kib * 1024);
                snprintf(disk, sizeof disk, "%s", format_bytes(b, sizeof b, (uint64_t) r->disk_rate));
                snprintf(net, sizeof net, "%s", format_bytes(b, sizeof b, (uint64_t) r->net_rate));
                const char *cells[] = { r->id, r->state, cpu, mp, ms, disk, net };
                if (table_add_row(t, cells) < 0)
                        return -ENOMEM;
        }
        if (s->n == 0) {
                puts("No running sandboxes.");
                return 0;
        }
        return table_print(t, stdout);
}

static int top_print_json(const struct top_sample *s) {
        _cleanup_json_ struct json_object *doc = json_object_new_object(), *list = json_object_new_array();

        if (!doc || !list)
                return -ENOMEM;
        for (size_t i = 0; i < s->n; i++) {
                const struct top_row *r = &s->rows[i];
                struct json_object *o = json_object_new_object();

                if (!o || json_object_array_add(list, o) < 0) {
                        json_object_put(o);
                        return -ENOMEM;
                }
                json_object_object_add(o, "id", json_object_new_string(r->id));
                json_object_object_add(o, "state", json_object_new_string(r->state));
                json_object_object_add(o, "cpu_percent", json_object_new_double(r->cpu_percent));
                json_object_object_add(o, "memory_private_kib", json_object_new_uint64(r->mem_private_kib));
                json_object_object_add(o, "memory_shared_kib", json_object_new_uint64(r->mem_shared_kib));
                json_object_object_add(o, "disk_bytes_per_sec", json_object_new_double(r->disk_rate));
                json_object_object_add(o, "net_bytes_per_sec", json_object_new_double(r->net_rate));
        }
        if (json_object_object_add(doc, "sandboxes", TAKE_PTR(list)) < 0)
                return -ENOMEM;
        return print_json(doc);
}

static volatile sig_atomic_t top_stop;

static void top_on_signal(int sig) {
        top_stop = 1;
}

/* The terminal as it was, restored on every way out of the loop. */
static struct termios top_saved_tio;
static bool top_tio_saved;

static void top_restore_terminal(void) {
        if (top_tio_saved) {
                (void) tcsetattr(STDIN_FILENO, TCSANOW, &top_saved_tio);
                top_tio_saved = false;
        }
        fputs("\033[?25h", stdout); /* the cursor back */
        fflush(stdout);
}

static void top_raw_terminal(void) {
        struct termios tio;

        if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &top_saved_tio) < 0)
                return;
        tio = top_saved_tio;
        tio.c_lflag &= ~(ICANON | ECHO); /* keys one at a time, unechoed; ISIG stays: Ctrl-C ends it */
        tio.c_cc[VMIN] = 0;
        tio.c_cc[VTIME] = 0;
        if (tcsetattr(STDIN_FILENO, TCSANOW, &tio) == 0)
                top_tio_saved = true;
}

/* Wait until the next refresh: false when q or Ctrl-C asks to stop. At the end
 * of standard input (not a terminal), only a signal stops it. */
static bool top_wait(uint64_t usec) {
        static bool eof;
        uint64_t until = now_usec() + usec;

        while (!top_stop) {
                uint64_t now = now_usec();
                struct pollfd p = { .fd = STDIN_FILENO, .events = POLLIN };
                int k;

                if (now >= until)
                        return true;
                k = poll(eof ? NULL : &p, eof ? 0 : 1, (int) ((until - now + 999) / 1000));
                if (k < 0 && errno != EINTR)
                        return false;
                if (k > 0) {
                        char c;
                        ssize_t n = read(STDIN_FILENO, &c, 1);

                        if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR)))
                                eof = true;
                        else if (n == 1 && (c == 'q' || c == 'Q'))
                                return false;
                }
        }
        return false;
}

int verb_top(sd_bus *bus, const struct forkctl_options *o, char **args, size_t n_args) {
        struct top_sample before = {}, now = {};
        struct sigaction sa = { .sa_handler = top_on_signal }, old_int, old_term;
        int r;

        if (o->sort)
                top_sort = o->sort;
        r = top_take_sample(bus, &before);
        if (r < 0)
                return r;
        if (o->once) {
                usleep(TOP_INTERVAL_USEC);
                r = top_take_sample(bus, &now);
                if (r >= 0) {
                        top_rates(&now, &before);
                        qsort(now.rows, now.n, sizeof(struct top_row), top_compare);
                        r = o->json ? top_print_json(&now) : top_print_table(&now);
                }
                top_sample_clear(&before);
                top_sample_clear(&now);
                return r < 0 ? r : 0;
        }

        (void) sigaction(SIGINT, &sa, &old_int);
        (void) sigaction(SIGTERM, &sa, &old_term);
        top_raw_terminal();
        fputs("\033[?25l", stdout); /* no cursor while it redraws */
        for (;;) {
                if (!top_wait(TOP_INTERVAL_USEC))
                        break;
                r = top_take_sample(bus, &now);
                if (r < 0)
                        break;
                top_rates(&now, &before);
                qsort(now.rows, now.n, sizeof(struct top_row), top_compare);
                fputs("\033[H\033[2J", stdout);
                printf("forkctl top: %zu sandbox(es), sorted by %s; q or Ctrl-C quits\n\n", now.n, top_sort);
                r = top_print_table(&now);
                fflush(stdout);
                top_sample_clear(&before);
                before = now;
                now = (struct top_sample) {};
                if (r < 0)
                        break;
        }
        top_restore_terminal();
        (void) sigaction(SIGINT, &old_int, NULL);
        (void) sigaction(SIGTERM, &old_term, NULL);
        top_sample_clear(&before);
        top_sample_clear(&now);
        return r < 0 ? r : 0;
}

int check_top(struct forkctl_options *o, char **args, size_t n_args, const char *synopsis) {
        /* a live table has nothing to print as one document */
        if (o->json && !o->once)
                return usage_error("top: --json goes with --once");
        return 0;
}
