/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* How many --jail-bind directories forkd-vmm takes. */
#define JAIL_BINDS_MAX 8

/* How many --jail-link directories: a snapshot chain (CHAIN_DEPTH_MAX links)
 * and the overlay and console directories. */
#define JAIL_LINKS_MAX 72

/* The descriptors of the --jail-link directories are moved up to here and
 * above, out of the way of the ones a VMM hands out and receives. */
#define JAIL_LINK_FD_MIN 900

/* The I/O port a guest writes to make a VMM started with
 * FORKD_VMM_TEST_HOOKS=1 call a syscall that no seccomp profile allows
 * (tests/daemon/test-confine.py). Without that variable the port is an empty
 * one like any other. */
#define JAIL_TEST_HOOK_PORT 0x5fe

struct jail {
        bool enabled;     /* --confine given */
        uid_t uid;
        gid_t gid;
        const char *binds[JAIL_BINDS_MAX]; /* bound read-write at the same path */
        unsigned n_binds;
        const char *links[JAIL_LINKS_MAX]; /* reached at the same path through a descriptor */
        unsigned n_links;
        bool test_hooks;  /* FORKD_VMM_TEST_HOOKS=1 */
        bool template;    /* "template": its filter lets a child switch to its own user (jail_enter_user()) */
        bool dropped;     /* this process already runs as the VMM's user, without capabilities */
        bool filtered;    /* ... under the VMM's seccomp filter (a template's child: inherited) */
        bool confined;    /* jail_confine_vmm() is done */
        bool sealed;      /* jail_seal_identity() is done (inherited by a fork, as the filter is) */
};

/* The one configuration of this process (main.c fills it from argv). A fork
 * inherits it, "confined" included. */
extern struct jail jail;

/* While still root: a private mount namespace whose root is an empty,
 * read-only tmpfs holding only a /proc of our own, the --jail-bind
 * directories at their own paths, and at the path of each --jail-link
 * directory a symbolic link to /proc/self/fd/N, N a descriptor of that
 * directory opened here and kept open (inherited by every fork); pivot_root
 * into it; and a new, empty network namespace. Files opened before
 * (/dev/kvm...) stay usable. */
int jail_enter(void);

/* Every confined process, the template included, before it reads the
 * snapshot: the VMM's user and group, no supplementary groups, no
 * capabilities in any set, an empty bounding set, no_new_privs. A no-op in a
 * process that did it already (a fork of one). */
int jail_drop_privileges(void);

/* The VMM's seccomp allow-list; anything else kills the process. The template
 * loads it for itself and its children; a no-op once loaded (jail.filtered). */
int jail_apply_seccomp(void);

/* A template's child, confined, before it restores anything: enters the
 * user namespace forkd made for it (userns_fd), which maps its uid and gid 0
 * to the sandbox's own id and its gid 1 to the template's group, owned by the
 * template's uid; becomes 0:0 there, with group 1 as its one supplementary
 * group; then drops the capabilities that entering gave it, every set
 * (bounding and ambient included) emptied. So it runs under an id of its own
 * without the template holding any capability: the owner of a user namespace
 * has them all in it, and nothing more. The parent-death signal is set again. */
int jail_enter_user(int userns_fd);

/* A template's child, confined, right after jail_enter_user() (or in its
 * place): a second filter that kills the process on any call that changes
 * its identity or filter (setns, set*id, setgroups, capset, seccomp, unshare,
 * prctl on capability sets), which the template's own filter allows for the
 * switch. A no-op anywhere else. */
int jail_seal_identity(void);

/* Everything a process that runs a guest does before its first KVM_RUN:
 * jail_drop_privileges() and jail_apply_seccomp(), each a no-op if done (a
 * template's child). Sets jail.confined. No-op when not enabled. */
int jail_confine_vmm(void);

/* Called by the run loop on a guest's write to JAIL_TEST_HOOK_PORT. */
enum {
        JAIL_TEST_FORBIDDEN = 1,        /* a syscall in no allow-list */
        JAIL_TEST_SETRESUID = 2,        /* setresuid(), which no confined process may call */
        JAIL_TEST_PRCTL = 3,            /* a prctl() option beyond the allow-list's */
};
void jail_test_hook(uint8_t what);
