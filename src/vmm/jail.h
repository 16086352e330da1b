/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* How many --jail-bind directories forkd-vmm takes. */
#define JAIL_BINDS_MAX 8

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
        bool test_hooks;  /* FORKD_VMM_TEST_HOOKS=1 */
        bool bounding_empty; /* the template emptied the bounding set; its children inherit that */
        bool dropped;     /* this process already runs as the VMM's user, without capabilities */
        bool confined;    /* ... and under the VMM's seccomp filter */
};

/* The one configuration of this process (main.c fills it from argv). A fork
 * inherits it, "confined" included. */
extern struct jail jail;

/* While still root: a private mount namespace whose root is an empty,
 * read-only tmpfs holding only a /proc of our own and the --jail-bind
 * directories at their own paths; pivot_root into it; and a new, empty
 * network namespace. Files opened before (/dev/kvm...) stay usable. */
int jail_enter(void);

/* The template: keeps uid 0 but only the capabilities its children need
 * before they drop everything (see jail.c), with no_new_privs. */
int jail_restrict_template(void);

/* A process that runs a guest: the VMM's user and group, no supplementary
 * groups, no capabilities in any set, an empty bounding set, no_new_privs.
 * A no-op in a process that is already confined (a fork of one). */
int jail_drop_privileges(void);

/* The seccomp allow-lists; anything else kills the process. */
enum jail_profile {
        JAIL_PROFILE_TEMPLATE, /* forkd-vmm template: forks and confines children */
        JAIL_PROFILE_VMM,      /* a process that runs a guest, and what it forks */
};
int jail_apply_seccomp(enum jail_profile profile);

/* The template, before its own filter: builds once the small filter that each
 * child stacks on the inherited template filter in jail_confine_vmm(), so that
 * together they allow exactly the VMM profile (jail.c). */
int jail_prepare_vmm_filter(void);

/* Everything a child does before its first KVM_RUN: jail_drop_privileges()
 * and the VMM profile. Sets jail.confined. No-op when not enabled. */
int jail_confine_vmm(void);

/* Called by the run loop on a guest's write to JAIL_TEST_HOOK_PORT. */
enum {
        JAIL_TEST_FORBIDDEN = 1,        /* a syscall in no allow-list */
        JAIL_TEST_TEMPLATE_SYSCALL = 2, /* one only the template's list has */
        JAIL_TEST_TEMPLATE_PRCTL = 3,   /* a prctl() option only the template's list has */
};
void jail_test_hook(uint8_t what);
