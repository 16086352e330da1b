/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The template: a process that parses a snapshot once, maps memory.bin
 * MAP_PRIVATE without touching it, and forks one child per sandbox on request.
 * fork(2) copies no page tables for an untouched file mapping, so a child costs
 * a fork plus its own VM and vCPU fds (KVM fds belong to the mm that created
 * them, so every child makes its own). Children share clean guest pages
 * through the page cache and pay only for the pages they write.
 *
 * Control protocol: SOCK_SEQPACKET, one JSON object per message.
 *   -> {"op":"spawn","ids":[...],"with_control":bool,"console_dir":str|null,
 *       "cgroup_parent":str|null,"netns":[str|null,...]|null,
 *       "with_tap":bool,"with_stats":bool}
 *      cgroup_parent: each child joins the cgroup <cgroup_parent>/<id> (which
 *      the controller created and limited) before it restores anything, and
 *      exits with status 3 (VMM_CHILD_EXIT_CGROUP) rather than run outside it.
 *      It joins by writing to that cgroup's cgroup.procs through an fd the
 *      controller opened and sent (the kernel checks the opener's rights, so
 *      a confined template needs no access to the cgroup tree).
 *      netns: one entry per id. A child with a name enters that network
 *      namespace (setns CLONE_NEWNET on an fd of /run/netns/<name> the
 *      controller opened and sent) after its cgroup and before it restores
 *      anything, and exits with status 4 (VMM_CHILD_EXIT_NETNS) rather than
 *      run outside it. Names are 1 to 64 characters of [A-Za-z0-9_.-], not
 *      starting with '.' and without ".."; a request with any other name is
 *      refused whole. The template itself never changes namespace. A
 *      confined template (--confine) refuses any name: its children have no
 *      capability to enter a namespace, and stay in its own, empty one.
 *      with_tap: each child gets a tap fd for its NIC (virtio-net.h: a tap
 *      with IFF_TAP|IFF_NO_PI|IFF_VNET_HDR and a vnet header size of 12,
 *      typically opened in the child's namespace). It must be true exactly
 *      when the snapshot has a NIC, and every tap must pass
 *      virtio_net_check_backend(); else the request is refused whole. The
 *      child's NIC keeps the snapshot's MAC (children are clones).
 *      with_stats: each child gets a memfd of at least VMM_STATS_SIZE bytes
 *      (vmm-stats.h) that it maps read-write before it restores its devices,
 *      stamps with the magic and version, and counts its devices' work in;
 *      the controller maps it read-only. A child whose page cannot be mapped
 *      exits with VMM_CHILD_EXIT_RESTORE rather than run uncounted.
 *      with_userns (a confined template only): each child gets the fd of a
 *      user namespace that forkd made for it, owned by the template's uid,
 *      mapping uid and gid 0 to the sandbox's own id and gid 1 to the
 *      template's group; the child enters it and becomes 0:0 there (its own
 *      id on the host) after its cgroup and before it restores anything, and
 *      exits with status 1 rather than run as the template's user
 *      (jail_enter_user()). Every confined child then seals its identity
 *      (jail_seal_identity()).
 *      with SCM_RIGHTS: per id, its agent fd, then (with_control) its control
 *      fd, then (cgroup_parent) its cgroup.procs fd, then (a netns name) its
 *      namespace fd, then (with_tap) its tap fd, then (with_stats) its stats
 *      memfd, then (with_userns) its user namespace fd; at most
 *      TEMPLATE_MAX_FDS in one message
 *      (vmm_spawn_batch_size() in vmm-client.h)
 *      disk_rate, net_rate (optional, null or absent: none): the limits of
 *      every child of the request, {"bandwidth":N,"ops":N,"burst":N} as
 *      rate_limit_from_json() (fork-options.h) takes them; anything else
 *      refuses the request whole. Each child has them before its guest
 *      runs; a child changes them later with its control op set_limits.
 *   <- {"ok":true,"pids":[...]} | {"ok":false,"error":"..."}
 *   <- {"event":"ready","generation":N,"mem_size":N} once, at start
 *   <- {"event":"exit","id":"...","pid":N,"code":N,"signal":N} per child
 * EOF on the control socket kills every child and ends the template.
 */
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <json-c/json.h>

#include "chain.h"
#include "jail.h"
#include "json-util.h"
#include "kvm.h"
#include "machine.h"
#include "run.h"
#include "snapshot-meta.h"
#include "template.h"
#include "vmm-limits.h"
#include "virtio-net.h"
#include "vmm-client.h"

#define TEMPLATE_MAX_BATCH 100
#define TEMPLATE_MAX_FDS 253 /* SCM_MAX_FD */
#define TEMPLATE_MAX_CHILDREN 4096
#define TEMPLATE_MSG_MAX (64u << 10)

struct child {
        pid_t pid;
        char id[65];
};

struct template {
        int kvm_fd;
        int control_fd;
        int sig_fd;
        struct snapshot *snap;
        uint8_t *mem;
        const char *overlay_dir;
        struct child *children;
        unsigned n_children;
};

bool template_netns_name_is_valid(const char *name) {
        size_t n;

        if (!name || name[0] == '\0' || name[0] == '.' || strstr(name, ".."))
                return false;
        for (n = 0; name[n]; n++) {
                char c = name[n];

                if (n >= TEMPLATE_NETNS_NAME_MAX)
                        return false;
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                      c == '.' || c == '-'))
                        return false;
        }
        return true;
}

static void send_json(struct template *t, struct json_object *o) {
        const char *s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
        if (send(t->control_fd, s, strlen(s), MSG_NOSIGNAL) < 0)
                log_debug_errno(errno, "Failed to send to the controller: %m");
}

static void send_error(struct template *t, const char *msg) {
        struct json_object *o = json_object_new_object();
        json_object_object_add(o, "ok", json_object_new_boolean(0));
        json_object_object_add(o, "error", json_object_new_string(msg));
        send_json(t, o);
        json_object_put(o);
}

/* The fds a child gets from a spawn request (-1: none). */
struct child_fds {
        int agent, control, cgroup, netns, tap, stats, userns;
};

/* A spawn's "disk_rate" and "net_rate", for every child of the request. */
struct spawn_limits {
        struct rate_limit disk, net;
        bool has_disk, has_net;
};

/* Map the controller's stats page (vmm-stats.h) and stamp it; the VMM counts in it
 * from then on. The mapping lives as long as the child. */
static int child_map_stats(int fd, struct vmm_stats **ret) {
        struct vmm_stats *st;
        struct stat sb;

        if (fstat(fd, &sb) < 0)
                return -errno;
        if (!S_ISREG(sb.st_mode) || sb.st_size < VMM_STATS_SIZE)
                return -EBADF;
        st = mmap(NULL, VMM_STATS_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (st == MAP_FAILED)
                return -errno;
        *st = (struct vmm_stats) { .version = VMM_STATS_VERSION };
        /* the magic last: a reader that sees it sees the rest zeroed */
        __atomic_store_n(&st->magic, VMM_STATS_MAGIC, __ATOMIC_RELEASE);
        *ret = st;
        return 0;
}

static _Noreturn void child_main(struct template *t, const char *id, const struct child_fds *fds,
                                 const char *console_dir, const char *cgroup_parent, const char *netns,
                                 const struct spawn_limits *limits) {
        struct machine_config cfg = { .id = id, .overlay_dir = t->overlay_dir, .agent_fd = fds->agent };
        struct machine_net net = { .tap_fd = fds->tap };
        struct vmm_host host = { .agent_listen_fd = -1, .control_listen_fd = -1, .control_fd = fds->control,
                                 .exit_on_control_eof = fds->control >= 0, .kernel = t->snap->meta.kernel };
        char log_path[4096];
        struct vmm *vmm = NULL;
        sigset_t ss;
        int r;

        log_prefix = id;
        (void) prctl(PR_SET_PDEATHSIG, SIGKILL);
        sigemptyset(&ss);
        sigaddset(&ss, SIGCHLD);
        (void) sigprocmask(SIG_UNBLOCK, &ss, NULL);

        if (cgroup_parent && write(fds->cgroup, "0", 1) != 1) {
                log_error_errno(errno, "Failed to join the cgroup %s/%s: %m", cgroup_parent, id);
                _exit(VMM_CHILD_EXIT_CGROUP);
        }
        safe_close(fds->cgroup);
        if (netns && setns(fds->netns, CLONE_NEWNET) < 0) {
                /* Validated by handle_spawn(); never run outside the namespace asked for. */
                log_error_errno(errno, "Failed to enter the network namespace /run/netns/%s: %m", netns);
                _exit(VMM_CHILD_EXIT_NETNS);
        }
        safe_close(fds->netns);
        if (fds->userns >= 0 && jail_enter_user(fds->userns) < 0)
                _exit(VMM_CHILD_EXIT_FAILED); /* never as the template's user */
        safe_close(fds->userns);
        if (jail_seal_identity() < 0)
                _exit(VMM_CHILD_EXIT_FAILED);
        if (console_dir) {
                snprintf(log_path, sizeof(log_path), "%s/%s.log", console_dir, id);
                cfg.console_log = log_path;
        }
        if (fds->tap >= 0)
                cfg.net = &net;
        if (fds->stats >= 0) {
                r = child_map_stats(fds->stats, &cfg.stats);
                if (r < 0) {
                        log_error_errno(r, "Failed to map the stats page: %m");
                        _exit(VMM_CHILD_EXIT_RESTORE);
                }
                safe_close(fds->stats);
        }
        r = machine_restore(t->kvm_fd, t->snap, t->mem, &cfg, &vmm);
        safe_close(fds->tap); /* the NIC has its own */
        if (r < 0) {
                log_error_errno(r, "Failed to restore: %m");
                _exit(VMM_CHILD_EXIT_RESTORE);
        }
        /* Before the guest runs a single instruction: no request escapes them. */
        r = vmm_limits_set(vmm, limits->has_disk ? &limits->disk : NULL, limits->has_net ? &limits->net : NULL);
        if (r < 0)
                _exit(VMM_CHILD_EXIT_FAILED);
        r = vmm_install_signals();
        if (r < 0)
                _exit(VMM_CHILD_EXIT_FAILED);
        /* Confined, the template's uid, no capabilities and filter are ours already. */
        if (jail_confine_vmm() < 0)
                _exit(VMM_CHILD_EXIT_FAILED);
        r = vmm_run(vmm, &host);
        /* No teardown: exit(2) lets the kernel free the VM, off anyone's critical path. */
        _exit(r >= 0 || r == -ECANCELED ? vmm_exit_status(vmm) : VMM_CHILD_EXIT_FAILED);
}

static void close_fds(int *fds, unsigned n) {
        for (unsigned i = 0; i < n; i++)
                safe_close(fds[i]);
}

static void handle_spawn(struct template *t, struct json_object *req, int *fds, unsigned n_fds) {
        struct json_object *ids, *o, *reply, *pids, *netns = NULL;
        const char *console_dir = NULL, *cgroup_parent = NULL;
        bool with_control = false, with_tap = false, with_stats = false, with_userns = false;
        struct spawn_limits limits = {};
        char err[FORK_OPTION_ERROR_MAX];
        int has_net;
        unsigned want, next = 0;
        size_t n;

        if (!json_object_object_get_ex(req, "ids", &ids) || !json_object_is_type(ids, json_type_array)) {
                send_error(t, "spawn needs an array \"ids\"");
                goto fail;
        }
        n = json_object_array_length(ids);
        if (n == 0 || n > TEMPLATE_MAX_BATCH) {
                send_error(t, "spawn takes 1 to 100 ids per message");
                goto fail;
        }
        if (t->n_children + n > TEMPLATE_MAX_CHILDREN) {
                send_error(t, "too many children for one template");
                goto fail;
        }
        if (json_object_object_get_ex(req, "with_control", &o)) {
                if (!json_object_is_type(o, json_type_boolean)) {
                        send_error(t, "\"with_control\" must be a boolean");
                        goto fail;
                }
                with_control = json_object_get_boolean(o);
        }
        if (json_object_object_get_ex(req, "with_tap", &o)) {
                if (!json_object_is_type(o, json_type_boolean)) {
                        send_error(t, "\"with_tap\" must be a boolean");
                        goto fail;
                }
                with_tap = json_object_get_boolean(o);
        }
        if (json_object_object_get_ex(req, "with_stats", &o)) {
                if (!json_object_is_type(o, json_type_boolean)) {
                        send_error(t, "\"with_stats\" must be a boolean");
                        goto fail;
                }
                with_stats = json_object_get_boolean(o);
        }
        if (json_object_object_get_ex(req, "with_userns", &o)) {
                if (!json_object_is_type(o, json_type_boolean)) {
                        send_error(t, "\"with_userns\" must be a boolean");
                        goto fail;
                }
                with_userns = json_object_get_boolean(o);
        }
        if (with_userns && !jail.enabled) {
                send_error(t, "spawn: only a confined template switches its children's user (\"with_userns\")");
                goto fail;
        }
        /* Fail closed, before any child exists: a clone of a guest with a NIC
         * gets a tap, and one without gets none. */
        has_net = machine_state_net(t->snap->state, NULL);
        if (has_net < 0) {
                send_error(t, "spawn: the snapshot's NIC state is invalid");
                goto fail;
        }
        if (has_net && !with_tap) {
                send_error(t, "spawn: the snapshot has a NIC: every child needs a tap (\"with_tap\":true)");
                goto fail;
        }
        if (!has_net && with_tap) {
                send_error(t, "spawn: the snapshot has no NIC: \"with_tap\" must be false");
                goto fail;
        }
        if (json_object_object_get_ex(req, "console_dir", &o) && !json_object_is_type(o, json_type_null)) {
                if (!json_object_is_type(o, json_type_string) || json_object_get_string(o)[0] != '/' ||
                    json_object_get_string_len(o) > 3000) {
                        send_error(t, "\"console_dir\" must be an absolute path or null");
                        goto fail;
                }
                console_dir = json_object_get_string(o);
        }
        if (json_object_object_get_ex(req, "cgroup_parent", &o) && !json_object_is_type(o, json_type_null)) {
                if (!json_object_is_type(o, json_type_string) || json_object_get_string(o)[0] != '/' ||
                    json_object_get_string_len(o) > 3000) {
                        send_error(t, "\"cgroup_parent\" must be an absolute path or null");
                        goto fail;
                }
                cgroup_parent = json_object_get_string(o);
        }
        if (json_object_object_get_ex(req, "netns", &o) && !json_object_is_type(o, json_type_null)) {
                if (!json_object_is_type(o, json_type_array) || json_object_array_length(o) != n) {
                        send_error(t, "\"netns\" must be null or an array with one entry per id");
                        goto fail;
                }
                for (size_t i = 0; i < n; i++) {
                        struct json_object *e = json_object_array_get_idx(o, i);

                        if (json_object_is_type(e, json_type_null))
                                continue;
                        if (!json_object_is_type(e, json_type_string) ||
                            strlen(json_object_get_string(e)) != (size_t) json_object_get_string_len(e) ||
                            !template_netns_name_is_valid(json_object_get_string(e))) {
                                send_error(t, "spawn: every \"netns\" entry must be null or a namespace name under "
                                              "/run/netns: 1 to 64 of [A-Za-z0-9_.-], no leading '.', no \"..\"");
                                goto fail;
                        }
                }
                netns = o;
        }
        for (size_t i = 0; netns && jail.enabled && i < n; i++)
                if (!json_object_is_type(json_object_array_get_idx(netns, i), json_type_null)) {
                        /* setns() needs CAP_SYS_ADMIN, which no confined process has. */
                        send_error(t, "spawn: a confined template cannot put its children into a network "
                                      "namespace; its children stay in its own, empty one");
                        goto fail;
                }
        if (vmm_limits_parse_json(req, &limits.disk, &limits.has_disk, &limits.net, &limits.has_net, err) < 0) {
                char msg[FORK_OPTION_ERROR_MAX + 8];

                snprintf(msg, sizeof(msg), "spawn: %s", err);
                send_error(t, msg);
                goto fail;
        }
        want = n * (with_control ? 2 : 1) + (cgroup_parent ? n : 0) + (with_tap ? n : 0) + (with_stats ? n : 0) +
               (with_userns ? n : 0);
        for (size_t i = 0; netns && i < n; i++)
                if (!json_object_is_type(json_object_array_get_idx(netns, i), json_type_null))
                        want++;
        if (n_fds != want) {
                send_error(t, "spawn: wrong number of file descriptors attached");
                goto fail;
        }
        for (size_t i = 0; i < n; i++) {
                o = json_object_array_get_idx(ids, i);
                if (!json_object_is_type(o, json_type_string) || !snapshot_tag_is_valid(json_object_get_string(o))) {
                        send_error(t, "spawn: every id must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$");
                        goto fail;
                }
        }
        for (size_t i = 0, k = 0; with_tap && i < n; i++) {
                /* the tap comes after the netns fd, before the stats and userns fds */
                k += (with_control ? 2 : 1) + (cgroup_parent ? 1 : 0);
                if (netns && !json_object_is_type(json_object_array_get_idx(netns, i), json_type_null))
                        k++;
                if (virtio_net_check_backend(fds[k]) < 0) {
                        send_error(t, "spawn: every tap fd must be a tap with IFF_TAP|IFF_NO_PI|IFF_VNET_HDR and a "
                                      "vnet header size of 12");
                        goto fail;
                }
                k++;
                if (with_stats)
                        k++;
                if (with_userns)
                        k++;
        }

        pids = json_object_new_array();
        for (size_t i = 0; i < n; i++) {
                const char *id = json_object_get_string(json_object_array_get_idx(ids, i));
                const char *ns = netns ? json_object_get_string(json_object_array_get_idx(netns, i)) : NULL;
                struct child_fds cf = { .agent = fds[next++], .control = -1, .cgroup = -1, .netns = -1, .tap = -1,
                                       .stats = -1, .userns = -1 };
                unsigned first = next - 1;
                pid_t pid;

                if (with_control)
                        cf.control = fds[next++];
                if (cgroup_parent)
                        cf.cgroup = fds[next++];
                if (ns)
                        cf.netns = fds[next++];
                if (with_tap)
                        cf.tap = fds[next++];
                if (with_stats)
                        cf.stats = fds[next++];
                if (with_userns)
                        cf.userns = fds[next++];
                pid = fork();
                if (pid < 0) {
                        json_object_array_add(pids, json_object_new_int(-errno));
                        continue;
                }
                if (pid == 0) {
                        /* Keep only this child's own fds. */
                        for (unsigned k = 0; k < n_fds; k++)
                                if (k < first || k >= next)
                                        safe_close(fds[k]);
                        safe_close(t->control_fd);
                        safe_close(t->sig_fd);
                        child_main(t, id, &cf, console_dir, cgroup_parent, ns, &limits);
                }
                t->children[t->n_children].pid = pid;
                snprintf(t->children[t->n_children].id, sizeof(t->children[0].id), "%s", id);
                t->n_children++;
                json_object_array_add(pids, json_object_new_int(pid));
        }
        close_fds(fds, n_fds);

        reply = json_object_new_object();
        json_object_object_add(reply, "ok", json_object_new_boolean(1));
        json_object_object_add(reply, "pids", pids);
        send_json(t, reply);
        json_object_put(reply);
        return;
fail:
        close_fds(fds, n_fds);
}

static int read_control(struct template *t) {
        static char buf[TEMPLATE_MSG_MAX + 1];
        char cbuf[CMSG_SPACE(sizeof(int) * TEMPLATE_MAX_FDS)];
        struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
        struct json_object *req = NULL, *op;
        int fds[TEMPLATE_MAX_FDS];
        unsigned n_fds = 0;
        const char *err = NULL;
        ssize_t n;

        n = recvmsg(t->control_fd, &mh, MSG_CMSG_CLOEXEC);
        if (n < 0)
                return errno == EINTR || errno == EAGAIN ? 0 : -errno;
        if (n == 0)
                return -ECONNRESET;

        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                        continue;
                unsigned k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (unsigned i = 0; i < k; i++) {
                        int fd;
                        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                        if (n_fds < ELEMENTSOF(fds))
                                fds[n_fds++] = fd;
                        else
                                safe_close(fd);
                }
        }
        if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || (size_t) n > TEMPLATE_MSG_MAX) {
                send_error(t, "request too large");
                close_fds(fds, n_fds);
                return 0;
        }

        if (json_parse_strict(buf, n, TEMPLATE_MSG_MAX, 4, &req, &err) < 0) {
                send_error(t, err ?: "malformed request");
                close_fds(fds, n_fds);
                return 0;
        }
        if (json_object_object_get_ex(req, "op", &op) && json_object_is_type(op, json_type_string) &&
            strcmp(json_object_get_string(op), "spawn") == 0)
                handle_spawn(t, req, fds, n_fds);
        else {
                send_error(t, "unknown op");
                close_fds(fds, n_fds);
        }
        json_object_put(req);
        return 0;
}

static void reap(struct template *t) {
        struct signalfd_siginfo si;
        int status;
        pid_t pid;

        while (read(t->sig_fd, &si, sizeof(si)) == sizeof(si))
                ;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
                for (unsigned i = 0; i < t->n_children; i++) {
                        struct json_object *ev;

                        if (t->children[i].pid != pid)
                                continue;
                        ev = json_object_new_object();
                        json_object_object_add(ev, "event", json_object_new_string("exit"));
                        json_object_object_add(ev, "id", json_object_new_string(t->children[i].id));
                        json_object_object_add(ev, "pid", json_object_new_int(pid));
                        json_object_object_add(ev, "code", json_object_new_int(WIFEXITED(status) ? WEXITSTATUS(status) : -1));
                        json_object_object_add(ev, "signal", json_object_new_int(WIFSIGNALED(status) ? WTERMSIG(status) : 0));
                        send_json(t, ev);
                        json_object_put(ev);
                        t->children[i] = t->children[--t->n_children];
                        break;
                }
        }
}

int template_serve(int kvm_fd, const char *snapshot_dir, int control_fd, const char *overlay_dir, const int *rw_fds,
                   unsigned n_rw) {
        _cleanup_(snapshot_freep) struct snapshot *snap = NULL;
        _cleanup_free_ char *err = NULL;
        uint8_t *mem;
        int r;

        (void) prctl(PR_SET_PDEATHSIG, SIGKILL);

        r = snapshot_load(snapshot_dir, &snap, &err);
        if (r >= 0)
                r = snapshot_set_rw_volumes(snap, rw_fds, n_rw, &err);
        if (r < 0) {
                /* Tell the controller why, so that its caller reads it (vmm_client_template_start()). */
                struct template t = { .control_fd = control_fd };
                struct json_object *o = json_object_new_object();

                json_object_object_add(o, "event", json_object_new_string("refused"));
                json_object_object_add(o, "error", json_object_new_string(err ?: strerror(-r)));
                json_object_object_add(o, "errno", json_object_new_int(-r));
                send_json(&t, o);
                json_object_put(o);
                return log_error_errno(r, "Cannot use snapshot %s: %s", snapshot_dir, err ?: strerror(-r));
        }

        /* Map, never touch: the template's page tables stay empty, so fork is cheap. */
        r = snapshot_map_memory(snap, &mem);
        if (r < 0)
                return log_error_errno(r, "Failed to map memory.bin: %m");
        return template_serve_loaded(kvm_fd, snap, mem, control_fd, overlay_dir);
}

int template_serve_loaded(int kvm_fd, struct snapshot *snap, uint8_t *mem, int control_fd, const char *overlay_dir) {
        _cleanup_free_ struct child *children = NULL;
        struct template t = { .kvm_fd = kvm_fd, .control_fd = control_fd, .overlay_dir = overlay_dir, .snap = snap,
                              .mem = mem };
        struct json_object *ready;
        sigset_t ss;
        int r;

        children = calloc(TEMPLATE_MAX_CHILDREN, sizeof(*children));
        if (!children)
                return log_oom();
        t.children = children;

        sigemptyset(&ss);
        sigaddset(&ss, SIGCHLD);
        sigprocmask(SIG_BLOCK, &ss, NULL);
        t.sig_fd = signalfd(-1, &ss, SFD_CLOEXEC | SFD_NONBLOCK);
        if (t.sig_fd < 0)
                return log_error_errno(errno, "signalfd failed: %m");

        ready = json_object_new_object();
        json_object_object_add(ready, "event", json_object_new_string("ready"));
        json_object_object_add(ready, "generation", json_object_new_int64((int64_t) snap->state->memory.generation));
        json_object_object_add(ready, "mem_size", json_object_new_int64((int64_t) snap->meta.mem_size));
        send_json(&t, ready);
        json_object_put(ready);

        for (;;) {
                struct pollfd p[2] = {
                        { .fd = control_fd, .events = POLLIN },
                        { .fd = t.sig_fd, .events = POLLIN },
                };

                if (poll(p, 2, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        r = -errno;
                        break;
                }
                if (p[1].revents & POLLIN)
                        reap(&t);
                if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
                        r = read_control(&t);
                        if (r < 0)
                                break;
                }
        }

        /* Controller gone: no child outlives its template. */
        for (unsigned i = 0; i < t.n_children; i++)
                (void) kill(t.children[i].pid, SIGKILL);
        /* Reap them, so that none lingers as a zombie of whoever adopts it. */
        while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
                ;
        safe_close(t.sig_fd);
        return r == -ECONNRESET ? 0 : r;
}
