/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Branching a running sandbox: see branch.h. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "branch.h"
#include "cgroup.h"
#include "confine.h"
#include "fs-util.h"
#include "bus-info.h"
#include "image.h"
#include "json-util.h"
#include "macro.h"
#include "operation.h"
#include "paused.h"
#include "sandbox.h"
#include "snapshot-meta.h"
#include "uid-range.h"
#include "vm-template.h"

#define CONTROL_REPLY_MAX (64u << 10)

static BranchOp *branch_op_free(BranchOp *b) {
        if (!b)
                return NULL;
        if (b->tag && hashmap_get(b->manager->branching, b->tag) == b)
                hashmap_remove(b->manager->branching, b->tag);
        b->result_source = sd_event_source_disable_unref(b->result_source);
        safe_close(b->result_fd);
        safe_close(b->staging_fd);
        free(b->staging_name);
        if (b->message) {
                (void) sd_bus_reply_method_errorf(b->message, FORKD_ERROR_FAILED, OPERATION_SHUTTING_DOWN);
                sd_bus_message_unref(b->message);
        }
        if (b->done)
                b->done(b->manager, -ESHUTDOWN, NULL, 0, OPERATION_SHUTTING_DOWN, b->userdata);
        free(b->source_id);
        free(b->tag);
        free(b->dir);
        free(b->parent_tag);
        free(b->image_config);
        free(b->parent_dir);
        free(b->error);
        free(b);
        return NULL;
}

static char *free_staging_name(char *name) {
        free(name);
        return NULL;
}

/* The staging directory forkd made, removed (nothing renamed it into place). */
static void staging_remove(BranchOp *b) {
        _cleanup_free_ char *path = NULL;

        if (b->staging_name && asprintf(&path, "%s/%s", b->manager->snapshots_dir, b->staging_name) >= 0)
                (void) rm_rf(path);
        b->staging_name = free_staging_name(b->staging_name);
        b->staging_fd = safe_close(b->staging_fd);
}

/* One descriptor, with one byte, on a socket. */
static int send_fd(int sock, int fd) {
        char cbuf[CMSG_SPACE(sizeof(int))] = {}, byte = 0;
        struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);

        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
        return sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 ? -errno : 0;
}

static unsigned count_state(Manager *m, int state, bool equal) {
        HashmapIter it = {};
        unsigned n = 0;
        void *v;

        while (hashmap_iterate(m->branching, &it, &v))
                if ((((BranchOp *) v)->state == (unsigned) state) == equal)
                        n++;
        return n;
}

static void branch_fail(BranchOp *b, const char *fmt, ...) _printf_(2, 3);
static void branch_fail(BranchOp *b, const char *fmt, ...) {
        _cleanup_free_ char *msg = NULL;
        va_list ap;

        va_start(ap, fmt);
        if (vasprintf(&msg, fmt, ap) < 0)
                msg = NULL;
        va_end(ap);
        log_warning("Branch %s of %s failed: %s", b->tag, b->source_id, msg ?: "out of memory");
        if (b->copy_pid > 0) {
                /* A copy that died half-way leaves its staging directory. */
                _cleanup_free_ char *staging = NULL;
                if (asprintf(&staging, "%s.tmp.%d", b->dir, (int) b->copy_pid) >= 0)
                        (void) rm_rf(staging);
        }
        staging_remove(b); /* the one forkd made, maybe before its writer was known */
        if (b->done) {
                branch_done_t done = TAKE_PTR(b->done);
                void *userdata = b->userdata;
                Manager *m = b->manager;

                branch_op_free(b);
                done(m, -EIO, NULL, 0, msg ?: "Out of memory", userdata);
                return;
        }
        if (b->message) {
                (void) sd_bus_reply_method_errorf(b->message, FORKD_ERROR_FAILED, "%s", msg ?: "Out of memory");
                b->message = sd_bus_message_unref(b->message);
        } else if (b->state == BRANCH_WRITING && b->wait == false && !b->manager->exiting && msg &&
                   count_state(b->manager, BRANCH_FAILED, true) < BRANCH_FAILED_MAX) {
                /* Answered "writing" already: say "failed" where it was listed. */
                b->state = BRANCH_FAILED;
                b->error = TAKE_PTR(msg);
                b->result_source = sd_event_source_disable_unref(b->result_source);
                b->result_fd = safe_close(b->result_fd);
                return;
        }
        branch_op_free(b);
}

bool branch_failed(Manager *m, const char *tag) {
        BranchOp *b = m->branching ? hashmap_get(m->branching, tag) : NULL;
        return b && b->state == BRANCH_FAILED;
}

uid_t branch_failed_owner(Manager *m, const char *tag) {
        BranchOp *b = m->branching ? hashmap_get(m->branching, tag) : NULL;
        return b ? b->owner_uid : 0;
}

void branch_forget_failed(Manager *m, const char *tag) {
        if (branch_failed(m, tag))
                branch_op_free(hashmap_get(m->branching, tag));
}

static int append_branch_fields(sd_bus_message *reply, BranchOp *b, const char *status) {
        return sd_bus_message_append(reply, "{sv}{sv}{sv}{sv}", "branched_from", "s", b->source_id, "pause_ms", "t",
                                     (b->pause_us + 500) / 1000, "pause_us", "t", b->pause_us, "status", "s",
                                     status);
}

/* SnapshotInfo of a branch not written yet. */
static int append_writing_info(sd_bus_message *reply, BranchOp *b) {
        int r;

        r = sd_bus_message_open_container(reply, 'a', "{sv}");
        if (r >= 0)
                r = sd_bus_message_append(reply, "{sv}{sv}{sv}{sv}", "tag", "s", b->tag, "dir", "s", b->dir,
                                          "created_at_unix", "t", b->started_at, "owner_uid", "u",
                                          (uint32_t) b->owner_uid);
        if (r >= 0)
                r = append_branch_fields(reply, b, b->state == BRANCH_FAILED ? "failed" : "writing");
        if (r >= 0 && b->error)
                r = sd_bus_message_append(reply, "{sv}", "error", "s", b->error);
        if (r >= 0)
                r = sd_bus_message_close_container(reply);
        return r;
}

static void reply_info(BranchOp *b, Image *i) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        int r;

        if (!b->message)
                return;
        r = sd_bus_message_new_method_return(b->message, &reply);
        if (r >= 0 && i) {
                r = sd_bus_message_open_container(reply, 'a', "{sv}");
                if (r >= 0)
                        r = image_append_info_fields(reply, i, false);
                /* image_append_info_fields() said "ready" already, and gave branched_from
                 * and the pause from snapshot.json where the writer recorded them */
                if (r >= 0 && !i->meta.branched_from[0])
                        r = sd_bus_message_append(reply, "{sv}{sv}{sv}", "branched_from", "s", b->source_id,
                                                  "pause_ms", "t", (b->pause_us + 500) / 1000, "pause_us", "t",
                                                  b->pause_us);
                if (r >= 0 && i->meta.parent_content_hash[0])
                        r = sd_bus_message_append(reply, "{sv}", "parent_content_hash", "s",
                                                  i->meta.parent_content_hash);
                if (r >= 0)
                        r = sd_bus_message_close_container(reply);
        } else if (r >= 0)
                r = append_writing_info(reply, b);
        if (r >= 0)
                r = sd_bus_send(NULL, reply, NULL);
        if (r < 0)
                (void) sd_bus_reply_method_errno(b->message, r, NULL);
        b->message = sd_bus_message_unref(b->message);
}

static void branch_written(BranchOp *b) {
        Manager *m = b->manager;
        const char *reason = NULL;
        Image *i = NULL;
        int r;

        r = image_write_meta(b->dir, b->owner_uid, b->source_agent_tcp ? 1 : -1, b->image_config);
        if (r < 0)
                reason = "cannot record its owner in snapshot.json";
        else
                r = image_load(m, b->tag, &i, &reason);
        if (r < 0) {
                (void) rm_rf(b->dir);
                branch_fail(b, "The branch snapshot does not load: %s", reason ?: strerror(-r));
                return;
        }
        log_info("Branched %s into snapshot %s (mode %s, paused %llu us).", b->source_id, b->tag, b->mode,
                 (unsigned long long) b->pause_us);
        if (b->done) {
                /* Not announced: the caller's (a pause's snapshot is forkd's own). */
                branch_done_t done = TAKE_PTR(b->done);
                void *userdata = b->userdata;
                uint64_t pause_us = b->pause_us;

                branch_op_free(b);
                done(m, 0, i, pause_us, NULL, userdata);
                return;
        }
        image_send_signal(m, i->tag, true);
        reply_info(b, i);
        if (snapshot_tag_is_forkds(b->tag)) {
                /* An adopted pause (branch_adopt_staging()): nothing needs it now. */
                _cleanup_free_ char *tag = strdup(b->tag);

                branch_op_free(b);
                if (tag)
                        paused_snapshot_gc(m, tag);
                return;
        }
        branch_op_free(b);
}

#define BRANCH_RESULT_FDS_MAX 250u /* the writer's SNAPSHOT_HANDOFF_MAX */

/* A name the writer may leave to forkd: a file of the snapshot directory itself. */
static bool link_name_is_valid(const char *name) {
        return name[0] && name[0] != '.' && strlen(name) < 32 && !strchr(name, '/');
}

/* A copy of fd's data, its size, as dfd/name (0640), synced. */
static int copy_into(int fd, int dfd, const char *name) {
        _cleanup_close_ int out = -EBADF;
        struct stat st;
        loff_t in = 0;

        if (fstat(fd, &st) < 0)
                return -errno;
        out = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
        if (out < 0)
                return -errno;
        while (in < st.st_size) {
                ssize_t n = copy_file_range(fd, &in, out, NULL, (size_t) MIN(st.st_size - in, (off_t) 1 << 30), 0);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0)
                        return -EIO;
        }
        return fsync(out) < 0 ? -errno : 0;
}

/* Links each file the writer handed over (fds, in the order of the names in
 * links) into the staging directory: root may link what the VMM's id may not
 * (fs.protected_hardlinks). Only a regular file of a VMM's id is linked (the
 * writer holds it open anyway, and its registration hands it to the VMM user,
 * which it is already); any other is copied, so no file outside the VMMs'
 * becomes part of a snapshot. */
static int link_handed_over(BranchOp *b, struct json_object *links, const int *fds, size_t n_fds,
                            const char **ret_why) {
        Manager *m = b->manager;
        size_t n = links ? json_object_array_length(links) : 0;

        if (n != n_fds || (n > 0 && b->staging_fd < 0)) {
                *ret_why = "its files to link do not match their descriptors";
                return -EBADMSG;
        }
        for (size_t i = 0; i < n; i++) {
                struct json_object *e = json_object_array_get_idx(links, i);
                const char *name = json_object_is_type(e, json_type_string) ? json_object_get_string(e) : "";
                char proc[64];
                struct stat st;

                int r;

                if (!link_name_is_valid(name) || fstat(fds[i], &st) < 0 || !S_ISREG(st.st_mode)) {
                        *ret_why = "it handed over something that is not a file of a snapshot";
                        return -EPERM;
                }
                if (st.st_uid != m->vmm_uid && !uid_range_contains(&m->vmm_uids, st.st_uid)) {
                        r = copy_into(fds[i], b->staging_fd, name);
                        if (r < 0) {
                                *ret_why = "copying a file it handed over failed";
                                return r;
                        }
                        continue;
                }
                snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fds[i]);
                if (linkat(AT_FDCWD, proc, b->staging_fd, name, AT_SYMLINK_FOLLOW) < 0) {
                        *ret_why = "linking a file it handed over failed";
                        return -errno;
                }
        }
        if (n > 0 && fsync(b->staging_fd) < 0) {
                *ret_why = "syncing the snapshot directory failed";
                return -errno;
        }
        return 0;
}

static int on_result(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        _cleanup_json_ struct json_object *o = NULL;
        BranchOp *b = userdata;
        _cleanup_free_ char *buf = malloc(CONTROL_REPLY_MAX + 1);
        char cbuf[CMSG_SPACE(sizeof(int) * BRANCH_RESULT_FDS_MAX)];
        int fds[BRANCH_RESULT_FDS_MAX];
        struct iovec iov = { .iov_base = buf, .iov_len = CONTROL_REPLY_MAX };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
        struct json_object *ok, *err, *links = NULL;
        const char *perr = NULL, *why = NULL;
        size_t n_fds = 0;
        ssize_t n;
        int r;

        if (!buf)
                return log_oom();
        n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return 0;
        for (struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c)) {
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                        continue;
                for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                        int k;

                        memcpy(&k, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                        if (n_fds < ELEMENTSOF(fds))
                                fds[n_fds++] = k;
                        else
                                safe_close(k);
                }
        }
        if (n <= 0) {
                branch_fail(b, "The process writing the snapshot exited without a word (killed?).");
                return 0;
        }
        if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
            json_parse_strict(buf, (size_t) n, CONTROL_REPLY_MAX, 4, &o, &perr) < 0 ||
            !json_object_object_get_ex(o, "ok", &ok) || !json_object_is_type(ok, json_type_boolean) ||
            (json_object_object_get_ex(o, "links", &links) && !json_object_is_type(links, json_type_array))) {
                for (size_t i = 0; i < n_fds; i++)
                        safe_close(fds[i]);
                branch_fail(b, "Malformed report from the process writing the snapshot.");
                return 0;
        }
        if (!json_object_get_boolean(ok)) {
                for (size_t i = 0; i < n_fds; i++)
                        safe_close(fds[i]);
                branch_fail(b, "%s",
                            json_object_object_get_ex(o, "error", &err) && json_object_is_type(err, json_type_string) ?
                                    json_object_get_string(err) :
                                    "writing the snapshot failed");
                return 0;
        }
        r = link_handed_over(b, links, fds, n_fds, &why);
        for (size_t i = 0; i < n_fds; i++)
                safe_close(fds[i]);
        if (r >= 0 && b->staging_name) {
                r = confine_staging_finish(b->manager->snapshots_dir, b->staging_name, b->tag);
                if (r < 0)
                        why = "renaming it into place failed";
                else
                        b->staging_name = free_staging_name(b->staging_name);
        }
        if (r < 0) {
                branch_fail(b, "Finishing the snapshot: %s (%s).", why, strerror(-r));
                return 0;
        }
        b->staging_fd = safe_close(b->staging_fd);
        branch_written(b);
        return 0;
}

/* The VMM answered the branch request: the sandbox runs again. */
static void on_control_reply(ControlWaiter *w, struct json_object *o, const char *why) {
        BranchOp *b = (BranchOp *) w;
        const char *reason;
        int r;

        b->sandbox = NULL;
        if (!o) {
                branch_fail(b, "%s", why);
                return;
        }
        r = control_pause_reply_parse(o, &b->pause_us, &b->copy_pid, &reason);
        if (r == -EPERM) {
                branch_fail(b, "The VMM of %s refused the branch: %s", b->source_id, reason);
                return;
        }
        if (r < 0) {
                branch_fail(b, "Malformed control reply from the VMM of %s.", b->source_id);
                return;
        }
        histogram_observe(&b->manager->branch_pause, b->pause_us);
        if (b->source_has_cgroup)
                (void) cgroup_detach(b->manager->cgroups, b->copy_pid);
        if (b->staging_name) {
                /* Named after its writer now, as a writer names its own ("<tag>.tmp.<pid>"). */
                _cleanup_free_ char *name = NULL;

                if (asprintf(&name, "%s.tmp.%d", b->tag, (int) b->copy_pid) < 0) {
                        branch_fail(b, "Out of memory.");
                        return;
                }
                r = confine_staging_rename(b->manager->snapshots_dir, b->staging_name, name);
                if (r < 0) {
                        branch_fail(b, "Failed to name the branch's directory after its writer: %s", strerror(-r));
                        return;
                }
                free(b->staging_name);
                b->staging_name = TAKE_PTR(name);
        }
        b->state = BRANCH_WRITING;
        r = sd_event_add_io(b->manager->event, &b->result_source, b->result_fd, EPOLLIN, on_result, b);
        if (r < 0) {
                branch_fail(b, "Failed to watch the branch: %s", strerror(-r));
                return;
        }
        (void) sd_event_source_set_description(b->result_source, "branch-result");
        if (!b->wait)
                reply_info(b, NULL); /* live, wait false: status "writing" */
}

static void control_drop(Sandbox *s, const char *why);

/* A VMM that has not answered a control request in m->control_timeout_usec
 * (stopped, or stuck) is not waited for for ever: every waiter gets an error
 * and the sandbox is killed, since its VMM may still act on the request. */
static int on_control_timeout(sd_event_source *es, uint64_t usec, void *userdata) {
        Sandbox *s = userdata;
        char why[256];

        (void) snprintf(why, sizeof(why), "The VMM of sandbox %s did not answer within %llu s; the sandbox was killed.",
                        s->id, (unsigned long long) (s->manager->control_timeout_usec / 1000000));
        log_error("%s", why);
        (void) sandbox_kill(s);
        control_drop(s, why);
        return 0;
}

/* Armed from now while requests wait for their replies; off when none does. */
static int control_timer_arm(Sandbox *s) {
        uint64_t now;
        int r;

        if (!s->ctl_waiters) {
                s->control_timer = sd_event_source_disable_unref(s->control_timer);
                return 0;
        }
        r = sd_event_now(s->manager->event, CLOCK_MONOTONIC, &now);
        if (r < 0)
                return r;
        if (s->control_timer) {
                r = sd_event_source_set_time(s->control_timer, now + s->manager->control_timeout_usec);
                if (r >= 0)
                        r = sd_event_source_set_enabled(s->control_timer, SD_EVENT_ONESHOT);
                return r;
        }
        r = sd_event_add_time(s->manager->event, &s->control_timer, CLOCK_MONOTONIC,
                              now + s->manager->control_timeout_usec, 0, on_control_timeout, s);
        if (r >= 0)
                (void) sd_event_source_set_description(s->control_timer, "sandbox-control-timeout");
        return r;
}

static void control_drop(Sandbox *s, const char *why) {
        s->control_source = sd_event_source_disable_unref(s->control_source);
        s->control_timer = sd_event_source_disable_unref(s->control_timer);
        while (s->ctl_waiters) {
                ControlWaiter *w = s->ctl_waiters;
                s->ctl_waiters = w->next;
                w->next = NULL;
                w->reply(w, NULL, why);
        }
}

static int on_control_io(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        Sandbox *s = userdata;

        for (;;) {
                _cleanup_json_ struct json_object *o = NULL;
                static char buf[CONTROL_REPLY_MAX + 1];
                const char *perr = NULL;
                ControlWaiter *w;
                ssize_t n;

                n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
                if (n < 0 && (errno == EAGAIN || errno == EINTR))
                        return 0;
                if (n <= 0) {
                        control_drop(s, "The sandbox's VMM closed its control socket during the branch.");
                        return 0;
                }
                if (json_parse_strict(buf, (size_t) n, CONTROL_REPLY_MAX, 4, &o, &perr) < 0 ||
                    json_object_object_get_ex(o, "event", NULL))
                        continue; /* not a reply */
                w = s->ctl_waiters;
                if (!w)
                        continue; /* nobody asked */
                s->ctl_waiters = w->next;
                w->next = NULL;
                (void) control_timer_arm(s); /* the next request's clock, or none */
                w->reply(w, o, NULL);
        }
}

void branch_sandbox_gone(Sandbox *s) {
        control_drop(s, "The sandbox exited during the branch.");
}

bool branch_in_flight(Manager *m, const char *tag) {
        BranchOp *b = m->branching ? hashmap_get(m->branching, tag) : NULL;
        return b && b->state != BRANCH_FAILED;
}

int branch_append_in_flight(sd_bus_message *reply, Manager *m) {
        HashmapIter it = {};
        void *v;
        int r;

        while (hashmap_iterate(m->branching, &it, &v)) {
                BranchOp *b = v;

                if (b->state == BRANCH_PAUSING || b->done)
                        continue; /* a pause's: forkd's own */
                r = append_writing_info(reply, b);
                if (r < 0)
                        return r;
        }
        return 0;
}

void branch_free_all(Manager *m) {
        while (m->branching && hashmap_size(m->branching) > 0)
                branch_op_free(hashmap_first(m->branching));
}

static int on_copy_exit(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        BranchOp *b = userdata;

        /* A writer that found forkd gone marked its directory whole: forkd's to rename. */
        if (access(b->dir, F_OK) < 0 && b->staging_name &&
            confine_staging_is_whole(b->manager->snapshots_dir, b->staging_name) &&
            confine_staging_finish(b->manager->snapshots_dir, b->staging_name, b->tag) >= 0)
                b->staging_name = free_staging_name(b->staging_name);
        if (access(b->dir, F_OK) < 0) {
                branch_fail(b, "The process writing the snapshot exited without finishing it.");
                return 0;
        }
        b->staging_name = free_staging_name(b->staging_name);
        branch_written(b);
        return 0;
}

int branch_adopt_staging(Manager *m, const char *name) {
        _cleanup_free_ char *tag = NULL, *comm_path = NULL;
        const char *dot = strrchr(name, '.');
        char comm[32] = "";
        unsigned long pid;
        BranchOp *b;
        FILE *f;
        int fd, r;

        /* name is "<tag>.tmp.<pid>" (is_staging_name()) */
        if (!dot || dot - name < 5)
                return 0;
        pid = strtoul(dot + 1, NULL, 10);
        tag = strndup(name, (size_t) (dot - name) - 4);
        if (!tag || pid == 0 || pid > INT32_MAX || !snapshot_tag_is_valid(tag) || hashmap_get(m->images, tag) ||
            hashmap_get(m->branching, tag))
                return 0;
        if (asprintf(&comm_path, "/proc/%lu/comm", pid) < 0)
                return -ENOMEM;
        f = fopen(comm_path, "re");
        if (!f)
                return 0;
        if (!fgets(comm, sizeof(comm), f))
                comm[0] = 0;
        fclose(f);
        if (strcmp(comm, "forkd-branch\n") != 0)
                return 0;
        fd = (int) syscall(SYS_pidfd_open, (pid_t) pid, 0);
        if (fd < 0)
                return 0;

        b = calloc(1, sizeof(*b));
        if (!b) {
                safe_close(fd);
                return -ENOMEM;
        }
        b->manager = m;
        b->wait = true;
        b->state = BRANCH_WRITING;
        b->staging_fd = -EBADF;
        b->staging_name = strdup(name);
        b->copy_pid = (pid_t) pid;
        b->started_at = (uint64_t) time(NULL);
        b->result_fd = fd; /* a pidfd: readable once the copy exited */
        snprintf(b->mode, sizeof(b->mode), "full");
        b->tag = TAKE_PTR(tag);
        b->source_id = strdup("");
        if (!b->source_id || !b->staging_name || asprintf(&b->dir, "%s/%s", m->snapshots_dir, b->tag) < 0) {
                b->dir = NULL;
                branch_op_free(b);
                return -ENOMEM;
        }
        r = hashmap_put(m->branching, b->tag, b);
        if (r >= 0)
                r = sd_event_add_io(m->event, &b->result_source, fd, EPOLLIN, on_copy_exit, b);
        if (r < 0) {
                branch_op_free(b);
                return r;
        }
        return 1;
}

int control_pause_reply_parse(struct json_object *o, uint64_t *ret_pause_us, pid_t *ret_pid,
                              const char **ret_reason) {
        struct json_object *ok, *v, *p;

        if (!json_object_object_get_ex(o, "ok", &ok) || !json_object_is_type(ok, json_type_boolean))
                return -EBADMSG;
        if (!json_object_get_boolean(ok)) {
                *ret_reason = json_object_object_get_ex(o, "error", &v) && json_object_is_type(v, json_type_string) ?
                                      json_object_get_string(v) :
                                      "no reason given";
                return -EPERM;
        }
        if (!json_object_object_get_ex(o, "pause_us", &v) || !json_object_is_type(v, json_type_int) ||
            json_object_get_int64(v) < 0 || !json_object_object_get_ex(o, "pid", &p) ||
            !json_object_is_type(p, json_type_int) || json_object_get_int64(p) <= 0)
                return -EBADMSG;
        *ret_pause_us = (uint64_t) json_object_get_int64(v);
        *ret_pid = (pid_t) json_object_get_int64(p);
        return 0;
}

int sandbox_control_send(Sandbox *s, const char *request, int fd, ControlWaiter *w) {
        char cbuf[CMSG_SPACE(sizeof(int))] = {};
        struct iovec iov = { .iov_base = (void *) request, .iov_len = strlen(request) };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
        ControlWaiter **p;
        int r;

        if (s->control_fd < 0)
                return -ENOTCONN;
        if (!s->control_source) {
                r = sd_event_add_io(s->manager->event, &s->control_source, s->control_fd, EPOLLIN, on_control_io, s);
                if (r < 0)
                        return r;
                (void) sd_event_source_set_description(s->control_source, "sandbox-control");
        }
        if (fd >= 0) {
                struct cmsghdr *c;

                mh.msg_control = cbuf;
                mh.msg_controllen = sizeof(cbuf);
                c = CMSG_FIRSTHDR(&mh);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(c), &fd, sizeof(int));
        }
        if (sendmsg(s->control_fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
                return -errno;
        w->next = NULL;
        for (p = &s->ctl_waiters; *p; p = &(*p)->next)
                ;
        *p = w;
        if (!s->control_timer || w == s->ctl_waiters)
                (void) control_timer_arm(s); /* else it runs for the request ahead of this one */
        return 0;
}

static int send_request(Sandbox *s, BranchOp *b, int fd) {
        _cleanup_json_ struct json_object *req = json_object_new_object();

        if (!req)
                return -ENOMEM;
        json_object_object_add(req, "op", json_object_new_string("branch"));
        json_object_object_add(req, "dir", json_object_new_string(b->dir));
        json_object_object_add(req, "branched_from", json_object_new_string(b->source_id));
        json_object_object_add(req, "tag", json_object_new_string(b->tag));
        /* Into the directory forkd made, queued on the result socket (the writer may not reach snapshots/) */
        json_object_object_add(req, "staging", json_object_new_boolean(true));
        if (strcmp(b->mode, "diff") == 0) {
                /* Against the snapshot the sandbox was forked from. */
                json_object_object_add(req, "mode", json_object_new_string("diff"));
                json_object_object_add(req, "parent_dir", json_object_new_string(b->parent_dir));
                json_object_object_add(req, "parent_tag", json_object_new_string(b->parent_tag));
        } else
                json_object_object_add(req, "mode", json_object_new_string("full"));
        b->waiter.reply = on_control_reply;
        return sandbox_control_send(s, json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN), fd, &b->waiter);
}

/* The id s's VMM, and so its branch's writer, runs under: its own of
 * --vmm-uid-range; a child of a running sandbox's frozen copy (ForkSandbox)
 * that sandbox's, which the copy holds; else the VMM user. */
static uid_t writer_uid(const Sandbox *s) {
        if (s->vmm_uid > 0)
                return s->vmm_uid;
        if (s->template && s->template->vmm_uid > 0)
                return s->template->vmm_uid;
        return s->manager->vmm_uid;
}

int branch_start(Sandbox *s, const char *tag, const char *mode, bool wait, uid_t owner, sd_bus_message *message,
                 branch_done_t done, void *userdata, sd_bus_error *error) {
        Manager *m = s->manager;
        BranchOp *b;
        Image *src;
        struct stat st;
        int r, sv[2];

        if (branch_in_flight(m, tag))
                return sd_bus_error_setf(error, FORKD_ERROR_SNAPSHOT_EXISTS, "A branch to %s is in flight already.",
                                         tag);
        r = operation_check_tag_free(m, tag, error); /* not in flight, checked above */
        if (r < 0)
                return r;
        if (count_state(m, BRANCH_FAILED, false) >= m->max_branches)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY,
                                         "%u branches are in flight (the cap); retry after a short delay.",
                                         m->max_branches);
        if (hashmap_size(m->images) + hashmap_size(m->creating) + hashmap_size(m->branching) >= SNAPSHOTS_MAX)
                return sd_bus_error_setf(error, FORKD_ERROR_BUSY, "At most %u snapshots.", SNAPSHOTS_MAX);
        if (s->control_fd < 0)
                return sd_bus_error_setf(error, FORKD_ERROR_FAILED, "Sandbox %s has no control channel.", s->id);

        branch_forget_failed(m, tag); /* a new branch to a failed one's tag replaces it */
        b = calloc(1, sizeof(*b));
        if (!b)
                return -ENOMEM;
        b->manager = m;
        b->result_fd = -EBADF;
        b->staging_fd = -EBADF;
        b->wait = wait;
        b->owner_uid = owner;
        b->started_at = (uint64_t) time(NULL);
        snprintf(b->mode, sizeof(b->mode), "%s", mode);
        b->tag = strdup(tag);
        b->source_id = strdup(s->id);
        b->source_has_cgroup = s->has_cgroup;
        b->source_agent_tcp = s->netns_owned && strncmp(s->guest_addr, "agent:", 6) != 0;
        b->parent_tag = strdup(s->snapshot_tag);
        /* A branch of a sandbox of an OCI image keeps the image's config. */
        src = hashmap_get(m->images, s->snapshot_tag);
        if (src && src->meta.image_config[0] && !(b->image_config = strdup(src->meta.image_config))) {
                branch_op_free(b);
                return -ENOMEM;
        }
        if (!b->parent_tag || asprintf(&b->parent_dir, "%s/%s", m->snapshots_dir, s->snapshot_tag) < 0)
                b->parent_dir = NULL;
        if (!b->tag || !b->source_id || !b->parent_dir || asprintf(&b->dir, "%s/%s", m->snapshots_dir, tag) < 0) {
                b->dir = NULL;
                branch_op_free(b);
                return -ENOMEM;
        }
        if (lstat(b->dir, &st) >= 0) {
                branch_op_free(b);
                return sd_bus_error_setf(error, FORKD_ERROR_SNAPSHOT_EXISTS,
                                         "%s/%s exists on disk (a snapshot that failed to load?); remove it first.",
                                         m->snapshots_dir, tag);
        }
        r = hashmap_put(m->branching, b->tag, b);
        if (r < 0) {
                branch_op_free(b);
                return r;
        }
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0) {
                r = -errno;
                branch_op_free(b);
                return r;
        }
        b->result_fd = sv[0];
        /* Its writer's directory, made before the writer exists (named after it
         * once it does): the VMM takes it off the result socket with the request. */
        r = confine_staging_dir(m->snapshots_dir, tag, 0, m->confine ? writer_uid(s) : (uid_t) -1,
                                writer_uid(s) != m->vmm_uid ? (gid_t) writer_uid(s) : m->vmm_gid, &b->staging_name,
                                &b->staging_fd);
        if (r >= 0)
                r = send_fd(sv[0], b->staging_fd);
        if (r < 0) {
                safe_close(sv[1]);
                staging_remove(b);
                branch_op_free(b);
                return sd_bus_error_set_errnof(error, r, "Failed to make the branch's directory: %m");
        }
        r = send_request(s, b, sv[1]);
        safe_close(sv[1]);
        if (r < 0) {
                staging_remove(b);
                branch_op_free(b);
                return sd_bus_error_set_errnof(error, r, "Failed to ask the VMM of %s for a branch: %m", s->id);
        }
        b->message = done ? NULL : sd_bus_message_ref(message);
        b->done = done;
        b->userdata = userdata;
        b->sandbox = s;
        log_info("Branching %s into %s (mode %s).", s->id, b->tag, b->mode);
        return 0;
}

static int on_snapshots_event(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        Manager *m = userdata;
        char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));

        for (;;) {
                ssize_t n = read(fd, buf, sizeof(buf));

                if (n <= 0)
                        return 0;
                for (char *p = buf; p < buf + n;) {
                        const struct inotify_event *ev = (const struct inotify_event *) p;
                        const char *reason = NULL;
                        Image *i = NULL;

                        p += sizeof(*ev) + ev->len;
                        if (!(ev->mask & IN_MOVED_TO) || !(ev->mask & IN_ISDIR) || ev->len == 0 ||
                            !snapshot_tag_is_valid(ev->name) || strstr(ev->name, ".tmp."))
                                continue;
                        /* Ours to register: a CreateSnapshot or a branch in flight. */
                        if (hashmap_get(m->images, ev->name) || hashmap_get(m->creating, ev->name) ||
                            hashmap_get(m->branching, ev->name))
                                continue;
                        if (hashmap_size(m->images) >= SNAPSHOTS_MAX || image_load(m, ev->name, &i, &reason) < 0) {
                                log_warning("%s/%s appeared and does not load: %s", m->snapshots_dir, ev->name,
                                            reason ?: "too many snapshots");
                                continue;
                        }
                        log_info("Snapshot %s landed (a branch started before forkd restarted).", i->tag);
                        image_send_signal(m, i->tag, true);
                        /* A pause that forkd's kill cut short: its sandbox is gone, so is this. */
                        paused_snapshot_gc(m, ev->name);
                }
        }
}

int branch_watch_snapshots(Manager *m) {
        int r;

        m->snapshots_watch_fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
        if (m->snapshots_watch_fd < 0)
                return -errno;
        if (inotify_add_watch(m->snapshots_watch_fd, m->snapshots_dir, IN_MOVED_TO | IN_ONLYDIR) < 0)
                return -errno;
        r = sd_event_add_io(m->event, &m->snapshots_watch, m->snapshots_watch_fd, EPOLLIN, on_snapshots_event, m);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(m->snapshots_watch, "snapshots-watch");
        return 0;
}
