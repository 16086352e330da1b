/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#include <json-c/json.h>

#include "fork-options.h"
#include "json-util.h"
#include "macro.h"
#include "vmm-client.h"

#define CONTROL_REPLY_MAX (64u << 10)
#define SPAWN_BATCH 100
#define SPAWN_FDS_MAX 253 /* SCM_MAX_FD: the fds of one spawn message */
#define TEMPLATE_START_TIMEOUT_USEC (300 * 1000000ull)

int vmm_parse_user(const char *s, uid_t *ret_uid, gid_t *ret_gid) {
        unsigned long long u, g;
        char *end;

        errno = 0;
        u = strtoull(s, &end, 10);
        if (errno || end == s || (*end && *end != ':') || u == 0 || u >= UINT32_MAX || s[0] == '-')
                return -EINVAL;
        g = u;
        if (*end == ':') {
                const char *gs = end + 1;

                errno = 0;
                g = strtoull(gs, &end, 10);
                if (errno || end == gs || *end || g == 0 || g >= UINT32_MAX || gs[0] == '-')
                        return -EINVAL;
        }
        *ret_uid = (uid_t) u;
        *ret_gid = (gid_t) g;
        return 0;
}

static struct {
        bool enabled;
        char user[32];
        char *binds[ELEMENTSOF(((struct vmm_confine *) NULL)->binds)];
        unsigned n_binds;
} confine;

int vmm_client_set_confine(const struct vmm_confine *c) {
        for (unsigned i = 0; i < confine.n_binds; i++)
                free(confine.binds[i]);
        confine.n_binds = 0;
        confine.enabled = false;
        if (!c)
                return 0;
        if (c->n_binds > ELEMENTSOF(confine.binds) || c->uid == 0 || c->gid == 0)
                return -EINVAL;
        for (unsigned i = 0; i < c->n_binds; i++) {
                confine.binds[i] = strdup(c->binds[i]);
                if (!confine.binds[i])
                        return -ENOMEM;
                confine.n_binds = i + 1;
        }
        snprintf(confine.user, sizeof(confine.user), "%u:%u", (unsigned) c->uid, (unsigned) c->gid);
        confine.enabled = true;
        return 0;
}

/* Appends --confine and the --jail-link options for links (when not NULL),
 * else the --jail-bind ones, to argv at *n (room for 2 + 2 *
 * VMM_CLIENT_JAIL_LINKS_MAX more). */
static int add_confine_args(const char **argv, unsigned *n, const char *const *links) {
        if (!confine.enabled)
                return 0;
        argv[(*n)++] = "--confine";
        argv[(*n)++] = confine.user;
        if (links) {
                for (unsigned i = 0; links[i]; i++) {
                        if (i >= VMM_CLIENT_JAIL_LINKS_MAX)
                                return -E2BIG;
                        argv[(*n)++] = "--jail-link";
                        argv[(*n)++] = links[i];
                }
                return 0;
        }
        for (unsigned i = 0; i < confine.n_binds; i++) {
                argv[(*n)++] = "--jail-bind";
                argv[(*n)++] = confine.binds[i];
        }
        return 0;
}

/* fork+exec argv with the given fds placed at 3, 4, ... in the child. */
static int spawn_with_fds(char *const argv[], const int *fds, unsigned n_fds, pid_t *ret_pid) {
        pid_t parent = getpid(), pid;

        pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                int tmp[32];

                if (n_fds > ELEMENTSOF(tmp))
                        _exit(127);
                (void) prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (getppid() != parent)
                        _exit(127);
                /* Move the fds out of the way first, then into place. */
                for (unsigned i = 0; i < n_fds; i++) {
                        tmp[i] = fcntl(fds[i], F_DUPFD, 100);
                        if (tmp[i] < 0)
                                _exit(127);
                }
                for (unsigned i = 0; i < n_fds; i++)
                        if (dup2(tmp[i], 3 + i) < 0)
                                _exit(127);
                for (int fd = 3 + n_fds; fd < 1024; fd++)
                        close(fd);
                execv(argv[0], argv);
                _exit(127);
        }
        *ret_pid = pid;
        return 0;
}

int vmm_client_boot(const struct vmm_boot_args *a, struct vmm_proc *ret) {
        int agent[2] = { -1, -1 }, ctl[2] = { -1, -1 };
        char mem[32], vcpus[16], vol[VMM_CLIENT_VOLUMES_MAX][320];
        const char *argv[36 + VMM_CLIENT_VOLUMES_MAX + 2 * VMM_CLIENT_JAIL_LINKS_MAX];
        int fds[3 + VMM_CLIENT_VOLUMES_MAX];
        unsigned n = 0, n_fds;
        pid_t pid = 0;
        int r;

        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, agent) < 0)
                return -errno;
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl) < 0) {
                r = -errno;
                goto fail;
        }
        snprintf(mem, sizeof(mem), "%llu", (unsigned long long) a->mem_mib);

        argv[n++] = a->vmm_path;
        argv[n++] = "boot";
        argv[n++] = "--kernel";
        argv[n++] = a->kernel;
        argv[n++] = "--disk";
        argv[n++] = a->disk;
        if (a->mem_mib > 0) {
                argv[n++] = "--mem-mib";
                argv[n++] = mem;
        }
        if (a->vcpus > 1) {
                snprintf(vcpus, sizeof(vcpus), "%u", a->vcpus);
                argv[n++] = "--vcpus";
                argv[n++] = vcpus;
        }
        argv[n++] = "--agent-fd=3";
        argv[n++] = "--control-fd=4";
        if (a->id) {
                argv[n++] = "--id";
                argv[n++] = a->id;
        }
        if (a->console_log) {
                argv[n++] = "--console-log";
                argv[n++] = a->console_log;
        }
        if (a->overlay_dir) {
                argv[n++] = "--overlay-dir";
                argv[n++] = a->overlay_dir;
        }
        if (a->cmdline) {
                argv[n++] = "--cmdline";
                argv[n++] = a->cmdline;
        }
        if (a->with_net)
                argv[n++] = "--net-tap-fd=5";
        fds[0] = agent[1];
        fds[1] = ctl[1];
        n_fds = 2;
        if (a->with_net)
                fds[n_fds++] = a->net_tap_fd;
        if (a->n_volumes > VMM_CLIENT_VOLUMES_MAX) {
                r = -E2BIG;
                goto fail;
        }
        for (unsigned i = 0; i < a->n_volumes; i++) {
                snprintf(vol[i], sizeof(vol[i]), "--volume-fd=%u:%s:%s", 3 + n_fds, a->volumes[i].mode,
                         a->volumes[i].guest_path);
                argv[n++] = vol[i];
                fds[n_fds++] = a->volumes[i].fd;
        }
        r = add_confine_args(argv, &n, a->jail_links);
        if (r < 0)
                goto fail;
        argv[n] = NULL;

        r = spawn_with_fds((char *const *) argv, fds, n_fds, &pid);
        if (r < 0)
                goto fail;
        safe_close(agent[1]);
        safe_close(ctl[1]);
        *ret = (struct vmm_proc) { .pid = pid, .control_fd = ctl[0], .agent_fd = agent[0] };
        return 0;
fail:
        safe_close(agent[0]);
        safe_close(agent[1]);
        safe_close(ctl[0]);
        safe_close(ctl[1]);
        return r;
}

static int recv_json(int fd, uint64_t deadline, struct json_object **ret) {
        /* Heap, not static: the daemon calls this from worker threads. */
        _cleanup_free_ char *buf = malloc(CONTROL_REPLY_MAX + 1);

        if (!buf)
                return -ENOMEM;

        for (;;) {
                uint64_t now = now_usec();
                struct pollfd p = { .fd = fd, .events = POLLIN };
                const char *err;
                ssize_t n;
                int r;

                if (now >= deadline)
                        return -ETIMEDOUT;
                r = poll(&p, 1, (int) ((deadline - now + 999) / 1000));
                if (r < 0 && errno != EINTR)
                        return -errno;
                if (r <= 0)
                        continue;
                n = recv(fd, buf, CONTROL_REPLY_MAX + 1, MSG_DONTWAIT);
                if (n < 0) {
                        if (errno == EAGAIN || errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        return -ECONNRESET;
                if ((size_t) n > CONTROL_REPLY_MAX)
                        return -EMSGSIZE;
                return json_parse_strict(buf, n, CONTROL_REPLY_MAX, 8, ret, &err);
        }
}

int vmm_client_control(int control_fd, const char *request, uint64_t timeout_usec, char **ret_reply) {
        return vmm_client_control_fd(control_fd, request, -EBADF, timeout_usec, ret_reply);
}

int vmm_client_control_fd(int control_fd, const char *request, int fd, uint64_t timeout_usec, char **ret_reply) {
        uint64_t deadline = now_usec() + timeout_usec;
        char cbuf[CMSG_SPACE(sizeof(int))] = {};
        struct iovec iov = { .iov_base = (void *) request, .iov_len = strlen(request) };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

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
        if (sendmsg(control_fd, &mh, MSG_NOSIGNAL) < 0)
                return -errno;
        for (;;) {
                struct json_object *o = NULL, *ev;
                int r = recv_json(control_fd, deadline, &o);

                if (r < 0)
                        return r;
                if (json_object_object_get_ex(o, "event", &ev)) {
                        json_object_put(o);
                        continue;
                }
                if (ret_reply) {
                        *ret_reply = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
                        if (!*ret_reply) {
                                json_object_put(o);
                                return -ENOMEM;
                        }
                }
                struct json_object *ok;
                r = json_object_object_get_ex(o, "ok", &ok) && json_object_get_boolean(ok) ? 0 : -EREMOTEIO;
                json_object_put(o);
                return r;
        }
}

/* Reaps pid once it exits, polling until deadline: 0 (its wait status in *ret_status when
 * that is not NULL), -ETIMEDOUT, or waitpid()'s error (-ECHILD: not ours, or reaped). */
static int reap_until(pid_t pid, uint64_t deadline, int *ret_status) {
        struct timespec ts = { 0, 2 * 1000 * 1000 };
        int status;

        for (;;) {
                pid_t r = waitpid(pid, &status, WNOHANG);

                if (r == pid) {
                        if (ret_status)
                                *ret_status = status;
                        return 0;
                }
                if (r < 0 && errno != EINTR)
                        return -errno;
                if (now_usec() >= deadline)
                        return -ETIMEDOUT;
                nanosleep(&ts, NULL);
        }
}

static void reap_with_grace(pid_t pid, uint64_t grace_usec) {
        if (pid <= 0)
                return;
        if (reap_until(pid, now_usec() + grace_usec, NULL) == -ETIMEDOUT) {
                (void) kill(pid, SIGKILL);
                (void) waitpid(pid, NULL, 0);
        }
}

int vmm_proc_wait(struct vmm_proc *p, uint64_t timeout_usec, int *ret_status) {
        int r;

        if (p->pid <= 0)
                return -ECHILD;
        r = reap_until(p->pid, now_usec() + timeout_usec, ret_status);
        if (r == 0)
                p->pid = 0;
        return r;
}

void vmm_proc_stop(struct vmm_proc *p, uint64_t grace_usec) {
        p->agent_fd = safe_close(p->agent_fd);
        p->control_fd = safe_close(p->control_fd);
        reap_with_grace(p->pid, grace_usec);
        p->pid = 0;
}

int vmm_client_template_start(const char *vmm_path, const char *snapshot_dir, const char *overlay_dir,
                              struct vmm_template *ret, char **ret_error) {
        return vmm_client_template_start_volumes(vmm_path, snapshot_dir, overlay_dir, NULL, 0, ret, ret_error);
}

int vmm_client_template_start_volumes(const char *vmm_path, const char *snapshot_dir, const char *overlay_dir,
                                      const int *rw_fds, unsigned n_rw, struct vmm_template *ret, char **ret_error) {
        return vmm_client_template_start_links(vmm_path, snapshot_dir, overlay_dir, rw_fds, n_rw, NULL, ret,
                                               ret_error);
}

int vmm_client_template_start_links(const char *vmm_path, const char *snapshot_dir, const char *overlay_dir,
                                    const int *rw_fds, unsigned n_rw, const char *const *jail_links,
                                    struct vmm_template *ret, char **ret_error) {
        int ctl[2] = { -1, -1 }, fds[1 + VMM_CLIENT_VOLUMES_MAX];
        char vol[VMM_CLIENT_VOLUMES_MAX][32];
        const char *argv[20 + VMM_CLIENT_VOLUMES_MAX + 2 * VMM_CLIENT_JAIL_LINKS_MAX];
        struct json_object *o = NULL, *ev = NULL, *g;
        unsigned n = 0;
        pid_t pid = 0;
        int r;

        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl) < 0)
                return -errno;
        argv[n++] = vmm_path;
        argv[n++] = "template";
        argv[n++] = "--snapshot";
        argv[n++] = snapshot_dir;
        argv[n++] = "--control-fd=3";
        if (overlay_dir) {
                argv[n++] = "--overlay-dir";
                argv[n++] = overlay_dir;
        }
        fds[0] = ctl[1];
        for (unsigned i = 0; i < n_rw && i < VMM_CLIENT_VOLUMES_MAX; i++) {
                snprintf(vol[i], sizeof(vol[i]), "--volume-fd=%u:rw", 4 + i);
                argv[n++] = vol[i];
                fds[1 + i] = rw_fds[i];
        }
        r = add_confine_args(argv, &n, jail_links);
        if (r < 0) {
                safe_close(ctl[0]);
                safe_close(ctl[1]);
                return r;
        }
        argv[n] = NULL;

        r = spawn_with_fds((char *const *) argv, fds, 1 + MIN(n_rw, (unsigned) VMM_CLIENT_VOLUMES_MAX), &pid);
        safe_close(ctl[1]);
        if (r < 0) {
                safe_close(ctl[0]);
                return r;
        }

        /* The template says "ready" once the snapshot is parsed, or exits. Loading a
         * diff chain hashes every parent's memory file (SHA-256, parent_content_hash):
         * 256 MiB a link took 8-17 s in the emulated test host, so a chain of two
         * outlasted the 30 s this wait once had. */
        r = recv_json(ctl[0], now_usec() + TEMPLATE_START_TIMEOUT_USEC, &o);
        if (r < 0 || !json_object_object_get_ex(o, "event", &ev) ||
            strcmp(json_object_get_string(ev), "ready") != 0) {
                struct json_object *e, *en;

                if (r >= 0 && ev && strcmp(json_object_get_string(ev) ?: "", "refused") == 0 &&
                    json_object_object_get_ex(o, "error", &e) && json_object_is_type(e, json_type_string)) {
                        /* forkd-vmm's own words, and its errno: -ESTALE, -ENOLINK for a broken chain */
                        if (ret_error)
                                *ret_error = strndup(json_object_get_string(e), 1024);
                        if (json_object_object_get_ex(o, "errno", &en) && json_object_is_type(en, json_type_int) &&
                            json_object_get_int(en) > 0 && json_object_get_int(en) < 4096)
                                r = -json_object_get_int(en);
                        else
                                r = -EBADMSG;
                } else if (ret_error) {
                        int k;

                        if (r == -ETIMEDOUT)
                                k = asprintf(ret_error, "the template did not say it was ready within %llu s "
                                                "(it checks the hash of every parent of a diff chain at start)",
                                                (unsigned long long) (TEMPLATE_START_TIMEOUT_USEC / 1000000ull));
                        else if (r < 0)
                                k = asprintf(ret_error, "the template exited before it was ready (%s; see "
                                                "forkd-vmm's error output)", strerror(-r));
                        else
                                k = asprintf(ret_error, "the template did not start: it sent something other "
                                             "than ready or refused (see forkd-vmm's error output)");
                        if (k < 0)
                                *ret_error = NULL;
                }
                json_object_put(o);
                safe_close(ctl[0]);
                reap_with_grace(pid, 1000000);
                return r < 0 ? r : -EBADMSG;
        }
        *ret = (struct vmm_template) { .pid = pid, .control_fd = ctl[0] };
        if (json_object_object_get_ex(o, "generation", &g))
                ret->generation = (uint64_t) json_object_get_int64(g);
        json_object_put(o);
        return 0;
}

size_t vmm_spawn_batch_size_fds(unsigned per_child) {
        return MIN((size_t) SPAWN_BATCH, (size_t) (SPAWN_FDS_MAX / MAX(per_child, 1u)));
}

size_t vmm_spawn_batch_size(bool with_control, bool with_cgroup, bool with_netns, bool with_tap) {
        return vmm_spawn_batch_size_fds(1u + with_control + with_cgroup + with_netns + with_tap);
}

static int send_batch(struct vmm_template *t, const char *const *ids, size_t n, const char *console_dir,
                      const char *cgroup_parent, const char *const *netns, const int *fds, unsigned n_fds,
                      bool with_control, bool with_tap, const struct vmm_spawn_options *opts) {
        struct json_object *req = json_object_new_object(), *arr = json_object_new_array(), *ns = NULL;
        char cbuf[CMSG_SPACE(sizeof(int) * SPAWN_FDS_MAX)] = {};
        struct iovec iov;
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                             .msg_controllen = CMSG_SPACE(sizeof(int) * n_fds) };
        struct cmsghdr *c;
        const char *s;
        int r = 0;

        for (size_t i = 0; i < n; i++)
                json_object_array_add(arr, json_object_new_string(ids[i]));
        if (netns) {
                ns = json_object_new_array();
                for (size_t i = 0; i < n; i++)
                        json_object_array_add(ns, netns[i] ? json_object_new_string(netns[i]) : NULL);
        }
        json_object_object_add(req, "op", json_object_new_string("spawn"));
        json_object_object_add(req, "ids", arr);
        json_object_object_add(req, "with_control", json_object_new_boolean(with_control));
        json_object_object_add(req, "console_dir", console_dir ? json_object_new_string(console_dir) : NULL);
        json_object_object_add(req, "cgroup_parent", cgroup_parent ? json_object_new_string(cgroup_parent) : NULL);
        json_object_object_add(req, "netns", ns);
        if (with_tap) /* only then: a template of before the NIC knows no with_tap */
                json_object_object_add(req, "with_tap", json_object_new_boolean(true));
        if (opts->disk_rate) /* only then, as with_tap */
                json_object_object_add(req, "disk_rate", rate_limit_to_json(opts->disk_rate));
        if (opts->net_rate)
                json_object_object_add(req, "net_rate", rate_limit_to_json(opts->net_rate));
        if (opts->stats_fds) /* likewise */
                json_object_object_add(req, "with_stats", json_object_new_boolean(true));
        if (opts->userns_fds)
                json_object_object_add(req, "with_userns", json_object_new_boolean(true));
        s = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
        iov = (struct iovec) { .iov_base = (void *) s, .iov_len = strlen(s) };

        c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);

        if (sendmsg(t->control_fd, &mh, MSG_NOSIGNAL) < 0)
                r = -errno;
        json_object_put(req);
        return r;
}

int vmm_client_template_spawn(struct vmm_template *t, const char *const *ids, size_t n, const char *console_dir,
                              const char *cgroup_parent, int *agent_fds, int *control_fds, pid_t *pids, vmm_batch_sent_t on_batch,
                              void *userdata) {
        const struct vmm_spawn_options opts = { .console_dir = console_dir, .cgroup_parent = cgroup_parent };

        return vmm_client_template_spawn_with(t, ids, n, &opts, agent_fds, control_fds, pids, on_batch, userdata);
}

int vmm_client_template_spawn_with(struct vmm_template *t, const char *const *ids, size_t n,
                                   const struct vmm_spawn_options *opts, int *agent_fds, int *control_fds, pid_t *pids,
                                   vmm_batch_sent_t on_batch, void *userdata) {
        bool with_control = control_fds != NULL;
        /* A confined child has no right to enter a namespace, and no need: its NIC is
         * the tap, opened in its namespace, and it may open no socket (jail.c). */
        const char *const *netns = confine.enabled ? NULL : opts->netns;
        /* At most 7 fds a child (agent, control, cgroup, netns, tap, stats, userns), SCM_MAX_FD a message. */
        size_t sent = 0, got = 0,
               batch = vmm_spawn_batch_size_fds(1u + with_control + !!opts->cgroup_parent + !!netns +
                                                !!opts->tap_fds + !!opts->stats_fds + !!opts->userns_fds);
        int r = 0;

        for (size_t i = 0; i < n; i++) {
                agent_fds[i] = -1;
                if (control_fds)
                        control_fds[i] = -1;
                pids[i] = 0;
        }

        while (sent < n) {
                size_t k = MIN(batch, n - sent);
                int fds[SPAWN_FDS_MAX];
                unsigned n_fds = 0;

                for (size_t i = 0; i < k; i++) {
                        const char *ns = netns ? netns[sent + i] : NULL;
                        int a[2], c[2];

                        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a) < 0) {
                                r = -errno;
                                goto close_batch;
                        }
                        agent_fds[sent + i] = a[0];
                        fds[n_fds++] = a[1];
                        if (with_control) {
                                if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, c) < 0) {
                                        r = -errno;
                                        goto close_batch;
                                }
                                control_fds[sent + i] = c[0];
                                fds[n_fds++] = c[1];
                        }
                        /* Opened here, with our rights: the template may have none. */
                        if (opts->cgroup_parent) {
                                char path[4200];

                                if (snprintf(path, sizeof(path), "%s/%s/cgroup.procs", opts->cgroup_parent,
                                             ids[sent + i]) >= (int) sizeof(path)) {
                                        r = -ENAMETOOLONG;
                                        goto close_batch;
                                }
                                fds[n_fds] = open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
                                if (fds[n_fds] < 0) {
                                        r = -errno;
                                        goto close_batch;
                                }
                                n_fds++;
                        }
                        if (ns) {
                                char path[128];

                                if (strchr(ns, '/') || snprintf(path, sizeof(path), "/run/netns/%s", ns) >=
                                                               (int) sizeof(path)) {
                                        r = -EINVAL;
                                        goto close_batch;
                                }
                                fds[n_fds] = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
                                if (fds[n_fds] < 0) {
                                        r = -errno;
                                        goto close_batch;
                                }
                                n_fds++;
                        }
                        if (opts->tap_fds) {
                                /* A copy, closed with the batch: the caller keeps its own. */
                                fds[n_fds] = fcntl(opts->tap_fds[sent + i], F_DUPFD_CLOEXEC, 3);
                                if (fds[n_fds] < 0) {
                                        r = -errno;
                                        goto close_batch;
                                }
                                n_fds++;
                        }
                        if (opts->stats_fds) {
                                fds[n_fds] = fcntl(opts->stats_fds[sent + i], F_DUPFD_CLOEXEC, 3);
                                if (fds[n_fds] < 0) {
                                        r = -errno;
                                        goto close_batch;
                                }
                                n_fds++;
                        }
                        if (opts->userns_fds) {
                                fds[n_fds] = fcntl(opts->userns_fds[sent + i], F_DUPFD_CLOEXEC, 3);
                                if (fds[n_fds] < 0) {
                                        r = -errno;
                                        goto close_batch;
                                }
                                n_fds++;
                        }
                }
                r = send_batch(t, ids + sent, k, opts->console_dir, opts->cgroup_parent,
                               netns ? netns + sent : NULL,
                               fds, n_fds, with_control, opts->tap_fds, opts);
        close_batch:
                for (unsigned i = 0; i < n_fds; i++)
                        safe_close(fds[i]);
                if (r < 0)
                        return r;
                if (on_batch)
                        on_batch(sent, k, userdata);
                sent += k;
        }

        /* Collect one reply per batch, in order; exit events are counted. */
        while (got < n) {
                struct json_object *o = NULL, *ev, *ok, *arr;
                size_t k = MIN(batch, n - got);

                r = recv_json(t->control_fd, now_usec() + 60 * 1000000ull, &o);
                if (r < 0)
                        return r;
                if (json_object_object_get_ex(o, "event", &ev)) {
                        if (t->on_event)
                                t->on_event(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN),
                                            t->event_userdata);
                        t->n_exits++;
                        json_object_put(o);
                        continue;
                }
                if (!json_object_object_get_ex(o, "ok", &ok) || !json_object_get_boolean(ok) ||
                    !json_object_object_get_ex(o, "pids", &arr) || json_object_array_length(arr) != k) {
                        json_object_put(o);
                        return -EREMOTEIO;
                }
                for (size_t i = 0; i < k; i++)
                        pids[got + i] = json_object_get_int(json_object_array_get_idx(arr, i));
                json_object_put(o);
                got += k;
        }
        return 0;
}

void vmm_template_stop(struct vmm_template *t) {
        t->control_fd = safe_close(t->control_fd);
        reap_with_grace(t->pid, 5 * 1000000ull);
        t->pid = 0;
}
