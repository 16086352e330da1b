/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Snapshot chains in the daemon: see chain.h. */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <json-c/json.h>

#include "branch.h"
#include "chain.h"
#include "fs-util.h"
#include "bus-info.h"
#include "image.h"
#include "macro.h"
#include "paused.h"
#include "operation.h"
#include "worker.h"
#include "vm-template.h"

/* How much of forkd-vmm compact's answer (one JSON line) is read. */
#define COMPACT_REPLY_MAX 8192u
/* How many dependents a HasDependents message names (all of them, up to this). */
#define DEPENDENTS_NAMED_MAX 64u

extern char **environ;

static bool strv_contains(char **l, size_t n, const char *s) {
        for (size_t k = 0; k < n; k++)
                if (strcmp(l[k], s) == 0)
                        return true;
        return false;
}

/* Every registered descendant of tag, children before their parents (post-order),
 * tag itself last. NULL-terminated. A cycle of parent_tags (possible after a
 * force delete and a re-use of the tag) is walked once. */
static int subtree_add(Manager *m, const char *tag, char ***l, size_t *n, unsigned depth) {
        _cleanup_(strv_freep) char **deps = NULL;
        char **nl;
        int r;

        if (depth > SNAPSHOTS_MAX)
                return -ELOOP;
        r = image_dependents(m, tag, &deps);
        if (r < 0)
                return r;
        for (char **d = deps; *d; d++) {
                if (strv_contains(*l, *n, *d))
                        continue;
                r = subtree_add(m, *d, l, n, depth + 1);
                if (r < 0)
                        return r;
        }
        if (strv_contains(*l, *n, tag))
                return 0;
        nl = realloc(*l, (*n + 2) * sizeof(char *));
        if (!nl)
                return -ENOMEM;
        *l = nl;
        nl[*n] = strdup(tag);
        if (!nl[*n])
                return -ENOMEM;
        nl[++*n] = NULL;
        return 0;
}

static int subtree(Manager *m, const char *tag, char ***ret) {
        char **l = calloc(1, sizeof(char *));
        size_t n = 0;
        int r;

        if (!l)
                return -ENOMEM;
        r = subtree_add(m, tag, &l, &n, 0);
        if (r < 0) {
                strv_free(l);
                return r;
        }
        *ret = l;
        return (int) n;
}

/* The snapshots chained on a deleted parent keep their (old) template, whose
 * files are open: detach them, so that their next fork loads the chain again
 * and finds the parent gone or changed. */
static void detach_templates(Manager *m, char **tags) {
        for (char **t = tags; *t; t++) {
                Image *d = hashmap_get(m->images, *t);
                VmTemplate *tpl;

                if (!d || !d->template)
                        continue;
                tpl = d->template;
                d->template = NULL;
                vm_template_detach_image(tpl);
        }
}

static int dependents_error(Image *i, char **deps, int n, sd_bus_error *error) {
        _cleanup_free_ char *list = NULL;
        size_t size = 0;
        FILE *f;

        f = open_memstream(&list, &size);
        if (!f)
                return -ENOMEM;
        for (int k = 0; k < n && k < (int) DEPENDENTS_NAMED_MAX; k++)
                fprintf(f, "%s%s", k ? ", " : "", deps[k]);
        if (n > (int) DEPENDENTS_NAMED_MAX)
                fprintf(f, ", ... (%d more)", n - (int) DEPENDENTS_NAMED_MAX);
        if (fclose(f) != 0)
                return -ENOMEM;
        /* Worded for forkd's REST API v1, whose callers pass ?cascade and ?force. */
        return sd_bus_error_setf(error, FORKD_ERROR_HAS_DEPENDENTS,
                                 "snapshot `%s` is the parent of %d chained snapshot(s): [%s]; rerun with "
                                 "`?cascade=true` to delete the whole subtree, or `?force=true` to orphan the "
                                 "children (they will fail to restore)",
                                 i->tag, n, list ?: "");
}

static int delete_one(Manager *m, Image *i, sd_bus_error *error) {
        _cleanup_free_ char *tag = strdup(i->tag);
        int r;

        if (!tag)
                return -ENOMEM;
        r = image_delete(i);
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Failed to delete snapshot %s: %m", tag);
        log_info("Snapshot %s deleted.", tag);
        image_send_signal(m, tag, false);
        return 0;
}

int chain_delete(Image *i, bool cascade, bool force, sd_bus_message *message, sd_bus_error *error) {
        _cleanup_(strv_freep) char **deps = NULL, **tree = NULL;
        Manager *m = i->manager;
        int n, r;

        n = image_dependents(m, i->tag, &deps);
        if (n < 0)
                return n;
        if (n > 0 && !cascade && !force)
                return dependents_error(i, deps, n, error);
        if (n == 0 || force) {
                if (i->n_users > 0)
                        return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "A fork of snapshot %s is in progress.",
                                                 i->tag);
                if (n > 0) {
                        r = subtree(m, i->tag, &tree);
                        if (r < 0)
                                return r;
                        detach_templates(m, tree);
                        log_info("Deleting snapshot %s with force: %d chained snapshot(s) orphaned.", i->tag, n);
                }
                r = delete_one(m, i, error);
                if (r < 0)
                        return r;
                return sd_bus_reply_method_return(message, NULL);
        }

        /* cascade: the whole subtree, children first; nothing goes while any of it is in use */
        r = subtree(m, i->tag, &tree);
        if (r < 0)
                return sd_bus_error_set_errnof(error, r, "Failed to walk the snapshots chained on %s: %m", i->tag);
        for (char **t = tree; *t; t++) {
                Image *d = hashmap_get(m->images, *t);

                /* cascade deletes snapshots, never a sandbox's paused state behind its back. */
                if (snapshot_tag_is_forkds(*t))
                        return sd_bus_error_setf(error, FORKD_ERROR_HAS_DEPENDENTS,
                                                 "snapshot `%s` holds the state of a paused or resumed sandbox "
                                                 "(%s); delete that sandbox first, or rerun with `?force=true` to "
                                                 "orphan it (it will fail to resume)", i->tag, *t);
                if (d && d->n_users > 0)
                        return sd_bus_error_setf(error, FORKD_ERROR_BUSY,
                                                 "A fork or compact of snapshot %s (in the subtree of %s) is in "
                                                 "progress.", d->tag, i->tag);
                if (branch_in_flight(m, *t))
                        return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "A branch to %s is being written.", *t);
        }
        log_info("Deleting snapshot %s and the %d snapshot(s) chained on it.", i->tag, r - 1);
        for (char **t = tree; *t; t++) {
                Image *d = hashmap_get(m->images, *t);

                if (!d)
                        continue;
                r = delete_one(m, d, error);
                if (r < 0)
                        return r;
        }
        return sd_bus_reply_method_return(message, NULL);
}

int chain_check_restorable(Manager *m, Image *i, sd_bus_error *error) {
        Image *a = i;

        for (unsigned depth = 0; a->meta.parent_tag[0]; depth++) {
                Image *p = hashmap_get(m->images, a->meta.parent_tag);

                if (depth > 64)
                        return sd_bus_error_setf(error, FORKD_ERROR_CHAIN_BROKEN,
                                                 "chain `%s` is deeper than 64 links (or loops)", i->tag);
                if (!p)
                        /* the words forkd-vmm uses (src/vmm/chain.c) */
                        return sd_bus_error_setf(error, FORKD_ERROR_CHAIN_BROKEN,
                                                 "chain `%s` references parent `%s`, which no longer exists "
                                                 "(deleted with force?); the chain cannot be restored: delete it, "
                                                 "or rebuild it with `forkctl snapshot diff --from %s`",
                                                 a->tag, a->meta.parent_tag, a->meta.parent_tag);
                a = p;
        }
        return 0;
}

/* ---- compact ---- */

typedef struct ChainCompact {
        Image *source;  /* n_users held while the operation runs */
        char *vmm_path, *src_dir, *dst_dir, *to;
        char *error;    /* out: forkd-vmm's words */
} ChainCompact;

static void chain_compact_free(void *p) {
        ChainCompact *c = p;

        if (!c)
                return;
        if (c->source)
                c->source->n_users--;
        free(c->vmm_path);
        free(c->src_dir);
        free(c->dst_dir);
        free(c->to);
        free(c->error);
        free(c);
}

/* Worker thread: forkd-vmm compact --snapshot SRC --tag TO DST; it answers one
 * JSON line on stdout: {"ok":true} or {"error":"...","errno":N}. */
static int compact_work(void *userdata) {
        Operation *o = userdata;
        ChainCompact *c = o->extra;
        const char *argv[] = { c->vmm_path, "compact", "--snapshot", c->src_dir, "--tag", c->to, c->dst_dir, NULL };
        _cleanup_free_ char *buf = NULL;
        struct json_object *j = NULL, *e;
        int pipefd[2], status = 0, r;
        pid_t parent = getpid(), pid;
        size_t len = 0;

        buf = malloc(COMPACT_REPLY_MAX + 1);
        if (!buf)
                return -ENOMEM;
        if (pipe2(pipefd, O_CLOEXEC) < 0)
                return -errno;
        /* fork rather than posix_spawn: the writer must die with forkd, and a forkd
         * killed before forkd-vmm's own PR_SET_PDEATHSIG would leave it writing a
         * staging directory that the next forkd has already swept (test-faults saw
         * a .compact-staging- left so). This thread waits for it, so it is the
         * parent that PR_SET_PDEATHSIG watches. */
        pid = fork();
        if (pid == 0) {
                (void) prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (getppid() != parent || dup2(pipefd[1], STDOUT_FILENO) < 0)
                        _exit(127);
                execve(c->vmm_path, (char *const *) argv, environ);
                _exit(127);
        }
        r = pid < 0 ? -errno : 0;
        safe_close(pipefd[1]);
        if (r < 0) {
                safe_close(pipefd[0]);
                return r;
        }
        for (;;) {
                ssize_t n = read(pipefd[0], buf + len, COMPACT_REPLY_MAX - len);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        break;
                len += (size_t) n;
                if (len == COMPACT_REPLY_MAX)
                        break;
        }
        buf[len] = 0;
        safe_close(pipefd[0]);
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return -errno;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
                return 0;

        r = -EIO;
        j = json_tokener_parse(buf);
        if (j && json_object_object_get_ex(j, "error", &e) && json_object_is_type(e, json_type_string)) {
                c->error = strndup(json_object_get_string(e), 1024);
                if (json_object_object_get_ex(j, "errno", &e) && json_object_is_type(e, json_type_int) &&
                    json_object_get_int(e) > 0 && json_object_get_int(e) < 4096)
                        r = -json_object_get_int(e);
        } else if (asprintf(&c->error, "forkd-vmm compact %s (see forkd's log)",
                            WIFSIGNALED(status) ? "was killed" : "failed") < 0)
                c->error = NULL;
        json_object_put(j);
        return r;
}

static void compact_done(int r, void *userdata) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Operation *o = userdata;
        ChainCompact *c = o->extra;
        Manager *m = o->manager;
        const char *reason = NULL;
        Image *i = NULL;

        if (r < 0) {
                log_error_errno(r, "Compacting %s into %s failed: %s", c->source->tag, c->to,
                                c->error ?: strerror(-r));
                (void) sd_bus_reply_method_errorf(o->message,
                                                  r == -ESTALE || r == -ENOLINK ? FORKD_ERROR_CHAIN_BROKEN :
                                                  r == -EEXIST                  ? FORKD_ERROR_SNAPSHOT_EXISTS :
                                                                                  FORKD_ERROR_FAILED,
                                                  "%s", c->error ?: strerror(-r));
                operation_free(o);
                return;
        }
        r = image_write_owner(c->dst_dir, o->owner_uid);
        if (r < 0)
                reason = "cannot record its owner in snapshot.json";
        else
                r = image_load(m, c->to, &i, &reason);
        if (r < 0) {
                log_error_errno(r, "The compacted snapshot %s does not load: %s", c->to, reason ?: "?");
                (void) rm_rf(c->dst_dir);
                (void) sd_bus_reply_method_errorf(o->message, FORKD_ERROR_FAILED,
                                                  "The compacted snapshot does not load: %s", reason ?: strerror(-r));
                operation_free(o);
                return;
        }
        log_info("Snapshot %s compacted into %s.", c->source->tag, i->tag);
        image_send_signal(m, i->tag, true);
        r = sd_bus_message_new_method_return(o->message, &reply);
        if (r >= 0)
                r = image_append_info(reply, i, false);
        if (r >= 0)
                r = sd_bus_send(NULL, reply, NULL);
        if (r < 0)
                (void) sd_bus_reply_method_errno(o->message, r, NULL);
        operation_free(o);
}

int chain_compact_start(Manager *m, sd_bus_message *message, const char *tag, const char *to,
                        sd_bus_error *error) {
        Operation *o = NULL;
        ChainCompact *c;
        struct stat st;
        Image *i;
        int r;

        i = hashmap_get(m->images, tag); /* polkit took a turn of the loop */
        if (!i)
                return sd_bus_error_setf(error, FORKD_ERROR_NO_SUCH_SNAPSHOT, "No snapshot with tag %s.", tag);
        r = chain_check_restorable(m, i, error);
        if (r < 0)
                return r;
        if (hashmap_size(m->images) + hashmap_size(m->creating) >= SNAPSHOTS_MAX)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "At most %u snapshots.", SNAPSHOTS_MAX);

        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->vmm_path = strdup(m->vmm_path);
        c->src_dir = strdup(i->dir);
        c->to = strdup(to);
        if (asprintf(&c->dst_dir, "%s/%s", m->snapshots_dir, to) < 0)
                c->dst_dir = NULL;
        if (!c->vmm_path || !c->src_dir || !c->to || !c->dst_dir) {
                chain_compact_free(c);
                return -ENOMEM;
        }
        if (lstat(c->dst_dir, &st) >= 0) {
                r = sd_bus_error_setf(error, FORKD_ERROR_SNAPSHOT_EXISTS,
                                      "%s exists on disk (a snapshot that failed to load?); remove it first.",
                                      c->dst_dir);
                chain_compact_free(c);
                return r;
        }

        r = operation_begin(m, message, to, &o, error);
        if (r < 0) {
                chain_compact_free(c);
                return r;
        }
        c->source = i;
        i->n_users++;
        o->extra = c;
        o->free_extra = chain_compact_free;
        r = operation_submit(o, compact_work, compact_done);
        if (r > 0)
                log_info("Compacting snapshot %s into %s.", tag, to);
        return r;
}
