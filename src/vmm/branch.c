/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Branching a running VM: see branch.h. */
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#include "branch.h"
#include "snapshot-meta.h"
#include "snapshot.h"
#include "template.h"
#include "virtio-blk.h"
#include "virtio-console.h"
#include "virtio-net.h"
#include "vmm-client.h"

/* The result, and with h the files forkd is to link (their names in "links",
 * their descriptors alongside): false if it could not be sent. */
static bool send_result(int fd, int r, const char *dir, const struct snapshot_handoff *h) {
        char cbuf[CMSG_SPACE(sizeof(int) * SNAPSHOT_HANDOFF_MAX)] = {};
        struct json_object *o = json_object_new_object();
        struct iovec iov;
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
        bool sent;

        json_object_object_add(o, "ok", json_object_new_boolean(r >= 0));
        if (r >= 0)
                json_object_object_add(o, "dir", json_object_new_string(dir));
        else {
                char msg[256];
                snprintf(msg, sizeof(msg), "writing the snapshot failed: %s", strerror(-r));
                json_object_object_add(o, "error", json_object_new_string(msg));
        }
        if (r >= 0 && h && h->n > 0) {
                struct json_object *names = json_object_new_array();
                struct cmsghdr *c;

                for (unsigned i = 0; i < h->n; i++)
                        json_object_array_add(names, json_object_new_string(h->names[i]));
                json_object_object_add(o, "links", names);
                mh.msg_control = cbuf;
                mh.msg_controllen = CMSG_SPACE(sizeof(int) * h->n);
                c = CMSG_FIRSTHDR(&mh);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int) * h->n);
                memcpy(CMSG_DATA(c), h->fds, sizeof(int) * h->n);
        }
        iov = (struct iovec) { .iov_base = (void *) json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN) };
        iov.iov_len = strlen(iov.iov_base);
        /* sendmsg() on a socket, write() on a pipe (which takes no descriptors) */
        sent = sendmsg(fd, &mh, MSG_NOSIGNAL) >= 0;
        if (!sent && errno == ENOTSOCK && mh.msg_controllen == 0)
                sent = write(fd, iov.iov_base, iov.iov_len) == (ssize_t) iov.iov_len;
        json_object_put(o);
        return sent;
}

/* The directory forkd made for the branch (a "staging" request): one
 * descriptor, queued on the result socket before the request was sent. */
static int recv_staging_dir(int fd) {
        char cbuf[CMSG_SPACE(sizeof(int))] = {}, b;
        struct iovec iov = { .iov_base = &b, .iov_len = 1 };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
        struct cmsghdr *c;
        struct stat st;
        int dfd = -EBADF;

        if (recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) < 0)
                return -errno;
        c = CMSG_FIRSTHDR(&mh);
        if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
                memcpy(&dfd, CMSG_DATA(c), sizeof(int));
        if (dfd < 0 || (mh.msg_flags & MSG_CTRUNC))
                return -EBADMSG;
        if (fstat(dfd, &st) < 0 || !S_ISDIR(st.st_mode)) {
                safe_close(dfd);
                return -ENOTDIR;
        }
        return dfd;
}

/* Guest RAM is a MAP_PRIVATE mapping of the snapshot's memory.bin: a read of a
 * page nobody wrote is a read fault on the file, and where that file lies on
 * tmpfs the kernel must allocate a page of the file system for it; on a full
 * one it raises SIGBUS instead. The copy then says why on its result channel
 * (with async-signal-safe calls only) rather than dying without a word. */
static int copy_result_fd = -1;
static char copy_sigbus_msg[320];

static void copy_on_sigbus(int sig) {
        size_t n = strlen(copy_sigbus_msg);

        if (send(copy_result_fd, copy_sigbus_msg, n, MSG_NOSIGNAL) < 0 && errno == ENOTSOCK)
                (void) !write(copy_result_fd, copy_sigbus_msg, n);
        _exit(1);
}

static void copy_catch_sigbus(int result_fd) {
        struct sigaction sa = { .sa_handler = copy_on_sigbus };
        sigset_t ss;

        copy_result_fd = result_fd;
        snprintf(copy_sigbus_msg, sizeof(copy_sigbus_msg),
                 "{\"ok\":false,\"error\":\"writing the snapshot failed: the guest memory could not be read (SIGBUS): "
                 "the file system of the parent snapshot's memory.bin has no space left for it (%s)\"}",
                 strerror(ENOSPC));
        sigemptyset(&sa.sa_mask);
        (void) sigaction(SIGBUS, &sa, NULL);
        /* A fault while SIGBUS is blocked kills at once, handler or not. */
        sigemptyset(&ss);
        sigaddset(&ss, SIGBUS);
        (void) sigprocmask(SIG_UNBLOCK, &ss, NULL);
}

/* In a frozen copy: drop everything of the running VM's (its KVM VM and vCPU
 * fds belong to the source's mm, and would keep that VM alive) and its host
 * channels. */
static void frozen_copy_detach(struct vmm *vmm, struct vmm_host *host, const char *name, bool close_kvm) {
        struct sigaction sa = { .sa_handler = SIG_DFL };

        for (unsigned i = 0; i < vmm->n_vcpus; i++) {
                (void) munmap(vmm->vcpus[i].run, vmm->run_size); /* holds the vCPU file too */
                vmm->vcpus[i].run = NULL;
                vmm->vcpus[i].fd = safe_close(vmm->vcpus[i].fd);
                vmm->vcpus[i].tid = 0;
                vmm->vcpus[i].thread_started = false; /* fork(2) copied no other thread */
        }
        vmm->run = NULL;
        vmm->vcpu_fd = -EBADF;
        vmm->vm_fd = safe_close(vmm->vm_fd);
        if (close_kvm)
                vmm->kvm_fd = safe_close(vmm->kvm_fd);
        host->control_fd = safe_close(host->control_fd);
        host->agent_listen_fd = safe_close(host->agent_listen_fd);
        host->control_listen_fd = safe_close(host->control_listen_fd);
        safe_close(virtio_console_host_fd(vmm->console));
        /* The tap belongs to the running sandbox: a copy holding it would keep
         * it (and the sandbox's namespace) alive after the sandbox is gone. */
        safe_close(virtio_net_backend_fd(vmm->net));
        sigemptyset(&sa.sa_mask);
        (void) sigaction(SIGIO, &(struct sigaction) { .sa_handler = SIG_IGN }, NULL);
        (void) sigaction(SIGTERM, &sa, NULL);
        (void) sigaction(SIGINT, &sa, NULL);
        (void) prctl(PR_SET_NAME, name);
}

static _Noreturn void frozen_copy_main(struct vmm *vmm, struct vmm_host *host, const char *dir, const char *tag,
                                       const void *vbuf, size_t vlen, int result_fd,
                                       const struct snapshot_parent *diff, const char *branched_from,
                                       int pause_fd, int staging_fd) {
        struct snapshot_origin origin = { .branched_from = branched_from };
        static struct snapshot_handoff h;
        uint64_t pause_us;
        int r;

        frozen_copy_detach(vmm, host, "forkd-branch", true);
        copy_catch_sigbus(result_fd);
        /* The pause as the VM's process measured it once it resumed: written right after the fork. */
        if (read(pause_fd, &pause_us, sizeof(pause_us)) == (ssize_t) sizeof(pause_us))
                origin.pause_us = pause_us;
        safe_close(pause_fd);
        if (staging_fd < 0) {
                r = snapshot_write_collected(vmm, dir, tag, host->kernel, vbuf, vlen, true, diff,
                                             branched_from ? &origin : NULL);
                if (r < 0)
                        log_error_errno(r, "Branch %s: writing %s failed: %m", tag, dir);
                send_result(result_fd, r, dir, NULL);
                _exit(r < 0 ? 1 : 0);
        }

        /* Into forkd's directory; forkd links what this process may not, and renames it into place. */
        r = snapshot_write_handoff(vmm, staging_fd, tag, host->kernel, vbuf, vlen, true, diff,
                                   branched_from ? &origin : NULL, &h);
        if (r < 0)
                log_error_errno(r, "Branch %s: writing %s failed: %m", tag, dir);
        if (!send_result(result_fd, r, dir, &h) && r >= 0) {
                /* forkd went away: copy what it was to link, and mark the directory whole
                 * for the forkd that starts next (it renames it into place then). */
                r = snapshot_handoff_copy(&h, staging_fd);
                if (r >= 0) {
                        int k = openat(staging_fd, SNAPSHOT_STAGING_WHOLE_FILE,
                                       O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);

                        r = k < 0 || fsync(k) < 0 || fsync(staging_fd) < 0 ? -errno : 0;
                        safe_close(k);
                }
                if (r < 0)
                        log_error_errno(r, "Branch %s: finishing %s without forkd failed: %m", tag, dir);
        }
        snapshot_handoff_done(&h);
        _exit(r < 0 ? 1 : 0);
}

/* The pause: quiesce, save the state, freeze the disk overlay, fork(2).
 * Returns the copy's pid in the VM's process (which resumes), 0 in the copy;
 * *ret_pause_us is the pause, measured in the VM's process. */
static pid_t pause_and_fork(struct vmm *vmm, void **ret_vbuf, size_t *ret_vlen, uint64_t *ret_pause_us, char *msg,
                            size_t msg_size) {
        _cleanup_free_ void *vbuf = NULL;
        uint64_t t0;
        size_t vlen;
        pid_t pid;
        int r;

        if (vmm->mem_fd >= 0) {
                /* RAM of a booted VM is a shared memfd: a fork would not freeze it. */
                snprintf(msg, msg_size, "needs a VM restored from a snapshot (private guest memory)");
                return -EOPNOTSUPP;
        }
        /* The pause starts here. */
        t0 = now_usec();
        r = vcpu_quiesce(vmm);
        if (r >= 0)
                r = snapshot_collect(vmm, &vbuf, &vlen);
        if (r < 0) {
                snprintf(msg, msg_size, "saving the VM state failed: %s", strerror(-r));
                return r;
        }
        r = virtio_blk_freeze_overlay(vmm->blk);
        /* cow volumes too: the copy sees them as the guest does now */
        for (unsigned i = 0; r >= 0 && i < vmm->n_volumes; i++)
                r = virtio_blk_freeze_overlay(vmm->volumes[i]);
        if (r < 0) {
                snprintf(msg, msg_size, "freezing the disk overlay failed: %s", strerror(-r));
                return r;
        }
        /* The copy is reaped by nobody: let the kernel do it. */
        (void) sigaction(SIGCHLD, &(struct sigaction) { .sa_handler = SIG_IGN, .sa_flags = SA_NOCLDWAIT }, NULL);
        pid = fork();
        if (pid < 0) {
                r = -errno;
                snprintf(msg, msg_size, "fork failed: %s", strerror(-r));
                return r;
        }
        /* The pause ends when the run loop calls KVM_RUN again, right after the reply. */
        *ret_pause_us = now_usec() - t0;
        *ret_vbuf = TAKE_PTR(vbuf);
        *ret_vlen = vlen;
        return pid;
}

/* The volumes of the frozen copy: each device's file and frozen layers, so that
 * the children see them as the VM did when it paused. */
static int frozen_volumes(struct vmm *vmm, struct snapshot *snap) {
        for (unsigned i = 0; i < vmm->n_volumes; i++) {
                struct snapshot_volume_disk *d = &snap->volumes[i];
                int r;

                snap->meta.volumes[i] = vmm->volume_meta[i];
                d->layer_fds = calloc(VIRTIO_BLK_LAYERS_MAX, sizeof(int));
                d->map_fds = calloc(VIRTIO_BLK_LAYERS_MAX, sizeof(int));
                if (!d->layer_fds || !d->map_fds)
                        return -ENOMEM;
                r = virtio_blk_open_layers(vmm->volumes[i], &d->fd, d->layer_fds, d->map_fds, &d->n_layers);
                if (r < 0)
                        return r;
        }
        snap->meta.n_volumes = vmm->n_volumes;
        return 0;
}

static _Noreturn void frozen_template_main(struct vmm *vmm, struct vmm_host *host, const void *vbuf, size_t vlen,
                                           int tpl_fd) {
        _cleanup_(snapshot_freep) struct snapshot *snap = NULL;
        const char *err = NULL;
        int r;

        frozen_copy_detach(vmm, host, "forkd-fork", false);
        (void) sigaction(SIGCHLD, &(struct sigaction) { .sa_handler = SIG_DFL }, NULL);

        snap = calloc(1, sizeof(*snap));
        if (!snap || !(snap->state = calloc(1, sizeof(*snap->state))))
                _exit(1);
        snap->mem_fd = snap->disk_fd = -EBADF;
        for (unsigned i = 0; i < SNAPSHOT_DISK_LAYERS_MAX; i++)
                snap->layer_fds[i] = snap->layer_map_fds[i] = -EBADF;
        snapshot_volumes_init(snap);
        r = vmstate_decode(vbuf, vlen, snap->state, &err);
        if (r < 0) {
                log_error("Fork of %s: the saved state does not decode: %s", vmm->id, err ?: strerror(-r));
                _exit(1);
        }
        snap->meta = (struct snapshot_meta) { .format = SNAPSHOT_META_FORMAT, .mem_size = vmm->mem_size, .vcpus = vmm->n_vcpus,
                                              .generation = vmm->generation };
        snprintf(snap->meta.tag, sizeof(snap->meta.tag), "%s", vmm->id);
        snprintf(snap->meta.kernel, sizeof(snap->meta.kernel), "%s", host->kernel ?: "");
        snprintf(snap->meta.guest, sizeof(snap->meta.guest), "%s", vmm->guest_kind[0] ? vmm->guest_kind : "test");
        r = virtio_blk_open_layers(vmm->blk, &snap->disk_fd, snap->layer_fds, snap->layer_map_fds, &snap->n_layers);
        if (r < 0) {
                log_error_errno(r, "Fork of %s: cannot reopen the disk: %m", vmm->id);
                _exit(1);
        }
        r = frozen_volumes(vmm, snap);
        if (r < 0) {
                log_error_errno(r, "Fork of %s: cannot reopen its volumes: %m", vmm->id);
                _exit(1);
        }
        r = template_serve_loaded(vmm->kvm_fd, snap, vmm->mem, tpl_fd, virtio_blk_overlay_dir(vmm->blk));
        _exit(r < 0 ? 1 : 0);
}

int vmm_fork_template(struct vmm *vmm, struct vmm_host *host, struct json_object *req, int *tpl_fd,
                      struct json_object *reply, char *msg, size_t msg_size) {
        _cleanup_free_ void *vbuf = NULL;
        uint64_t pause_us;
        size_t vlen;
        pid_t pid;

        if (*tpl_fd < 0) {
                snprintf(msg, msg_size, "fork needs the template's control socket (SCM_RIGHTS)");
                return -EINVAL;
        }
        pid = pause_and_fork(vmm, &vbuf, &vlen, &pause_us, msg, msg_size);
        if (pid < 0)
                return pid;
        if (pid == 0)
                frozen_template_main(vmm, host, vbuf, vlen, *tpl_fd);
        *tpl_fd = safe_close(*tpl_fd);
        json_object_object_add(reply, "pause_us", json_object_new_int64((int64_t) pause_us));
        json_object_object_add(reply, "pid", json_object_new_int(pid));
        return 0;
}

int vmm_branch(struct vmm *vmm, struct vmm_host *host, struct json_object *req, int *result_fd,
               struct json_object *reply, char *msg, size_t msg_size) {
        _cleanup_free_ void *vbuf = NULL;
        struct json_object *o;
        const char *dir, *tag, *mode = "full", *branched_from = NULL;
        int pause_pipe[2], staging_fd = -EBADF;
        struct snapshot_parent parent = {};
        uint64_t pause_us;
        size_t vlen;
        pid_t pid;

        if (!json_object_object_get_ex(req, "dir", &o) || !json_object_is_type(o, json_type_string) ||
            !(dir = json_object_get_string(o)) || dir[0] != '/' || strlen(dir) >= 4000 ||
            strlen(dir) != (size_t) json_object_get_string_len(o)) {
                snprintf(msg, msg_size, "branch needs \"dir\", an absolute path");
                return -EINVAL;
        }
        if (!json_object_object_get_ex(req, "tag", &o) || !json_object_is_type(o, json_type_string) ||
            !snapshot_tag_is_valid(tag = json_object_get_string(o))) {
                snprintf(msg, msg_size, "branch \"tag\" must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$");
                return -EINVAL;
        }
        if (json_object_object_get_ex(req, "mode", &o)) {
                if (!json_object_is_type(o, json_type_string) ||
                    (strcmp((mode = json_object_get_string(o)), "full") != 0 && strcmp(mode, "diff") != 0)) {
                        snprintf(msg, msg_size, "branch \"mode\" must be \"full\" or \"diff\"");
                        return -EINVAL;
                }
        }
        if (strcmp(mode, "diff") == 0) {
                /* The snapshot the VM was restored from: its memory is what the diff is against. */
                if (!json_object_object_get_ex(req, "parent_dir", &o) || !json_object_is_type(o, json_type_string) ||
                    !(parent.dir = json_object_get_string(o)) || parent.dir[0] != '/' ||
                    strlen(parent.dir) >= 4000 || strlen(parent.dir) != (size_t) json_object_get_string_len(o) ||
                    !json_object_object_get_ex(req, "parent_tag", &o) || !json_object_is_type(o, json_type_string) ||
                    !snapshot_tag_is_valid(parent.tag = json_object_get_string(o))) {
                        snprintf(msg, msg_size, "a diff branch needs \"parent_dir\" (absolute) and \"parent_tag\"");
                        return -EINVAL;
                }
                if (access(parent.dir, F_OK) < 0) {
                        snprintf(msg, msg_size, "the parent snapshot %s is gone", parent.dir);
                        return -ENOENT;
                }
        }
        if (json_object_object_get_ex(req, "branched_from", &o) &&
            (!json_object_is_type(o, json_type_string) ||
             !snapshot_tag_is_valid(branched_from = json_object_get_string(o)))) {
                snprintf(msg, msg_size, "branch \"branched_from\" must be a sandbox id");
                return -EINVAL;
        }
        if (*result_fd < 0) {
                snprintf(msg, msg_size, "branch needs a result fd (SCM_RIGHTS)");
                return -EINVAL;
        }
        if (access(dir, F_OK) == 0) {
                snprintf(msg, msg_size, "%s exists already", dir);
                return -EEXIST;
        }
        if (json_object_object_get_ex(req, "staging", &o) && json_object_get_boolean(o)) {
                staging_fd = recv_staging_dir(*result_fd);
                if (staging_fd < 0) {
                        snprintf(msg, msg_size, "a \"staging\" branch needs the directory's descriptor first "
                                 "on its result socket");
                        return staging_fd;
                }
        }

        if (pipe2(pause_pipe, O_CLOEXEC) < 0) {
                snprintf(msg, msg_size, "pipe failed: %s", strerror(errno));
                safe_close(staging_fd);
                return -errno;
        }
        pid = pause_and_fork(vmm, &vbuf, &vlen, &pause_us, msg, msg_size);
        if (pid != 0) {
                safe_close(pause_pipe[0]);
                staging_fd = safe_close(staging_fd);
        }
        if (pid < 0) {
                safe_close(pause_pipe[1]);
                if (pid == -EOPNOTSUPP)
                        snprintf(msg, msg_size, "branch needs a VM restored from a snapshot (private guest memory)");
                return pid;
        }
        if (pid == 0) {
                safe_close(pause_pipe[1]);
                frozen_copy_main(vmm, host, dir, tag, vbuf, vlen, *result_fd,
                                 strcmp(mode, "diff") == 0 ? &parent : NULL, branched_from, pause_pipe[0],
                                 staging_fd);
        }
        (void) !write(pause_pipe[1], &pause_us, sizeof(pause_us)); /* 8 bytes into an empty pipe: not short */
        safe_close(pause_pipe[1]);
        *result_fd = safe_close(*result_fd);
        json_object_object_add(reply, "pause_us", json_object_new_int64((int64_t) pause_us));
        json_object_object_add(reply, "pid", json_object_new_int(pid));
        json_object_object_add(reply, "mode", json_object_new_string(mode));
        return 0;
}
