/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * forkd doctor / forkctl doctor: what this host can do for forkd. Each check
 * says ok, warn, fail or skip, with a detail line and, for anything not ok, a
 * fix. Checks are bounded in time and leave nothing behind: what they create
 * (a VM, a network namespace with a veth pair, temporary files) is thrown away.
 */

#include <stdbool.h>
#include <stdio.h>

typedef enum DoctorStatus {
        DOCTOR_OK,
        DOCTOR_WARN,
        DOCTOR_FAIL,
        DOCTOR_SKIP,
        _DOCTOR_STATUS_MAX,
} DoctorStatus;

typedef struct DoctorCheck {
        const char *name;   /* static: "kvm", "tun", ... */
        DoctorStatus status;
        char *detail;
        char *fix;          /* NULL when there is nothing to do */
} DoctorCheck;

typedef struct DoctorOptions {
        const char *state_dir;    /* default /var/lib/forkd */
        const char *prefix;       /* where forkd was installed, besides /usr; NULL: the build's prefix */
        const char *bus_address;  /* NULL: the system bus ($DBUS_SYSTEM_BUS_ADDRESS) */
        const char *vmm;          /* NULL: $FORKD_VMM, else the installed forkd-vmm */
        const char *token_file;   /* NULL: DOCTOR_TOKEN_FILE, what forkd-rest.service loads */
        bool json;
} DoctorOptions;

#define DOCTOR_STATE_DIR_DEFAULT "/var/lib/forkd"
#define DOCTOR_TOKEN_FILE "/etc/forkd/token"

const char *doctor_status_to_string(DoctorStatus s);

/* Record a result; detail and fix are printf formats (fix may be NULL). */
void doctor_set(DoctorCheck *c, DoctorStatus status, const char *fix, const char *detail_fmt, ...)
        __attribute__((format(printf, 4, 5)));

/* The checks (doctor-checks.c, doctor-net.c, doctor-bus.c). Each fills c. */
void doctor_check_kvm(const DoctorOptions *o, DoctorCheck *c);
void doctor_check_tun(const DoctorOptions *o, DoctorCheck *c);
void doctor_check_netns(const DoctorOptions *o, DoctorCheck *c);
void doctor_check_cgroup(const DoctorOptions *o, DoctorCheck *c);
void doctor_check_userfaultfd(const DoctorOptions *o, DoctorCheck *c);
void doctor_check_reflink(const DoctorOptions *o, DoctorCheck *c);
void doctor_check_vmm(const DoctorOptions *o, DoctorCheck *c);
void doctor_check_polkit_action(const DoctorOptions *o, DoctorCheck *c);
void doctor_check_polkit_rules(const DoctorOptions *o, DoctorCheck *c);
void doctor_check_bus_policy(const DoctorOptions *o, DoctorCheck *c);
void doctor_check_polkitd(const DoctorOptions *o, DoctorCheck *c);
void doctor_check_token(const DoctorOptions *o, DoctorCheck *c);

/* Run every check and print the report on out: one line per check (and an
 * indented "fix:" line under any that is not ok) and a summary, or with
 * o->json one JSON object on one line. Returns 0 when no check failed, 1 when
 * one did, < 0 when the report could not be produced. */
int doctor_run(const DoctorOptions *o, FILE *out);

/* "forkd doctor [OPTIONS]": argv[0] is "doctor". Parses the options, runs,
 * returns the exit status: 0, 1 (a check failed) or 2 (usage error). */
int doctor_main(const char *program, int argc, char *argv[]);
void doctor_help(const char *program);
