/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * forkd-agent: PID 1 of a forkd Linux guest. Mounts what the guest needs,
 * reaps orphans, and serves the agent protocol on the virtio-console port.
 * Outside a VM (not PID 1) it does none of the PID 1 work and serves a unix
 * socket or an inherited fd, which is how it is tested.
 */

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "agent-init.h"
#include "agent-net.h"
#include "agent-python.h"
#include "agent-tcp.h"
#include "agent.h"
#include "macro.h"

#define MODPROBE_MAX 32

static const char *arg_channel = "/dev/hvc0";
static int arg_clock = -1; /* -1: when PID 1 */
static bool arg_python = true;
static char *arg_modules[MODPROBE_MAX];
static unsigned arg_n_modules;
static const char *arg_tcp; /* forkd's JSON-line protocol: off unless given */
static const char *arg_image_config = IMAGE_CONFIG_PATH;

static void help(void) {
        printf("forkd-agent [OPTIONS...]\n\n"
               "The guest agent of forkd: PID 1 of a Linux guest, serving the agent protocol.\n\n"
               "  -h --help              Show this help\n"
               "     --version           Show the version\n"
               "     --channel=SPEC      The channel: a tty path (default /dev/hvc0),\n"
               "                         unix:PATH (listen there) or fd:N (inherited, connected)\n"
               "     --clock / --no-clock\n"
               "                         Set the wall clock from identity events (default: when PID 1)\n"
               "     --no-python         Do not start the embedded interpreter\n"
               "     --modprobe=MODULE   Load a kernel module first (PID 1 only; repeatable)\n"
               "     --tcp=[ADDR:]PORT | fd:N\n"
               "                         Also serve forkd's JSON-line protocol on TCP (no\n"
               "                         authentication; as PID 1 also forkd.agent_tcp=1 on the\n"
               "                         kernel command line, for 0.0.0.0:8888)\n"
               "     --image-config=PATH The image's defaults (default " IMAGE_CONFIG_PATH ";\n"
               "                         a missing file gives none)\n"
               "     --log-level=LEVEL   err, warning, info or debug (default: warning)\n");
}

static int parse_argv(int argc, char *argv[]) {
        enum {
                ARG_VERSION = 0x100,
                ARG_CHANNEL,
                ARG_CLOCK,
                ARG_NO_CLOCK,
                ARG_NO_PYTHON,
                ARG_MODPROBE,
                ARG_LOG_LEVEL,
                ARG_TCP,
                ARG_IMAGE_CONFIG,
        };
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, ARG_VERSION },
                { "channel", required_argument, NULL, ARG_CHANNEL },
                { "clock", no_argument, NULL, ARG_CLOCK },
                { "no-clock", no_argument, NULL, ARG_NO_CLOCK },
                { "no-python", no_argument, NULL, ARG_NO_PYTHON },
                { "modprobe", required_argument, NULL, ARG_MODPROBE },
                { "log-level", required_argument, NULL, ARG_LOG_LEVEL },
                { "tcp", required_argument, NULL, ARG_TCP },
                { "image-config", required_argument, NULL, ARG_IMAGE_CONFIG },
                {}
        };
        int c;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
                switch (c) {
                case 'h':
                        help();
                        return 0;
                case ARG_VERSION:
                        printf("forkd-agent %s\n", AGENT_VERSION);
                        return 0;
                case ARG_CHANNEL:
                        arg_channel = optarg;
                        break;
                case ARG_CLOCK:
                        arg_clock = 1;
                        break;
                case ARG_NO_CLOCK:
                        arg_clock = 0;
                        break;
                case ARG_NO_PYTHON:
                        arg_python = false;
                        break;
                case ARG_MODPROBE:
                        if (arg_n_modules >= MODPROBE_MAX)
                                return log_error_errno(E2BIG, "Too many --modprobe= (at most %d).", MODPROBE_MAX);
                        arg_modules[arg_n_modules++] = optarg;
                        break;
                case ARG_LOG_LEVEL:
                        if (streq(optarg, "err"))
                                log_max_level = LOG_LVL_ERR;
                        else if (streq(optarg, "warning"))
                                log_max_level = LOG_LVL_WARNING;
                        else if (streq(optarg, "info"))
                                log_max_level = LOG_LVL_INFO;
                        else if (streq(optarg, "debug"))
                                log_max_level = LOG_LVL_DEBUG;
                        else
                                return log_error_errno(EINVAL, "Unknown log level: %s", optarg);
                        break;
                case ARG_TCP:
                        arg_tcp = optarg;
                        break;
                case ARG_IMAGE_CONFIG:
                        arg_image_config = optarg;
                        break;
                case '?':
                        return -EINVAL;
                default:
                        return -EINVAL;
                }
        if (optind < argc)
                return log_error_errno(EINVAL, "Unexpected argument: %s", argv[optind]);
        return 1;
}

/* forkd's switch: forkd.agent_tcp=1 on the kernel command line (PID 1 only:
 * outside a guest the command line is the host's). */
static void pid1_tcp_switch(void) {
        _cleanup_free_ char *cmdline = NULL;
        static char spec[16];
        int r;

        if (arg_tcp)
                return;
        r = proc_cmdline_read(&cmdline);
        if (r < 0)
                return (void) log_warning_errno(r, "Failed to read /proc/cmdline: %m");
        r = cmdline_get_bool(cmdline, "forkd.agent_tcp");
        if (r == -EINVAL)
                log_warning("forkd.agent_tcp= takes 0 or 1; leaving TCP off.");
        if (r <= 0)
                return;
        (void) snprintf(spec, sizeof spec, "%u", AGENT_TCP_PORT);
        arg_tcp = spec;
}

/* PID 1 must never exit: the kernel panics. Log and keep reaping. */
static _Noreturn void pid1_hang(void) {
        log_error("forkd-agent cannot serve; staying up to reap orphans.");
        for (;;) {
                while (waitpid(-1, NULL, 0) > 0)
                        ;
                (void) poll(NULL, 0, 1000);
        }
}

int main(int argc, char *argv[]) {
        _cleanup_(agent_freep) Agent *a = NULL;
        AgentConfig config = {};
        int r;

        log_prefix = "forkd-agent";
        log_max_level = LOG_LVL_WARNING;
        config.pid1 = getpid() == 1;

        if (config.pid1)
                pid1_setup(); /* before anything else: /dev, /proc */
        else
                /* so that the tests see orphans reaped as the guest would */
                (void) prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);

        r = parse_argv(argc, argv);
        if (r <= 0) {
                if (config.pid1) {
                        log_error("Bad command line; using defaults.");
                        arg_channel = "/dev/hvc0";
                } else
                        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
        }

        config.channel = arg_channel;
        config.set_clock = arg_clock < 0 ? config.pid1 : arg_clock > 0;
        config.python = arg_python;

        r = agent_new(&config, &a);
        if (r < 0) {
                log_error_errno(r, "Failed to set up the agent (channel '%s'): %m", arg_channel);
                if (config.pid1)
                        pid1_hang();
                return EXIT_FAILURE;
        }

        r = signals_setup(a->sigchld_pipe[1], config.pid1);
        if (r < 0)
                log_error_errno(r, "Failed to set up signal handlers: %m");

        if (config.pid1) {
                pid1_modprobe(arg_modules, arg_n_modules);
                /* the NIC, before the channel opens (and says ready); never fatal */
                agent_net_setup();
                pid1_tcp_switch();
        }

        if (arg_tcp) {
                /* not fatal either: the channel is what forkd itself needs */
                r = agent_tcp_listen(a, arg_tcp);
                if (r < 0)
                        log_error_errno(r, "Failed to serve the JSON-line protocol on '%s': %m", arg_tcp);
        }

        /* image.json: the defaults of exec and of Python, and the image's service; never fatal */
        (void) agent_defaults_load(a, arg_image_config);
        agent_python_set_defaults(&a->defaults);

        if (config.python)
                (void) agent_python_init(); /* logs; eval and run_code answer errors without it */

        /* before ready, so that it runs in the snapshot */
        (void) agent_service_start(a);

        r = agent_open_channel(a);
        if (r < 0) {
                if (config.pid1)
                        pid1_hang();
                return EXIT_FAILURE;
        }

        log_debug("Serving %s.", arg_channel);
        r = agent_run(a);
        if (config.pid1) {
                log_error_errno(r, "The agent loop ended: %m");
                pid1_hang();
        }
        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
