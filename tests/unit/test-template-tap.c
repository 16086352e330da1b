/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * A template's spawn requests for a snapshot with a NIC (template.c,
 * "with_tap"): a real template process (template_serve_loaded()) over a
 * snapshot held in memory, talked to over its seqpacket control socket as
 * forkd talks to it. Without /dev/kvm its children cannot restore (they exit
 * with status 2), which is enough to see what the template accepts, refuses
 * and passes on: every refusal happens before any child is forked.
 */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "bootinfo.h"
#include "machine.h"
#include "snapshot.h"
#include "template.h"
#include "virtio-mmio.h"
#include "virtio-net.h"
#include "vmm-client.h"
#include "vmstate.h"

#define MEM_SIZE (4u << 20)

static const uint8_t mac_a[6] = { 0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0x01 };

struct tpl {
        pid_t pid;
        int ctl; /* our end of the control socket */
        unsigned exits;
        int last_exit_code;
};

/* The DEVICE blob a VM with a NIC saves. */
static void net_blob(struct vmstate_dev *d) {
        struct vmm *v = calloc(1, sizeof *v);
        struct virtio_mmio *dev = NULL;
        size_t len;

        assert_non_null(v);
        v->kvm_fd = v->vm_fd = v->vcpu_fd = v->mem_fd = -1;
        v->mem = mmap(NULL, MEM_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        assert_true(v->mem != MAP_FAILED);
        v->mem_size = MEM_SIZE;
        v->stats = &v->own_stats; /* as vmm_new(): never NULL */
        assert_int_equal(virtio_net_new(v, FORKD_VIRTIO_MMIO_BASE, 7, mac_a, &dev), 0);
        assert_int_equal(virtio_mmio_save(dev, d->blob, sizeof d->blob, &len), 0);
        d->kind = VMSTATE_DEV_VIRTIO_NET;
        d->len = (uint32_t) len;
        virtio_mmio_free(dev);
        munmap(v->mem, MEM_SIZE);
        free(v);
}

static struct snapshot *fake_snapshot(bool with_nic) {
        struct snapshot *s = calloc(1, sizeof *s);

        assert_non_null(s);
        s->state = calloc(1, sizeof *s->state);
        assert_non_null(s->state);
        s->mem_fd = s->disk_fd = -EBADF;
        for (unsigned i = 0; i < SNAPSHOT_DISK_LAYERS_MAX; i++)
                s->layer_fds[i] = s->layer_map_fds[i] = -EBADF;
        s->meta.mem_size = MEM_SIZE;
        s->meta.vcpus = 1;
        s->state->memory.mem_size = MEM_SIZE;
        s->state->n_vcpus = 1;
        if (with_nic) {
                s->state->n_devs = 1;
                net_blob(&s->state->devs[0]);
        }
        return s;
}

static int recv_json(struct tpl *t, char *buf, size_t size) {
        struct pollfd p = { .fd = t->ctl, .events = POLLIN };
        ssize_t n;

        if (poll(&p, 1, 10000) <= 0)
                return -ETIMEDOUT;
        n = recv(t->ctl, buf, size - 1, 0);
        if (n <= 0)
                return -ECONNRESET;
        buf[n] = 0;
        return 0;
}

static void start(struct tpl *t, bool with_nic) {
        int sv[2];
        char buf[4096];

        assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
        t->pid = fork();
        assert_true(t->pid >= 0);
        if (t->pid == 0) {
                struct snapshot *s = fake_snapshot(with_nic);
                int r;

                close(sv[0]);
                r = template_serve_loaded(-1, s, NULL, sv[1], "/tmp");
                _exit(r < 0 ? 1 : 0);
        }
        close(sv[1]);
        t->ctl = sv[0];
        assert_int_equal(recv_json(t, buf, sizeof buf), 0);
        assert_non_null(strstr(buf, "\"event\":\"ready\""));
}

static void stop(struct tpl *t) {
        int status;

        close(t->ctl);
        assert_int_equal(waitpid(t->pid, &status, 0), t->pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
}

/* Send a request with fds attached; return the reply (events are counted
 * and skipped). */
static void request(struct tpl *t, const char *json, const int *fds, unsigned n_fds, char *reply, size_t size) {
        char cbuf[CMSG_SPACE(sizeof(int) * 16)] = {};
        struct iovec iov = { .iov_base = (void *) json, .iov_len = strlen(json) };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

        assert_true(n_fds <= 16);
        if (n_fds > 0) {
                struct cmsghdr *c;

                mh.msg_control = cbuf;
                mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
                c = CMSG_FIRSTHDR(&mh);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
                memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
        }
        assert_int_equal(sendmsg(t->ctl, &mh, MSG_NOSIGNAL), (ssize_t) strlen(json));
        for (;;) {
                assert_int_equal(recv_json(t, reply, size), 0);
                if (!strstr(reply, "\"event\""))
                        return;
                if (strstr(reply, "\"event\":\"exit\"")) {
                        const char *c = strstr(reply, "\"code\":");
                        t->exits++;
                        t->last_exit_code = c ? atoi(c + 7) : -1;
                }
        }
}

static void wait_exits(struct tpl *t, unsigned n) {
        char buf[4096];

        while (t->exits < n) {
                assert_int_equal(recv_json(t, buf, sizeof buf), 0);
                if (strstr(buf, "\"event\":\"exit\"")) {
                        const char *c = strstr(buf, "\"code\":");
                        t->exits++;
                        t->last_exit_code = c ? atoi(c + 7) : -1;
                }
        }
}

/* An fd pair standing for a child's socket: we keep [0], send [1]. */
static void pair(int p[2]) {
        assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, p), 0);
}

/* After the fd was handed over and its receivers are done with it, the far
 * end sees EOF: nobody kept a copy. */
static void assert_closed_everywhere(int near) {
        struct pollfd p = { .fd = near, .events = POLLIN };
        char b;

        assert_int_equal(poll(&p, 1, 10000), 1);
        assert_int_equal(recv(near, &b, 1, MSG_DONTWAIT), 0);
}

static void test_state_net(void **state) {
        _cleanup_free_ struct vmstate *s = calloc(1, sizeof *s);
        uint8_t mac[6] = {};

        (void) state;
        assert_non_null(s);
        assert_int_equal(machine_state_net(s, mac), 0);
        s->n_devs = 2;
        s->devs[0].kind = VMSTATE_DEV_SERIAL;
        net_blob(&s->devs[1]);
        assert_int_equal(machine_state_net(s, mac), 1);
        assert_memory_equal(mac, mac_a, 6);
        assert_int_equal(machine_state_net(s, NULL), 1);
        s->devs[1].blob[s->devs[1].len - 8] = 0x01; /* a multicast MAC */
        assert_int_equal(machine_state_net(s, mac), -EBADMSG);
        s->devs[1].len = 3;
        assert_int_equal(machine_state_net(s, mac), -EBADMSG);
}

static void test_spawn_with_nic(void **state) {
        struct tpl t = {};
        char reply[4096];
        int agent[2], tap[2], control[2];
        int fd;

        (void) state;
        start(&t, true);

        /* a snapshot with a NIC: no tap, no spawn */
        pair(agent);
        request(&t, "{\"op\":\"spawn\",\"ids\":[\"a\"]}", &agent[1], 1, reply, sizeof reply);
        assert_non_null(strstr(reply, "\"ok\":false"));
        assert_non_null(strstr(reply, "every child needs a tap"));
        request(&t, "{\"op\":\"spawn\",\"ids\":[\"a\"],\"with_tap\":false}", &agent[1], 1, reply, sizeof reply);
        assert_non_null(strstr(reply, "every child needs a tap"));
        request(&t, "{\"op\":\"spawn\",\"ids\":[\"a\"],\"with_tap\":1}", &agent[1], 1, reply, sizeof reply);
        assert_non_null(strstr(reply, "\"with_tap\\\" must be a boolean"));

        /* with_tap, but the fd missing */
        request(&t, "{\"op\":\"spawn\",\"ids\":[\"a\"],\"with_tap\":true}", &agent[1], 1, reply, sizeof reply);
        assert_non_null(strstr(reply, "wrong number of file descriptors"));

        /* a tap that is no tap: a regular file (the second child's) */
        pair(tap);
        fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        pair(control);
        request(&t, "{\"op\":\"spawn\",\"ids\":[\"a\",\"b\"],\"with_tap\":true,\"with_control\":true}",
                (int[]) { agent[1], control[1], tap[1], agent[1], control[1], fd }, 6, reply, sizeof reply);
        assert_non_null(strstr(reply, "every tap fd must be a tap"));
        close(fd);
        assert_int_equal(t.exits, 0); /* nothing was forked */

        /* and a good one: two children, each with control socket and tap */
        {
                int agent2[2], tap2[2], control2[2];

                pair(agent2);
                pair(tap2);
                pair(control2);
                request(&t, "{\"op\":\"spawn\",\"ids\":[\"a\",\"b\"],\"with_tap\":true,\"with_control\":true}",
                        (int[]) { agent[1], control[1], tap[1], agent2[1], control2[1], tap2[1] }, 6, reply,
                        sizeof reply);
                assert_non_null(strstr(reply, "\"ok\":true"));
                assert_non_null(strstr(reply, "\"pids\""));
                close(agent2[1]);
                close(control2[1]);
                close(tap2[1]);
                wait_exits(&t, 2);
                /* no /dev/kvm here: the restore fails */
                assert_int_equal(t.last_exit_code, VMM_CHILD_EXIT_RESTORE);
                assert_closed_everywhere(tap2[0]);
                assert_closed_everywhere(agent2[0]);
                close(agent2[0]);
                close(control2[0]);
                close(tap2[0]);
        }
        close(agent[1]);
        close(control[1]);
        close(tap[1]);
        assert_closed_everywhere(tap[0]);
        close(agent[0]);
        close(control[0]);
        close(tap[0]);
        stop(&t);
}

static void test_spawn_without_nic(void **state) {
        struct tpl t = {};
        char reply[4096];
        int agent[2], tap[2];

        (void) state;
        start(&t, false);
        pair(agent);
        pair(tap);

        /* a snapshot without a NIC takes no tap */
        request(&t, "{\"op\":\"spawn\",\"ids\":[\"a\"],\"with_tap\":true}", (int[]) { agent[1], tap[1] }, 2, reply,
                sizeof reply);
        assert_non_null(strstr(reply, "the snapshot has no NIC"));
        assert_int_equal(t.exits, 0);

        /* as before: with_tap absent or false */
        request(&t, "{\"op\":\"spawn\",\"ids\":[\"a\"],\"with_tap\":false}", &agent[1], 1, reply, sizeof reply);
        assert_non_null(strstr(reply, "\"ok\":true"));
        request(&t, "{\"op\":\"spawn\",\"ids\":[\"b\"]}", &agent[1], 1, reply, sizeof reply);
        assert_non_null(strstr(reply, "\"ok\":true"));
        wait_exits(&t, 2);
        close(agent[1]);
        close(tap[1]);
        assert_closed_everywhere(tap[0]);
        close(agent[0]);
        close(tap[0]);
        stop(&t);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_state_net),
                cmocka_unit_test(test_spawn_with_nic),
                cmocka_unit_test(test_spawn_without_nic),
        };

        /* the template's children log their failed restore; keep it short */
        return cmocka_run_group_tests(tests, NULL, NULL);
}
