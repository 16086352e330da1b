/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd doctor: the report (text or JSON), the option parser of "forkd doctor"
 * and the order of the checks. The checks themselves live in doctor-checks.c
 * (devices, kernel, file systems), doctor-net.c (netns and veth) and
 * doctor-bus.c (polkit, the bus policy, the token file).
 */
#include <getopt.h>
#include <json-c/json.h>
#include <stdarg.h>

#include "doctor.h"
#include "macro.h"

#ifndef FORKD_PREFIX
#define FORKD_PREFIX "/usr"
#endif

typedef void (*doctor_check_t)(const DoctorOptions *o, DoctorCheck *c);

static const struct {
        const char *name;
        doctor_check_t run;
} checks[] = {
        { "kvm", doctor_check_kvm },
        { "tun", doctor_check_tun },
        { "netns", doctor_check_netns },
        { "cgroup", doctor_check_cgroup },
        { "userfaultfd", doctor_check_userfaultfd },
        { "reflink", doctor_check_reflink },
        { "vmm", doctor_check_vmm },
        { "polkit-action", doctor_check_polkit_action },
        { "polkit-rules", doctor_check_polkit_rules },
        { "bus-policy", doctor_check_bus_policy },
        { "polkitd", doctor_check_polkitd },
        { "token", doctor_check_token },
};

static const char *const status_names[_DOCTOR_STATUS_MAX] = {
        [DOCTOR_OK] = "ok",
        [DOCTOR_WARN] = "warn",
        [DOCTOR_FAIL] = "fail",
        [DOCTOR_SKIP] = "skip",
};

const char *doctor_status_to_string(DoctorStatus s) {
        return s >= 0 && s < _DOCTOR_STATUS_MAX ? status_names[s] : "?";
}

void doctor_set(DoctorCheck *c, DoctorStatus status, const char *fix, const char *detail_fmt, ...) {
        va_list ap;

        free(c->detail);
        free(c->fix);
        c->status = status;
        va_start(ap, detail_fmt);
        if (vasprintf(&c->detail, detail_fmt, ap) < 0)
                c->detail = NULL;
        va_end(ap);
        c->fix = fix ? strdup(fix) : NULL;
}

static void check_done(DoctorCheck *c) {
        free(c->detail);
        free(c->fix);
        c->detail = c->fix = NULL;
}

static int print_json(const DoctorOptions *o, DoctorCheck *results, size_t n, DoctorStatus overall, FILE *out) {
        json_object *root = json_object_new_object(), *arr = json_object_new_array();
        int r = -ENOMEM;

        if (!root || !arr)
                goto finish;
        for (size_t i = 0; i < n; i++) {
                json_object *c = json_object_new_object();
                if (!c || json_object_array_add(arr, c) < 0) {
                        json_object_put(c);
                        goto finish;
                }
                if (json_object_object_add(c, "name", json_object_new_string(results[i].name)) < 0 ||
                    json_object_object_add(c, "status", json_object_new_string(doctor_status_to_string(results[i].status))) < 0 ||
                    json_object_object_add(c, "detail", json_object_new_string(results[i].detail ?: "")) < 0 ||
                    json_object_object_add(c, "fix", results[i].fix ? json_object_new_string(results[i].fix) : NULL) < 0)
                        goto finish;
        }
        if (json_object_object_add(root, "status", json_object_new_string(doctor_status_to_string(overall))) < 0 ||
            json_object_object_add(root, "state_dir", json_object_new_string(o->state_dir)) < 0 ||
            json_object_object_add(root, "checks", arr) < 0)
                goto finish;
        arr = NULL;
        fprintf(out, "%s\n", json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
        r = 0;
finish:
        json_object_put(arr);
        json_object_put(root);
        return r;
}

static void print_text(DoctorCheck *results, size_t n, DoctorStatus overall, FILE *out) {
        unsigned counts[_DOCTOR_STATUS_MAX] = {};

        for (size_t i = 0; i < n; i++) {
                fprintf(out, "%-4s  %-13s %s\n", doctor_status_to_string(results[i].status), results[i].name,
                        results[i].detail ?: "");
                if (results[i].fix)
                        fprintf(out, "      %-13s fix: %s\n", "", results[i].fix);
                counts[results[i].status]++;
        }
        fprintf(out, "%s: %u ok, %u warn, %u fail, %u skip\n", doctor_status_to_string(overall), counts[DOCTOR_OK],
                counts[DOCTOR_WARN], counts[DOCTOR_FAIL], counts[DOCTOR_SKIP]);
}

int doctor_run(const DoctorOptions *o, FILE *out) {
        DoctorCheck results[ELEMENTSOF(checks)] = {};
        DoctorStatus overall = DOCTOR_OK;
        int r = 0;

        for (size_t i = 0; i < ELEMENTSOF(checks); i++) {
                results[i].name = checks[i].name;
                checks[i].run(o, &results[i]);
                if (!results[i].detail) {
                        /* vasprintf() ran out of memory: say so rather than print nothing. */
                        r = -ENOMEM;
                        goto finish;
                }
                if (results[i].status == DOCTOR_FAIL)
                        overall = DOCTOR_FAIL;
                else if (results[i].status == DOCTOR_WARN && overall == DOCTOR_OK)
                        overall = DOCTOR_WARN;
        }
        if (o->json)
                r = print_json(o, results, ELEMENTSOF(checks), overall, out);
        else
                print_text(results, ELEMENTSOF(checks), overall, out);
        if (r >= 0)
                r = overall == DOCTOR_FAIL ? 1 : 0;
finish:
        for (size_t i = 0; i < ELEMENTSOF(checks); i++)
                check_done(&results[i]);
        return r;
}

void doctor_help(const char *program) {
        printf("%s doctor [OPTIONS]\n"
               "\n"
               "Check what this host can do for forkd, one line per check with ok, warn,\n"
               "fail or skip, and a fix under anything that is not ok:\n"
               "  kvm            /dev/kvm opens, answers API 12, creates a VM; hardware\n"
               "                 (VMX/SVM) or PVM (warn: the test guest runs, Linux does not)\n"
               "  tun            /dev/net/tun opens\n"
               "  netns          a network namespace with a veth pair in it (rtnetlink), made\n"
               "                 and thrown away in a child process (root only, else skip)\n"
               "  cgroup         the memory backend for --memory-limit-mib: systemd scopes,\n"
               "                 cgroupfs v2 or v1, or none\n"
               "  userfaultfd    userfaultfd with write-protect, on memfd memory\n"
               "  reflink        FICLONE between two temporary files in the state directory\n"
               "  vmm            the forkd-vmm binary is there and executable\n"
               "  polkit-action  the polkit actions org.forkd.* are installed\n"
               "  polkit-rules   the polkit rules for the group forkd are installed\n"
               "  bus-policy     the D-Bus policy org.forkd.Manager.conf is installed\n"
               "  polkitd        polkitd answers on the system bus and knows org.forkd.*\n"
               "  token          forkd-rest's token file (" DOCTOR_TOKEN_FILE ") exists and is\n"
               "                 not readable by everyone\n"
               "Nothing on the host is changed; every check has a time limit.\n"
               "\n"
               "Options:\n"
               "  -h --help            Show this help\n"
               "  -j --json            Print one JSON object on one line: {\"status\",\n"
               "                       \"state_dir\", \"checks\": [{\"name\", \"status\", \"detail\",\n"
               "                       \"fix\"}]}\n"
               "     --state-dir DIR   The state directory to check (default " DOCTOR_STATE_DIR_DEFAULT ")\n"
               "     --prefix DIR      Where forkd was installed: look for its polkit and bus\n"
               "                       files under DIR too (besides /usr, /etc and the build's\n"
               "                       prefix %s), and for DIR/libexec/forkd/forkd-vmm\n"
               "                       (unless $FORKD_VMM is set)\n"
               "     --token-file FILE The token file to check (default " DOCTOR_TOKEN_FILE ",\n"
               "                       which forkd-rest.service loads)\n"
               "\n"
               "Exit status: 0 when no check failed, 1 when one did, 2 on a usage error.\n",
               program, FORKD_PREFIX);
}

int doctor_main(const char *program, int argc, char *argv[]) {
        enum { ARG_STATE_DIR = 0x100, ARG_PREFIX, ARG_TOKEN_FILE };
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "json", no_argument, NULL, 'j' },
                { "state-dir", required_argument, NULL, ARG_STATE_DIR },
                { "prefix", required_argument, NULL, ARG_PREFIX },
                { "token-file", required_argument, NULL, ARG_TOKEN_FILE },
                {},
        };
        DoctorOptions o = { .state_dir = DOCTOR_STATE_DIR_DEFAULT };
        int c, r;

        opterr = 0;
        optind = 1; /* argv[0] is "doctor" */
        while ((c = getopt_long(argc, argv, ":hj", options, NULL)) >= 0)
                switch (c) {
                case 'h':
                        doctor_help(program);
                        return 0;
                case 'j':
                        o.json = true;
                        break;
                case ARG_STATE_DIR:
                        if (optarg[0] != '/' || strlen(optarg) > 1024) {
                                fprintf(stderr, "%s doctor: --state-dir needs an absolute path of at most 1024 bytes.\n", program);
                                return 2;
                        }
                        o.state_dir = optarg;
                        break;
                case ARG_PREFIX:
                        if (optarg[0] != '/' || strlen(optarg) > 1024) {
                                fprintf(stderr, "%s doctor: --prefix needs an absolute path of at most 1024 bytes.\n", program);
                                return 2;
                        }
                        o.prefix = optarg;
                        break;
                case ARG_TOKEN_FILE:
                        if (!*optarg) {
                                fprintf(stderr, "%s doctor: --token-file needs a path.\n", program);
                                return 2;
                        }
                        o.token_file = optarg;
                        break;
                case ':':
                        fprintf(stderr, "%s doctor: option '%s' wants a value.\nTry '%s doctor --help'.\n", program,
                                argv[optind - 1], program);
                        return 2;
                default:
                        if (optopt)
                                fprintf(stderr, "%s doctor: unknown option '-%c'.\n", program, optopt);
                        else
                                fprintf(stderr, "%s doctor: unknown option '%s'.\n", program, argv[optind - 1]);
                        fprintf(stderr, "Try '%s doctor --help'.\n", program);
                        return 2;
                }
        if (optind < argc) {
                fprintf(stderr, "%s doctor: takes no arguments, not '%s'.\nTry '%s doctor --help'.\n", program,
                        argv[optind], program);
                return 2;
        }

        r = doctor_run(&o, stdout);
        if (fflush(stdout) != 0 && r >= 0)
                r = -errno;
        if (r < 0) {
                fprintf(stderr, "%s doctor: cannot write the report: %s\n", program, strerror(-r));
                return 1;
        }
        return r;
}
