/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The run loop: vCPU 0's KVM_RUN in the main thread, exits dispatched to the
 * buses, host fds serviced between runs. A host fd that becomes ready raises
 * SIGIO (O_ASYNC), whose handler sets immediate_exit so a vCPU sleeping in a
 * halted guest comes back to us at once. The other vCPUs run in threads of
 * their own (vcpu_thread()); device emulation is serialised by vmm->dev_lock
 * (see vmm.h).
 */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <json-c/json.h>

#include "jail.h"
#include "json-util.h"
#include "kvm.h"
#include "vmm-limits.h"
#include "machine.h"
#include "branch.h"
#include "run.h"
#include "serial.h"
#include "snapshot-meta.h"
#include "snapshot.h"
#include "virtio-console.h"
#include "virtio-net.h"
#include "vmm-client.h"

#define CONTROL_MSG_MAX (64u << 10)
#define CONTROL_FDS_MAX 4u

/* The kvm_run of the vCPU the calling thread runs, if it runs one. */
static __thread struct kvm_run *volatile current_run;
static volatile sig_atomic_t got_term;
static volatile pid_t vcpu_tid; /* the main thread, vCPU 0's */

/* KVM may add its own worker threads to our thread group (for instance the
 * NX huge page recovery task); a process-directed signal can land there and
 * would then not interrupt KVM_RUN. SIGIO is aimed at the main thread
 * (F_OWNER_TID) or at an AP's thread (a kick); other signals, and SIGIO that
 * lands on a thread that runs no vCPU, are passed on to the main thread. */
static void kick_vcpu(int sig, bool to_main) {
        struct kvm_run *run = current_run;

        if (run)
                run->immediate_exit = 1;
        if ((to_main || !run) && vcpu_tid > 0 && gettid() != vcpu_tid)
                (void) tgkill(getpid(), vcpu_tid, sig);
}

pid_t vmm_event_tid(void) {
        return vcpu_tid > 0 ? vcpu_tid : gettid();
}

static void on_sigio(int sig) {
        kick_vcpu(sig, false);
}

static void on_term(int sig) {
        got_term = 1;
        kick_vcpu(sig, true);
}

int vmm_install_signals(void) {
        struct sigaction sa = { .sa_handler = on_sigio };
        sigset_t ss;

        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGIO, &sa, NULL) < 0)
                return -errno;
        sa.sa_handler = on_term;
        if (sigaction(SIGTERM, &sa, NULL) < 0 || sigaction(SIGINT, &sa, NULL) < 0)
                return -errno;
        sa.sa_handler = SIG_IGN;
        if (sigaction(SIGPIPE, &sa, NULL) < 0)
                return -errno;

        sigemptyset(&ss);
        sigaddset(&ss, SIGIO);
        sigaddset(&ss, SIGTERM);
        sigaddset(&ss, SIGINT);
        return sigprocmask(SIG_UNBLOCK, &ss, NULL) < 0 ? -errno : 0;
}

/* Route readiness of fd to us as SIGIO. */
static int arm_fd(int fd) {
        int fl;

        if (fd < 0)
                return 0;
        struct f_owner_ex owner = { .type = F_OWNER_TID, .pid = gettid() };

        fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_ASYNC | O_NONBLOCK) < 0)
                return -errno;
        /* The owner after O_ASYNC: turning it on makes a tap's fasync handler
         * set the whole process as the owner, over what was set before. */
        if (fcntl(fd, F_SETOWN_EX, &owner) < 0)
                return -errno;
        return 0;
}

static void control_reply(struct vmm_host *host, struct json_object *reply) {
        const char *s = json_object_to_json_string_ext(reply, JSON_C_TO_STRING_PLAIN);

        if (host->control_fd >= 0 && send(host->control_fd, s, strlen(s), MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
                log_debug_errno(errno, "Failed to send control reply: %m");
}

static void control_error(struct vmm_host *host, const char *msg) {
        struct json_object *o = json_object_new_object();

        json_object_object_add(o, "ok", json_object_new_boolean(0));
        json_object_object_add(o, "error", json_object_new_string(msg));
        control_reply(host, o);
        json_object_put(o);
}

static int quiesce_one(struct vmm_vcpu *c) {
        c->run->immediate_exit = 1;
        if (ioctl(c->fd, KVM_RUN, 0) < 0 && errno != EINTR)
                return -errno;
        c->run->immediate_exit = 0;
        return 0;
}

/* Complete any in-flight PIO/MMIO so that the register state is consistent.
 * The APs do it for themselves before they park (vcpu_park()). */
int vcpu_quiesce(struct vmm *vmm) {
        return quiesce_one(&vmm->vcpus[0]);
}

/* Whether the AP threads run: not before vmm_run() starts them, and not in a
 * frozen copy (fork(2) copies no threads). */
static bool aps_running(struct vmm *vmm) {
        return vmm->n_vcpus > 1 && vmm->vcpus[1].thread_started;
}

void vmm_vcpus_stop(struct vmm *vmm) {
        unsigned n_aps = 0;

        if (!aps_running(vmm))
                return;
        pthread_mutex_lock(&vmm->vcpu_lock);
        vmm->vcpus_hold++;
        for (unsigned i = 1; i < vmm->n_vcpus; i++) {
                struct vmm_vcpu *c = &vmm->vcpus[i];

                if (!c->thread_started)
                        continue;
                n_aps++;
                c->run->immediate_exit = 1;
                if (c->tid > 0)
                        (void) tgkill(getpid(), c->tid, SIGIO);
        }
        /* The caller (main thread, servicing the host) holds the device lock,
         * which an AP may wait for to finish an exit before it parks. */
        pthread_mutex_unlock(&vmm->dev_lock);
        /* An AP that stops the VM (vmm_request_stop() broadcasts) leaves its loop
         * instead of parking: then the VM is going down and nothing waits for it. */
        while (vmm->n_parked < n_aps && vmm->stop == VMM_RUNNING)
                pthread_cond_wait(&vmm->vcpu_cond, &vmm->vcpu_lock);
        pthread_mutex_unlock(&vmm->vcpu_lock);
        pthread_mutex_lock(&vmm->dev_lock);
}

void vmm_vcpus_resume(struct vmm *vmm) {
        if (!aps_running(vmm))
                return;
        pthread_mutex_lock(&vmm->vcpu_lock);
        if (vmm->vcpus_hold > 0)
                vmm->vcpus_hold--;
        if (vmm->vcpus_hold == 0)
                pthread_cond_broadcast(&vmm->vcpu_cond);
        pthread_mutex_unlock(&vmm->vcpu_lock);
}

/* The NIC in a status reply: MAC, link, counters. */
static struct json_object *net_status(struct virtio_mmio *net) {
        struct json_object *o = json_object_new_object();
        struct virtio_net_stats st = {};
        char mac_s[VIRTIO_NET_MAC_STRING_MAX];
        uint8_t mac[VIRTIO_NET_MAC_LEN];

        if (virtio_net_get_mac(net, mac) >= 0) {
                virtio_net_format_mac(mac, mac_s);
                json_object_object_add(o, "mac", json_object_new_string(mac_s));
        }
        json_object_object_add(o, "link", json_object_new_string(virtio_net_link_up(net) ? "up" : "down"));
        (void) virtio_net_get_stats(net, &st);
        json_object_object_add(o, "rx_packets", json_object_new_int64((int64_t) st.rx_packets));
        json_object_object_add(o, "rx_bytes", json_object_new_int64((int64_t) st.rx_bytes));
        json_object_object_add(o, "rx_dropped", json_object_new_int64((int64_t) st.rx_dropped));
        json_object_object_add(o, "tx_packets", json_object_new_int64((int64_t) st.tx_packets));
        json_object_object_add(o, "tx_bytes", json_object_new_int64((int64_t) st.tx_bytes));
        json_object_object_add(o, "tx_dropped", json_object_new_int64((int64_t) st.tx_dropped));
        json_object_object_add(o, "tx_errors", json_object_new_int64((int64_t) st.tx_errors));
        return o;
}

static void control_handle(struct vmm *vmm, struct vmm_host *host, const char *buf, size_t len, int *fd) {
        struct json_object *req = NULL, *o, *reply;
        const char *err = NULL, *op;
        int r;

        r = json_parse_strict(buf, len, CONTROL_MSG_MAX, 4, &req, &err);
        if (r < 0) {
                control_error(host, err ?: "malformed request");
                return;
        }
        if (!json_object_object_get_ex(req, "op", &o) || !json_object_is_type(o, json_type_string)) {
                control_error(host, "request lacks a string \"op\"");
                goto out;
        }
        op = json_object_get_string(o);
        reply = json_object_new_object();
        json_object_object_add(reply, "ok", json_object_new_boolean(1));

        if (strcmp(op, "status") == 0) {
                json_object_object_add(reply, "id", json_object_new_string(vmm->id));
                json_object_object_add(reply, "generation", json_object_new_int64((int64_t) vmm->generation));
                json_object_object_add(reply, "state", json_object_new_string(host->paused ? "paused" : "running"));
                json_object_object_add(reply, "pid", json_object_new_int(getpid()));
                if (vmm->net)
                        json_object_object_add(reply, "net", net_status(vmm->net));
        } else if (strcmp(op, "pause") == 0) {
                /* vCPU 0 stays out of KVM_RUN while paused; the APs are held. */
                if (!host->paused)
                        vmm_vcpus_stop(vmm);
                host->paused = true;
        } else if (strcmp(op, "resume") == 0) {
                if (host->paused)
                        vmm_vcpus_resume(vmm);
                host->paused = false;
        } else if (strcmp(op, "set_limits") == 0) {
                char msg[FORK_OPTION_ERROR_MAX];

                if (vmm_limits_set_json(vmm, req, reply, msg) < 0) {
                        json_object_put(reply);
                        control_error(host, msg);
                        goto out;
                }
        } else if (strcmp(op, "shutdown") == 0) {
                vmm_request_stop(vmm, VMM_STOP_SIGNAL);
        } else if (strcmp(op, "snapshot") == 0) {
                struct json_object *d, *t, *st;
                const char *dir, *tag;
                bool staging;

                if (!json_object_object_get_ex(req, "dir", &d) || !json_object_is_type(d, json_type_string) ||
                    !json_object_object_get_ex(req, "tag", &t) || !json_object_is_type(t, json_type_string)) {
                        json_object_put(reply);
                        control_error(host, "snapshot needs string fields \"dir\" and \"tag\"");
                        goto out;
                }
                dir = json_object_get_string(d);
                tag = json_object_get_string(t);
                if (dir[0] != '/' || strlen(dir) >= 4000) {
                        json_object_put(reply);
                        control_error(host, "snapshot \"dir\" must be an absolute path");
                        goto out;
                }
                if (!snapshot_tag_is_valid(tag)) {
                        json_object_put(reply);
                        control_error(host, "snapshot \"tag\" must match ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$");
                        goto out;
                }
                /* "staging": written into the directory forkd made and sent (the one
                 * descriptor), which forkd renames into place: dir is only named. */
                staging = json_object_object_get_ex(req, "staging", &st) && json_object_get_boolean(st);
                if (staging && *fd < 0) {
                        json_object_put(reply);
                        control_error(host, "a \"staging\" snapshot needs the directory's descriptor");
                        goto out;
                }
                vmm_vcpus_stop(vmm);
                r = vcpu_quiesce(vmm);
                if (r >= 0)
                        r = staging ? snapshot_write_at(vmm, *fd, tag, host->kernel) :
                                      snapshot_write(vmm, dir, tag, host->kernel);
                vmm_vcpus_resume(vmm);
                if (r < 0) {
                        char msg[256];
                        json_object_put(reply);
                        snprintf(msg, sizeof(msg), "snapshot failed: %s", strerror(-r));
                        control_error(host, msg);
                        goto out;
                }
                json_object_object_add(reply, "dir", json_object_new_string(dir));
        } else if (strcmp(op, "branch") == 0 || strcmp(op, "fork") == 0) {
                char msg[256] = "";

                /* Every vCPU out of KVM_RUN while the state is saved; the APs run
                 * again once the copy is forked (in the copy they do not exist). */
                vmm_vcpus_stop(vmm);
                if (strcmp(op, "branch") == 0)
                        r = vmm_branch(vmm, host, req, fd, reply, msg, sizeof(msg));
                else
                        r = vmm_fork_template(vmm, host, req, fd, reply, msg, sizeof(msg));
                vmm_vcpus_resume(vmm);
                if (r < 0) {
                        json_object_put(reply);
                        control_error(host, msg[0] ? msg : strerror(-r));
                        goto out;
                }
        } else {
                json_object_put(reply);
                control_error(host, "unknown op");
                goto out;
        }
        control_reply(host, reply);
        json_object_put(reply);
out:
        json_object_put(req);
}

static void control_read(struct vmm *vmm, struct vmm_host *host) {
        static char buf[CONTROL_MSG_MAX + 1];

        for (;;) {
                char cbuf[CMSG_SPACE(sizeof(int) * CONTROL_FDS_MAX)];
                struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
                struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                                     .msg_controllen = sizeof(cbuf) };
                int fds[CONTROL_FDS_MAX], fd = -EBADF;
                unsigned n_fds = 0;
                ssize_t n;

                n = recvmsg(host->control_fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
                if (n < 0) {
                        if (errno == EAGAIN || errno == EINTR)
                                return;
                        host->control_fd = safe_close(host->control_fd);
                        return;
                }
                for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
                        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                                continue;
                        for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                                int k;
                                memcpy(&k, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                                if (n_fds < CONTROL_FDS_MAX)
                                        fds[n_fds++] = k;
                                else
                                        safe_close(k);
                        }
                }
                /* At most one fd per request, and only for ops that take one. */
                if (n_fds == 1)
                        fd = fds[0];
                else
                        for (unsigned i = 0; i < n_fds; i++)
                                safe_close(fds[i]);
                if (n == 0) {
                        /* The controller went away. A VMM with nobody to answer to
                         * keeps running only if it was started standalone. */
                        safe_close(fd);
                        host->control_fd = safe_close(host->control_fd);
                        if (host->exit_on_control_eof)
                                vmm_request_stop(vmm, VMM_STOP_SIGNAL);
                        return;
                }
                if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || (size_t) n > CONTROL_MSG_MAX || n_fds > 1) {
                        safe_close(fd);
                        control_error(host, n_fds > 1 ? "at most one file descriptor per request" :
                                                        "request too large");
                        continue;
                }
                control_handle(vmm, host, buf, n, &fd);
                safe_close(fd);
        }
}

static void accept_on(int listen_fd, int *conn_fd) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
                return;
        safe_close(*conn_fd);
        *conn_fd = fd;
        (void) arm_fd(fd);
}

/* Service every host fd without blocking (or blocking, while paused). */
static void service_host(struct vmm *vmm, struct vmm_host *host, int timeout) {
        struct pollfd p[5];
        unsigned n = 0;
        int cfd = virtio_console_host_fd(vmm->console), nfd = virtio_net_backend_fd(vmm->net);
        int idx_console = -1, idx_ctl = -1, idx_alisten = -1, idx_clisten = -1, idx_net = -1;

        if (cfd >= 0 && cfd != host->armed_console_fd) {
                (void) arm_fd(cfd);
                host->armed_console_fd = cfd;
        }
        if (cfd >= 0) {
                short ev = virtio_console_poll_events(vmm->console);
                if (ev) {
                        idx_console = n;
                        p[n++] = (struct pollfd) { .fd = cfd, .events = ev };
                }
        }
        if (nfd >= 0) {
                /* Only while the guest has receive buffers: packets wait in
                 * the tap until then, and a guest refill is a notification. */
                short ev = virtio_net_poll_events(vmm->net);
                if (ev) {
                        idx_net = n;
                        p[n++] = (struct pollfd) { .fd = nfd, .events = ev };
                }
        }
        if (host->control_fd >= 0) {
                idx_ctl = n;
                p[n++] = (struct pollfd) { .fd = host->control_fd, .events = POLLIN };
        }
        if (host->agent_listen_fd >= 0) {
                idx_alisten = n;
                p[n++] = (struct pollfd) { .fd = host->agent_listen_fd, .events = POLLIN };
        }
        if (host->control_listen_fd >= 0) {
                idx_clisten = n;
                p[n++] = (struct pollfd) { .fd = host->control_listen_fd, .events = POLLIN };
        }
        if (n == 0 || poll(p, n, timeout) <= 0)
                goto process;

        if (idx_alisten >= 0 && (p[idx_alisten].revents & POLLIN)) {
                int fd = accept4(host->agent_listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                /* Arm it now, not on the next pass: that pass may only come
                 * after a KVM_RUN that nothing would interrupt. What arrived
                 * before arming, virtio_console_process() below reads. */
                if (fd >= 0 && (arm_fd(fd) < 0 || virtio_console_set_host_fd(vmm->console, fd) < 0))
                        safe_close(fd);
                else if (fd >= 0)
                        host->armed_console_fd = fd;
        }
        if (idx_clisten >= 0 && (p[idx_clisten].revents & POLLIN)) {
                accept_on(host->control_listen_fd, &host->control_fd);
                /* Bytes that arrived before the fd was armed raised no SIGIO:
                 * read them now rather than wait for the next event. */
                if (host->control_fd >= 0)
                        control_read(vmm, host);
        } else if (idx_ctl >= 0 && (p[idx_ctl].revents & (POLLIN | POLLHUP | POLLERR)))
                control_read(vmm, host);
        if (idx_net >= 0 && (p[idx_net].revents & (POLLIN | POLLERR | POLLHUP)))
                virtio_net_process_rx(vmm, vmm->net);
process:
        (void) idx_console;
        virtio_console_process(vmm, vmm->console);
        vmm_limits_service(vmm);
}

static int handle_io(struct vmm *vmm, struct kvm_run *run) {
        uint8_t *data = (uint8_t *) run + run->io.data_offset;
        uint32_t sz = run->io.size;

        if (run->io.data_offset + (uint64_t) sz * run->io.count > vmm->run_size || sz > 4)
                return -EINVAL;

        for (uint32_t i = 0; i < run->io.count; i++, data += sz) {
                struct pio_dev *d = vmm_find_pio(vmm, run->io.port, sz);

                if (!d) {
                        if (run->io.direction == KVM_EXIT_IO_IN)
                                memset(data, 0xff, sz);
                        else if (run->io.port == JAIL_TEST_HOOK_PORT)
                                jail_test_hook(*data); /* does nothing unless tests asked for it */
                        continue;
                }
                if (run->io.direction == KVM_EXIT_IO_IN)
                        d->read(vmm, d, run->io.port - d->base, data, sz);
                else
                        d->write(vmm, d, run->io.port - d->base, data, sz);
        }
        return 0;
}

static int handle_mmio(struct vmm *vmm, struct kvm_run *run) {
        uint32_t len = run->mmio.len;
        struct mmio_dev *d;

        if (len == 0 || len > sizeof(run->mmio.data))
                return -EINVAL;
        d = vmm_find_mmio(vmm, run->mmio.phys_addr, len);
        if (!d) {
                if (!run->mmio.is_write)
                        memset(run->mmio.data, 0xff, len);
                return 0;
        }
        if (run->mmio.is_write)
                d->write(vmm, d, run->mmio.phys_addr - d->base, run->mmio.data, len);
        else
                d->read(vmm, d, run->mmio.phys_addr - d->base, run->mmio.data, len);
        return 0;
}

/* Dispatch one exit of vCPU c, with vmm->dev_lock held. */
static void handle_exit(struct vmm *vmm, struct vmm_vcpu *c) {
        struct kvm_run *run = c->run;
        int r;

        switch (run->exit_reason) {
        case KVM_EXIT_IO:
                r = handle_io(vmm, run);
                break;
        case KVM_EXIT_MMIO:
                r = handle_mmio(vmm, run);
                break;
        case KVM_EXIT_HLT:
                /* With the in-kernel irqchip KVM handles HLT; a guest that
                 * halts with interrupts off is dead. */
                log_warning("%s: guest halted with no way to wake up (vCPU %u)", vmm->id, c->index);
                vmm_request_stop(vmm, VMM_STOP_HALTED);
                r = 0;
                break;
        case KVM_EXIT_SHUTDOWN:
                log_warning("%s: guest triple-faulted (vCPU %u)", vmm->id, c->index);
                vmm_request_stop(vmm, VMM_STOP_SHUTDOWN);
                r = 0;
                break;
        case KVM_EXIT_SYSTEM_EVENT:
                vmm_request_stop(vmm, VMM_STOP_RESET);
                r = 0;
                break;
        case KVM_EXIT_INTR:
                r = 0;
                break;
        case KVM_EXIT_FAIL_ENTRY:
                log_error("%s: KVM entry failed, reason 0x%llx", vmm->id,
                          (unsigned long long) run->fail_entry.hardware_entry_failure_reason);
                vmm_request_stop(vmm, VMM_STOP_ERROR);
                r = 0;
                break;
        case KVM_EXIT_INTERNAL_ERROR:
                log_error("%s: KVM internal error, suberror %u", vmm->id, run->internal.suberror);
                vmm_request_stop(vmm, VMM_STOP_ERROR);
                r = 0;
                break;
        default:
                log_error("%s: unhandled exit reason %u", vmm->id, run->exit_reason);
                vmm_request_stop(vmm, VMM_STOP_ERROR);
                r = 0;
        }
        if (r < 0) {
                log_error_errno(r, "%s: bad exit data from KVM: %m", vmm->id);
                vmm_request_stop(vmm, VMM_STOP_ERROR);
        }
}

/* An AP's thread: KVM_RUN until the VM stops, parked while vmm_vcpus_stop()
 * holds the APs. */
static void *vcpu_thread(void *userdata) {
        struct vmm_vcpu *c = userdata;
        struct vmm *vmm = c->vmm;

        current_run = c->run;
        c->tid = gettid();
        for (;;) {
                bool stop;

                pthread_mutex_lock(&vmm->vcpu_lock);
                if (vmm->vcpus_hold > 0 && vmm->stop == VMM_RUNNING) {
                        /* Complete an in-flight PIO/MMIO: the saved registers must be whole. */
                        (void) quiesce_one(c);
                        c->parked = true;
                        vmm->n_parked++;
                        pthread_cond_broadcast(&vmm->vcpu_cond);
                        while (vmm->vcpus_hold > 0 && vmm->stop == VMM_RUNNING)
                                pthread_cond_wait(&vmm->vcpu_cond, &vmm->vcpu_lock);
                        c->parked = false;
                        vmm->n_parked--;
                }
                stop = vmm->stop != VMM_RUNNING;
                pthread_mutex_unlock(&vmm->vcpu_lock);
                if (stop)
                        break;

                if (ioctl(c->fd, KVM_RUN, 0) < 0) {
                        if (errno == EINTR || errno == EAGAIN) {
                                /* A kick; what it asked for is checked above, under the lock. */
                                c->run->immediate_exit = 0;
                                continue;
                        }
                        log_error_errno(errno, "KVM_RUN of vCPU %u failed: %m", c->index);
                        pthread_mutex_lock(&vmm->dev_lock);
                        vmm_request_stop(vmm, VMM_STOP_ERROR);
                        pthread_mutex_unlock(&vmm->dev_lock);
                        break;
                }
                pthread_mutex_lock(&vmm->dev_lock);
                handle_exit(vmm, c);
                pthread_mutex_unlock(&vmm->dev_lock);
        }
        current_run = NULL;
        return NULL;
}

static int start_aps(struct vmm *vmm) {
        for (unsigned i = 1; i < vmm->n_vcpus; i++) {
                struct vmm_vcpu *c = &vmm->vcpus[i];
                int r;

                r = pthread_create(&c->thread, NULL, vcpu_thread, c);
                if (r != 0)
                        return log_error_errno(r, "Failed to start the thread of vCPU %u: %m", i);
                c->thread_started = true;
        }
        return 0;
}

static void join_aps(struct vmm *vmm) {
        for (unsigned i = 1; i < vmm->n_vcpus; i++) {
                struct vmm_vcpu *c = &vmm->vcpus[i];

                if (!c->thread_started)
                        continue;
                (void) pthread_join(c->thread, NULL);
                c->thread_started = false;
                c->tid = 0;
        }
}

int vmm_run(struct vmm *vmm, struct vmm_host *host) {
        struct kvm_run *run = vmm->run;
        int r;

        host->armed_console_fd = -1;
        vcpu_tid = gettid();
        r = arm_fd(host->control_fd);
        if (r >= 0)
                r = arm_fd(host->agent_listen_fd);
        if (r >= 0)
                r = arm_fd(host->control_listen_fd);
        if (r >= 0)
                r = arm_fd(virtio_net_backend_fd(vmm->net)); /* set once, before the guest runs */
        if (r < 0)
                return log_error_errno(r, "Failed to set up host fds: %m");

        current_run = run;
        vmm->vcpus[0].tid = vcpu_tid;
        /* The APs' threads: here, so that a template's child starts its own after fork(2). */
        r = start_aps(vmm);
        if (r < 0)
                vmm_request_stop(vmm, VMM_STOP_ERROR);
        while (vmm->stop == VMM_RUNNING) {
                bool stop;

                /* Clear before servicing: a SIGIO arriving after the poll below
                 * makes the next KVM_RUN return at once instead of being lost. */
                run->immediate_exit = 0;
                pthread_mutex_lock(&vmm->dev_lock);
                service_host(vmm, host, host->paused ? 1000 : 0);
                if (got_term)
                        vmm_request_stop(vmm, VMM_STOP_SIGNAL);
                stop = vmm->stop != VMM_RUNNING;
                pthread_mutex_unlock(&vmm->dev_lock);
                if (stop)
                        break;
                if (host->paused)
                        continue;

                if (ioctl(vmm->vcpu_fd, KVM_RUN, 0) < 0) {
                        if (errno == EINTR || errno == EAGAIN)
                                continue;
                        r = log_error_errno(errno, "KVM_RUN failed: %m");
                        pthread_mutex_lock(&vmm->dev_lock);
                        vmm_request_stop(vmm, VMM_STOP_ERROR);
                        pthread_mutex_unlock(&vmm->dev_lock);
                        break;
                }

                pthread_mutex_lock(&vmm->dev_lock);
                handle_exit(vmm, &vmm->vcpus[0]);
                pthread_mutex_unlock(&vmm->dev_lock);
        }
        /* vmm_request_stop() kicked the APs and woke the parked ones. */
        join_aps(vmm);
        vmm->vcpus[0].tid = 0;
        current_run = NULL;
        serial_flush(vmm->serial);

        switch (vmm->stop) {
        case VMM_STOP_RESET:
        case VMM_STOP_SIGNAL:
                return 0;
        case VMM_STOP_SHUTDOWN:
        case VMM_STOP_HALTED:
                return -ECANCELED;
        default:
                return -EIO;
        }
}

int vmm_exit_status(const struct vmm *vmm) {
        switch (vmm->stop) {
        case VMM_STOP_RESET:
        case VMM_STOP_SIGNAL:
                return 0;
        case VMM_STOP_SHUTDOWN:
                return VMM_EXIT_TRIPLE_FAULT;
        case VMM_STOP_HALTED:
                return VMM_EXIT_HALTED;
        default:
                return VMM_CHILD_EXIT_FAILED;
        }
}
