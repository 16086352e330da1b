/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Branching a running VM: see branch.h. */
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include <json-c/json.h>

#include "branch.h"
#include "snapshot-meta.h"
#include "snapshot.h"
#include "virtio-blk.h"
#include "virtio-console.h"
#include "vmm-client.h"

static void send_result(int fd, int r, const char *dir) {
        struct json_object *o = json_object_new_object();
        const char *s;

        json_object_object_add(o, "ok", json_object_new_boolean(r >= 0));
        if (r >= 0)
                json_object_object_add(o, "dir", json_object_new_string(dir));
        else {
                char msg[256];
                snprintf(msg, sizeof(msg), "writing the snapshot failed: %s", strerror(-r));
                json_object_object_add(o, "error", json_object_new_string(msg));
        }
        s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
        /* send() on a socket, write() on a pipe */
        if (send(fd, s, strlen(s), MSG_NOSIGNAL) < 0 && errno == ENOTSOCK)
                (void) !write(fd, s, strlen(s));
        json_object_put(o);
}

static _Noreturn void frozen_copy_main(struct vmm *vmm, struct vmm_host *host, const char *dir, const char *tag,
                                       const void *vbuf, size_t vlen, int result_fd) {
        struct sigaction sa = { .sa_handler = SIG_DFL };
        int r;

        /* Nothing of the running VM's: no KVM fd (they belong to the source's
         * mm, and would keep its VM alive), no host channel. */
        (void) munmap(vmm->run, vmm->run_size); /* holds the vCPU file too */
        safe_close(vmm->vcpu_fd);
        safe_close(vmm->vm_fd);
        safe_close(vmm->kvm_fd);
        safe_close(host->control_fd);
        safe_close(host->agent_listen_fd);
        safe_close(host->control_listen_fd);
        safe_close(virtio_console_host_fd(vmm->console));
        sigemptyset(&sa.sa_mask);
        (void) sigaction(SIGIO, &(struct sigaction) { .sa_handler = SIG_IGN }, NULL);
        (void) sigaction(SIGTERM, &sa, NULL);
        (void) sigaction(SIGINT, &sa, NULL);
        (void) prctl(PR_SET_NAME, "forkd-branch");

        r = snapshot_write_collected(vmm, dir, tag, host->kernel, vbuf, vlen, true);
        if (r < 0)
                log_error_errno(r, "Branch %s: writing %s failed: %m", tag, dir);
        send_result(result_fd, r, dir);
        _exit(r < 0 ? 1 : 0);
}

int vmm_branch(struct vmm *vmm, struct vmm_host *host, struct json_object *req, int *result_fd,
               struct json_object *reply, char *msg, size_t msg_size) {
        _cleanup_free_ void *vbuf = NULL;
        struct json_object *o;
        const char *dir, *tag, *mode = "full";
        uint64_t t0, t1;
        size_t vlen;
        pid_t pid;
        int r;

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
                    strcmp((mode = json_object_get_string(o)), "full") != 0) {
                        snprintf(msg, msg_size, "branch \"mode\" must be \"full\"");
                        return -EINVAL;
                }
        }
        if (vmm->mem_fd >= 0) {
                /* RAM of a booted VM is a shared memfd: a fork would not freeze it. */
                snprintf(msg, msg_size, "branch needs a VM restored from a snapshot (private guest memory)");
                return -EOPNOTSUPP;
        }
        if (*result_fd < 0) {
                snprintf(msg, msg_size, "branch needs a result fd (SCM_RIGHTS)");
                return -EINVAL;
        }
        if (access(dir, F_OK) == 0) {
                snprintf(msg, msg_size, "%s exists already", dir);
                return -EEXIST;
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
        if (pid == 0)
                frozen_copy_main(vmm, host, dir, tag, vbuf, vlen, *result_fd);
        t1 = now_usec();
        /* The pause ends when the run loop calls KVM_RUN again, right after the reply. */
        *result_fd = safe_close(*result_fd);
        json_object_object_add(reply, "pause_us", json_object_new_int64((int64_t) (t1 - t0)));
        json_object_object_add(reply, "pid", json_object_new_int(pid));
        json_object_object_add(reply, "mode", json_object_new_string(mode));
        return 0;
}
