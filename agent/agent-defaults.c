/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * /.forkd/image.json on the agent's side: the base environment, working
 * directory and user of exec and of the python3 child, and the image's own
 * service (entrypoint + cmd), started once at boot when start_cmd is true.
 */

#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent-spawn.h"
#include "agent.h"
#include "macro.h"
#include "strv.h"

extern char **environ;

void agent_defaults_done(AgentDefaults *d) {
        image_config_done(&d->image);
        d->env = strv_free(d->env);
        user_ids_done(&d->user);
        d->have_user = false;
}

int agent_defaults_load(Agent *a, const char *path) {
        AgentDefaults *d = &a->defaults;
        const char *why = NULL;
        char *fallback[3] = {};
        _cleanup_free_ char *home = NULL;
        int r;

        r = image_config_load(path, &d->image, &why);
        if (r == -ENOENT)
                return 0;
        if (r < 0) {
                log_error("Ignoring %s: %s", path, why ?: strerror(-r));
                return r;
        }

        if (d->image.user) {
                r = user_resolve("/", d->image.user, &d->user);
                if (r < 0)
                        log_error_errno(r, "Failed to resolve the image's user '%s', running as root: %m", d->image.user);
                else
                        d->have_user = true;
        }

        /* the image's environment, with a PATH and a HOME where it names none, as container engines do */
        if (d->image.env) {
                size_t n = 0;

                if (!env_get(d->image.env, "PATH"))
                        fallback[n++] = (char *) "PATH=" DEFAULT_PATH;
                if (!env_get(d->image.env, "HOME")) {
                        if (asprintf(&home, "HOME=%s", d->have_user && d->user.home && d->user.home[0] ?
                                                      d->user.home : "/root") < 0)
                                return log_oom(), -ENOMEM;
                        fallback[n++] = home;
                }
                d->env = env_merge(fallback, d->image.env);
                if (!d->env)
                        return log_oom(), -ENOMEM;
        }
        return 0;
}

int agent_service_start(Agent *a) {
        AgentDefaults *d = &a->defaults;
        _cleanup_strv_free_ char **argv = NULL;
        _cleanup_free_ char *exe = NULL;
        size_t ne, nc;
        pid_t pid;
        int r;

        if (!d->image.start_cmd)
                return 0;
        ne = strv_length(d->image.entrypoint);
        nc = strv_length(d->image.cmd);
        if (ne + nc == 0) {
                log_error("image.json asks to start the image's command, but names none.");
                return -EINVAL;
        }
        argv = calloc(ne + nc + 1, sizeof *argv);
        if (!argv)
                return log_oom(), -ENOMEM;
        for (size_t i = 0; i < ne + nc; i++) {
                argv[i] = strdup(i < ne ? d->image.entrypoint[i] : d->image.cmd[i - ne]);
                if (!argv[i])
                        return log_oom(), -ENOMEM;
        }

        r = find_in_path(argv[0], env_get(d->env ?: environ, "PATH"), &exe);
        if (r < 0)
                return log_error_errno(r, "The image's command %s is not found: %m", argv[0]), r;

        SpawnParams p = SPAWN_PARAMS_INIT;
        p.path = exe;
        p.argv = argv;
        p.envp = d->env ?: environ;
        p.cwd = d->image.working_dir;
        p.user = d->have_user ? &d->user : NULL;
        p.new_session = true;
        r = agent_spawn(&p, &pid);
        if (r < 0)
                return log_error_errno(r, "Failed to start the image's command %s: %m", argv[0]), r;
        d->service_pid = pid;
        log_info("Started the image's command %s as pid %d.", argv[0], (int) pid);
        return 0;
}

bool agent_service_reaped(Agent *a, pid_t pid, int status) {
        if (a->defaults.service_pid <= 0 || pid != a->defaults.service_pid)
                return false;
        a->defaults.service_pid = 0;
        if (WIFSIGNALED(status))
                log_warning("The image's command (pid %d) was killed by signal %d.", (int) pid, WTERMSIG(status));
        else
                log_warning("The image's command (pid %d) exited with status %d.", (int) pid, WEXITSTATUS(status));
        return true;
}
