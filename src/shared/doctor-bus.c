/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd doctor: authorization (the polkit actions and rules, the system bus
 * policy, polkitd itself) and forkd-rest's token file.
 */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <systemd/sd-bus.h>
#include <time.h>

#include "bus-open.h"
#include "doctor.h"
#include "macro.h"
#include "time-util.h"

#ifndef FORKD_PREFIX
#define FORKD_PREFIX "/usr"
#endif

#define POLKITD_TIMEOUT_USEC (3 * 1000000ull)
#define POLICY_FILE_MAX (256 * 1024)

/* Where polkitd and dbus-daemon read their files: the only places where an
 * installed file counts. The others are looked at to say "installed where it is
 * not read". */
static const char *const polkit_action_dirs_read[] = { "/usr/share/polkit-1/actions", NULL };
static const char *const polkit_rules_dirs_read[] = { "/etc/polkit-1/rules.d", "/usr/share/polkit-1/rules.d", NULL };
static const char *const dbus_policy_dirs_read[] = { "/usr/share/dbus-1/system.d", "/etc/dbus-1/system.d", NULL };

/* Read a small text file whole; -EFBIG past max. */
static int read_text(const char *path, size_t max, char **ret) {
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *buf = NULL;
        size_t n = 0;
        ssize_t k;

        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                return -errno;
        buf = malloc(max + 1);
        if (!buf)
                return -ENOMEM;
        while ((k = read(fd, buf + n, max + 1 - n)) > 0) {
                n += (size_t) k;
                if (n > max)
                        return -EFBIG;
        }
        if (k < 0)
                return -errno;
        buf[n] = 0;
        *ret = TAKE_PTR(buf);
        return 0;
}

static unsigned count_substr(const char *s, const char *needle) {
        unsigned n = 0;

        for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
                n++;
        return n;
}

/* The first file in dir whose name matches: exactly name, or (name NULL) one that
 * contains "org.forkd" and ends in suffix. Returns 1 and the path, 0 if none. */
static int find_in_dir(const char *dir, const char *name, const char *suffix, char *ret, size_t size) {
        DIR *d;
        struct dirent *de;
        int r = 0;

        if (name) {
                snprintf(ret, size, "%s/%s", dir, name);
                return access(ret, F_OK) >= 0;
        }
        d = opendir(dir);
        if (!d)
                return 0;
        while ((de = readdir(d))) {
                size_t l = strlen(de->d_name), ls = strlen(suffix);
                if (strstr(de->d_name, "org.forkd") && l > ls && strcmp(de->d_name + l - ls, suffix) == 0) {
                        snprintf(ret, size, "%s/%s", dir, de->d_name);
                        r = 1;
                        break;
                }
        }
        closedir(d);
        return r;
}

/* Look in the directories that are read, then under --prefix and the build's
 * prefix. *ret_read: whether the file found is where the reader looks. */
static int find_installed(const DoctorOptions *o, const char *const *read_dirs, const char *subdir, const char *name,
                          const char *suffix, char *ret, size_t size, bool *ret_read) {
        const char *prefixes[] = { o->prefix, FORKD_PREFIX };
        char dir[1200];

        for (size_t i = 0; read_dirs[i]; i++)
                if (find_in_dir(read_dirs[i], name, suffix, ret, size) > 0) {
                        *ret_read = true;
                        return 1;
                }
        for (size_t i = 0; i < ELEMENTSOF(prefixes); i++) {
                if (!prefixes[i])
                        continue;
                snprintf(dir, sizeof(dir), "%s/%s", prefixes[i], subdir);
                if (find_in_dir(dir, name, suffix, ret, size) > 0) {
                        *ret_read = false;
                        return 1;
                }
        }
        return 0;
}

void doctor_check_polkit_action(const DoctorOptions *o, DoctorCheck *c) {
        _cleanup_free_ char *text = NULL;
        char path[1400];
        bool is_read = false;
        unsigned n;
        int r;

        if (!find_installed(o, polkit_action_dirs_read, "share/polkit-1/actions", "org.forkd.policy", NULL, path,
                            sizeof(path), &is_read))
                return doctor_set(c, DOCTOR_WARN,
                                  "install forkd (meson install puts polkit/org.forkd.policy in "
                                  "/usr/share/polkit-1/actions); until then polkit refuses every caller but root",
                                  "org.forkd.policy is not in /usr/share/polkit-1/actions%s%s", o->prefix ? " nor under " : "",
                                  o->prefix ?: "");
        r = read_text(path, POLICY_FILE_MAX, &text);
        if (r < 0) {
                if ((r == -EACCES || r == -EPERM) && geteuid() != 0)
                        return doctor_set(c, DOCTOR_SKIP, "run the doctor as root", "cannot read %s: %s", path,
                                          strerror(-r));
                return doctor_set(c, DOCTOR_WARN, "reinstall forkd", "cannot read %s: %s", path, strerror(-r));
        }
        n = count_substr(text, "<action id=\"org.forkd.");
        if (n == 0)
                return doctor_set(c, DOCTOR_WARN, "reinstall forkd (meson install)", "%s declares no org.forkd.* action",
                                  path);
        if (!is_read)
                return doctor_set(c, DOCTOR_WARN,
                                  "polkitd reads actions from /usr/share/polkit-1/actions only: reinstall with "
                                  "-Dpolkit_actiondir=/usr/share/polkit-1/actions, or copy the file there",
                                  "%s (%u org.forkd actions) is where polkitd does not look", path, n);
        doctor_set(c, DOCTOR_OK, NULL, "%s declares %u org.forkd actions", path, n);
}

void doctor_check_polkit_rules(const DoctorOptions *o, DoctorCheck *c) {
        char path[1400];
        bool is_read = false;

        if (!find_installed(o, polkit_rules_dirs_read, "share/polkit-1/rules.d", NULL, ".rules", path, sizeof(path),
                            &is_read))
                return doctor_set(c, DOCTOR_WARN,
                                  "install forkd (meson install puts polkit/org.forkd.rules as "
                                  "/usr/share/polkit-1/rules.d/50-org.forkd.rules); until then members of the group "
                                  "forkd and forkd-rest are asked to authenticate",
                                  "no org.forkd rules file in /etc/polkit-1/rules.d or /usr/share/polkit-1/rules.d");
        if (!is_read)
                return doctor_set(c, DOCTOR_WARN,
                                  "polkitd reads rules from /etc/polkit-1/rules.d and /usr/share/polkit-1/rules.d only: "
                                  "reinstall with -Dpolkit_rulesdir=/usr/share/polkit-1/rules.d, or copy the file there",
                                  "%s is where polkitd does not look", path);
        doctor_set(c, DOCTOR_OK, NULL, "%s", path);
}

void doctor_check_bus_policy(const DoctorOptions *o, DoctorCheck *c) {
        _cleanup_free_ char *text = NULL;
        char path[1400];
        bool is_read = false;
        int r;

        if (!find_installed(o, dbus_policy_dirs_read, "share/dbus-1/system.d", "org.forkd.Manager.conf", NULL, path,
                            sizeof(path), &is_read))
                return doctor_set(c, DOCTOR_FAIL,
                                  "install forkd (meson install puts dbus/org.forkd.Manager.conf in "
                                  "/usr/share/dbus-1/system.d), then reload the bus: systemctl reload dbus",
                                  "org.forkd.Manager.conf is in neither /usr/share/dbus-1/system.d nor "
                                  "/etc/dbus-1/system.d: forkd cannot own org.forkd.Manager on the system bus");
        r = read_text(path, POLICY_FILE_MAX, &text);
        if (r < 0)
                return doctor_set(c, DOCTOR_FAIL, "reinstall forkd", "cannot read %s: %s", path, strerror(-r));
        if (!strstr(text, "own=\"org.forkd.Manager\""))
                return doctor_set(c, DOCTOR_FAIL, "reinstall forkd (meson install)",
                                  "%s does not let anyone own org.forkd.Manager", path);
        if (!is_read)
                return doctor_set(c, DOCTOR_FAIL,
                                  "dbus-daemon reads /usr/share/dbus-1/system.d and /etc/dbus-1/system.d only: reinstall "
                                  "with -Ddbus_system_confdir=/usr/share/dbus-1/system.d, or copy the file there",
                                  "%s is where dbus-daemon does not look", path);
        doctor_set(c, DOCTOR_OK, NULL, "%s lets forkd own org.forkd.Manager", path);
}

struct polkit_reply {
        bool done;
        int error;
        char error_name[256];
        unsigned n_forkd, n_all;
};

static int on_enumerate_actions(sd_bus_message *m, void *userdata, sd_bus_error *ret_error) {
        struct polkit_reply *p = userdata;
        const sd_bus_error *e = sd_bus_message_get_error(m);
        const char *id;
        int r;

        p->done = true;
        if (e) {
                p->error = sd_bus_message_get_errno(m) ?: EIO;
                snprintf(p->error_name, sizeof(p->error_name), "%s%s%s", e->name, e->message ? ": " : "",
                         e->message ?: "");
                return 0;
        }
        r = sd_bus_message_enter_container(m, 'a', "(ssssssuuua{ss})");
        if (r < 0)
                goto bad;
        while ((r = sd_bus_message_enter_container(m, 'r', "ssssssuuua{ss}")) > 0) {
                r = sd_bus_message_read(m, "s", &id);
                if (r < 0)
                        goto bad;
                p->n_all++;
                if (strncmp(id, "org.forkd.", 10) == 0)
                        p->n_forkd++;
                r = sd_bus_message_skip(m, "sssssuuua{ss}");
                if (r < 0)
                        goto bad;
                r = sd_bus_message_exit_container(m);
                if (r < 0)
                        goto bad;
        }
        if (r < 0)
                goto bad;
        return 0;
bad:
        p->error = -r;
        snprintf(p->error_name, sizeof(p->error_name), "cannot parse EnumerateActions' reply: %s", strerror(-r));
        return 0;
}

void doctor_check_polkitd(const DoctorOptions *o, DoctorCheck *c) {
        _cleanup_(sd_bus_close_unrefp) sd_bus *bus = NULL;
        _cleanup_(sd_bus_slot_unrefp) sd_bus_slot *slot = NULL;
        const char *where = o->bus_address ?: getenv("DBUS_SYSTEM_BUS_ADDRESS") ?: "the system bus";
        struct polkit_reply p = {};
        uint64_t deadline = now_usec() + POLKITD_TIMEOUT_USEC;
        int r;

        r = bus_open_address(o->bus_address, NULL, &bus);
        if (r < 0)
                return doctor_set(c, DOCTOR_WARN,
                                  "start the system bus (systemctl start dbus), or point DBUS_SYSTEM_BUS_ADDRESS at it",
                                  "cannot connect to %s: %s", where, strerror(-r));
        /* Asynchronously, so that authentication and a hung bus are bounded too. */
        r = sd_bus_call_method_async(bus, &slot, "org.freedesktop.PolicyKit1", "/org/freedesktop/PolicyKit1/Authority",
                                     "org.freedesktop.PolicyKit1.Authority", "EnumerateActions", on_enumerate_actions,
                                     &p, "s", "");
        while (r >= 0 && !p.done) {
                uint64_t n = now_usec();
                if (n >= deadline) {
                        r = -ETIMEDOUT;
                        break;
                }
                r = sd_bus_process(bus, NULL);
                if (r > 0)
                        continue;
                if (r >= 0)
                        r = sd_bus_wait(bus, deadline - n);
        }
        if (r < 0 && !p.done)
                return doctor_set(c, DOCTOR_WARN,
                                  "start the system bus (systemctl start dbus) and check that polkitd runs "
                                  "(systemctl status polkit)",
                                  "no answer from polkitd on %s within %llu s: %s", where,
                                  (unsigned long long) (POLKITD_TIMEOUT_USEC / 1000000), strerror(-r));
        if (p.error)
                return doctor_set(c, DOCTOR_WARN,
                                  "install and start polkitd (apt-get install polkitd; systemctl start polkit); until "
                                  "then forkd refuses every caller but root",
                                  "polkitd does not answer on %s: %s", where, p.error_name);
        if (p.n_forkd == 0)
                return doctor_set(c, DOCTOR_WARN,
                                  "install org.forkd.policy in /usr/share/polkit-1/actions (meson install); polkitd "
                                  "reloads it by itself",
                                  "polkitd answers on %s but knows no org.forkd action (%u actions in all)", where,
                                  p.n_all);
        doctor_set(c, DOCTOR_OK, NULL, "polkitd answers on %s and knows %u org.forkd actions", where, p.n_forkd);
}

void doctor_check_token(const DoctorOptions *o, DoctorCheck *c) {
        static const char create[] = "install -d -m 0700 /etc/forkd; (umask 077; head -c 32 /dev/urandom | od -An -tx1 | "
                                     "tr -d ' \\n' >/etc/forkd/token)";
        const char *path = o->token_file ?: DOCTOR_TOKEN_FILE;
        struct stat st;

        if (stat(path, &st) < 0) {
                if ((errno == EACCES || errno == EPERM) && geteuid() != 0)
                        return doctor_set(c, DOCTOR_SKIP, "run the doctor as root", "cannot look at %s as uid %u: %s",
                                          path, (unsigned) geteuid(), strerror(errno));
                if (errno == ENOENT)
                        return doctor_set(c, DOCTOR_WARN, o->token_file ? "create it, mode 0600" : create,
                                          "%s does not exist: forkd-rest.service does not start without it "
                                          "(forkctl and D-Bus clients do not need it)", path);
                return doctor_set(c, DOCTOR_FAIL, NULL, "%s: %s", path, strerror(errno));
        }
        if (!S_ISREG(st.st_mode))
                return doctor_set(c, DOCTOR_FAIL, "replace it with a regular file, mode 0600", "%s is not a regular file",
                                  path);
        if (st.st_mode & S_IROTH)
                return doctor_set(c, DOCTOR_FAIL, "chmod 0600 it, and replace the token: anyone could read it",
                                  "%s is readable by everyone (mode %04o): forkd-rest refuses it", path,
                                  (unsigned) (st.st_mode & 07777));
        if (st.st_size == 0)
                return doctor_set(c, DOCTOR_FAIL, o->token_file ? "write a token into it" : create,
                                  "%s is empty: forkd-rest refuses it", path);
        if (st.st_mode & (S_IWOTH | S_IRGRP | S_IWGRP))
                return doctor_set(c, DOCTOR_WARN, "chmod 0600 it", "%s has mode %04o: only its owner should read it",
                                  path, (unsigned) (st.st_mode & 07777));
        doctor_set(c, DOCTOR_OK, NULL, "%s exists, mode %04o, owner uid %u", path, (unsigned) (st.st_mode & 07777),
                   (unsigned) st.st_uid);
}
