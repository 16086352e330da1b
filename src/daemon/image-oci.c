/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A snapshot of an OCI image: forkd-oci, a process of its own, reads the
 * caller's image (fd 3), checks every blob and member, and writes the root
 * disk with forkd-agent-portable in it; forkd keeps the image's config. */
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <json-c/json.h>

#include "image.h"
#include "io-util.h"
#include "json-util.h"
#include "macro.h"
#include "snapshot-meta.h"

#define OCI_REPLY_MAX (64u * 1024u)
#define OCI_ERROR_MAX 2048u

/* The last non-empty line of forkd-oci's stderr (its one-line reason). */
static void last_line(char *buf) {
        size_t n = strlen(buf);
        char *nl;

        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
                buf[--n] = 0;
        nl = strrchr(buf, '\n');
        if (nl)
                memmove(buf, nl + 1, strlen(nl + 1) + 1);
        for (char *p = buf; *p; p++)
                if ((unsigned char) *p < ' ')
                        *p = ' ';
}

static int spawn_oci(ImageCreate *c, const char *rootfs, int out_fd, int err_fd, pid_t *ret_pid) {
        const char *argv[20];
        unsigned n = 0;
        pid_t parent = getpid(), pid;

        argv[n++] = c->oci_path;
        argv[n++] = "build";
        if (c->image_ref) {
                argv[n++] = "--ref";
                argv[n++] = c->image_ref;
                argv[n++] = "--registry-config";
                argv[n++] = c->registry_config;
        } else {
                argv[n++] = "--image-fd";
                argv[n++] = "3";
        }
        argv[n++] = "--agent";
        argv[n++] = c->image_agent;
        argv[n++] = "--out";
        argv[n++] = rootfs;
        if (c->oci_cache) {
                argv[n++] = "--cache";
                argv[n++] = c->oci_cache;
        }
        if (c->start_cmd)
                argv[n++] = "--start-cmd";
        argv[n] = NULL;

        /* fork, not posix_spawn: it must die with forkd (PR_SET_PDEATHSIG). */
        pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                sigset_t none;

                (void) prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (getppid() != parent)
                        _exit(127);
                sigemptyset(&none);
                (void) sigprocmask(SIG_SETMASK, &none, NULL);
                if (dup2(out_fd, STDOUT_FILENO) < 0 || dup2(err_fd, STDERR_FILENO) < 0 ||
                    (c->image_fd >= 0 && dup2(c->image_fd, 3) < 0))
                        _exit(127);
                for (int fd = 4; fd < 1024; fd++)
                        close(fd);
                execv(argv[0], (char *const *) argv);
                _exit(127);
        }
        *ret_pid = pid;
        return 0;
}

/* What forkd-oci wrote to fd (a file in the staging directory), NUL-terminated;
 * past max it is cut there. */
static int read_back(int fd, size_t max, char **ret) {
        char *buf = malloc(max + 1);
        ssize_t n;

        if (!buf)
                return -ENOMEM;
        if (lseek(fd, 0, SEEK_SET) < 0 || (n = loop_read(fd, buf, max)) < 0) {
                int r = errno > 0 ? -errno : -EIO;
                free(buf);
                return r;
        }
        buf[n] = 0;
        *ret = buf;
        return 0;
}

int image_oci_build(ImageCreate *c, const char *rootfs) {
        _cleanup_free_ char *out = NULL, *err = NULL;
        _cleanup_close_ int out_fd = -EBADF, err_fd = -EBADF;
        _cleanup_json_ struct json_object *o = NULL;
        struct json_object *config = NULL;
        const char *why = NULL;
        char *buf;
        int status = 0, r;
        pid_t pid = 0;

        out_fd = open(c->staging, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        err_fd = open(c->staging, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (out_fd < 0 || err_fd < 0)
                return image_create_set_error(c, -errno, "Cannot make the image build's output files in %s: %s",
                                              c->staging, strerror(errno));
        r = spawn_oci(c, rootfs, out_fd, err_fd, &pid);
        if (r < 0)
                return image_create_set_error(c, r, "Cannot start %s: %s", c->oci_path, strerror(-r));
        /* The caller's image is forkd-oci's alone now. */
        c->image_fd = safe_close(c->image_fd);
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return image_create_set_error(c, -errno, "Cannot wait for %s: %s", c->oci_path,
                                                      strerror(errno));

        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                if (read_back(err_fd, OCI_ERROR_MAX, &err) >= 0)
                        last_line(err);
                (void) unlink(rootfs);
                if (WIFEXITED(status) && WEXITSTATUS(status) == 2) {
                        /* The image itself is refused: the caller's mistake, InvalidArgs. */
                        c->error_invalid_args = true;
                        return image_create_set_error(c, -EINVAL, "The image is refused: %s",
                                                      err && err[0] ? err : "forkd-oci gave no reason");
                }
                if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
                        return image_create_set_error(c, -ENOEXEC, "Cannot run %s (set $FORKD_OCI)", c->oci_path);
                return image_create_set_error(c, -EIO, "The image's root disk could not be written: %s",
                                              err && err[0] ? err : "forkd-oci failed");
        }

        r = read_back(out_fd, OCI_REPLY_MAX, &out);
        if (r >= 0)
                r = json_parse_strict(out, strlen(out), OCI_REPLY_MAX, 8, &o, &why);
        if (r >= 0 && !json_object_object_get_ex(o, "config", &config))
                r = -EBADMSG;
        if (r < 0) {
                (void) unlink(rootfs);
                return image_create_set_error(c, r, "%s answered no valid JSON with a \"config\": %s", c->oci_path,
                                              why ?: strerror(-r));
        }
        buf = malloc(SNAPSHOT_IMAGE_CONFIG_MAX);
        if (!buf)
                return -ENOMEM;
        r = snapshot_image_config_normalize(config, buf, SNAPSHOT_IMAGE_CONFIG_MAX, &why);
        if (r < 0) {
                free(buf);
                (void) unlink(rootfs);
                c->error_invalid_args = true;
                return image_create_set_error(c, r, "The image's config is refused: %s", why ?: strerror(-r));
        }
        free(c->image_config);
        c->image_config = buf;
        return 0;
}
