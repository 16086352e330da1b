/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * The portable agent's view of a container image, without a VM: image.json
 * (also hostile: wrong types, huge, missing), the environment merge, and the
 * /etc/passwd and /etc/group parser behind "user".
 */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent-image.h"
#include "macro.h"
#include "strv.h"

static int parse(const char *s, ImageConfig *c) {
        const char *why = NULL;

        return image_config_parse(s, strlen(s), c, &why);
}

static void test_image_config_full(void **state) {
        _cleanup_(image_config_done) ImageConfig c = {};

        assert_int_equal(parse("{\"env\": [\"PATH=/usr/bin\", \"A=b=c\"], \"working_dir\": \"/opt/app\","
                               " \"user\": \"1000:1000\", \"entrypoint\": [\"/bin/sh\", \"-c\"],"
                               " \"cmd\": [\"echo hi\"], \"start_cmd\": true, \"later\": {\"x\": 1}}", &c), 0);
        assert_int_equal(strv_length(c.env), 2);
        assert_string_equal(c.env[1], "A=b=c");
        assert_string_equal(c.working_dir, "/opt/app");
        assert_string_equal(c.user, "1000:1000");
        assert_string_equal(c.entrypoint[1], "-c");
        assert_string_equal(c.cmd[0], "echo hi");
        assert_true(c.start_cmd);
}

static void test_image_config_empty(void **state) {
        _cleanup_(image_config_done) ImageConfig c = {};

        assert_int_equal(parse("{}", &c), 0);
        assert_null(c.env);
        assert_null(c.working_dir);
        assert_null(c.user);
        assert_false(c.start_cmd);
        image_config_done(&c);
        /* empty strings and nulls are as absent */
        assert_int_equal(parse("{\"user\": \"\", \"working_dir\": \"\", \"env\": null, \"cmd\": null}", &c), 0);
        assert_null(c.user);
        assert_null(c.working_dir);
        assert_null(c.env);
}

static void test_image_config_hostile(void **state) {
        static const char *const bad[] = {
                "",
                "[]",
                "\"x\"",
                "{\"env\": \"PATH=/bin\"}",
                "{\"env\": [1]}",
                "{\"env\": [\"NOEQUALS\"]}",
                "{\"env\": [\"=value\"]}",
                "{\"env\": [\"A=\\u0000\"]}",
                "{\"working_dir\": 5}",
                "{\"working_dir\": \"relative\"}",
                "{\"user\": 1000}",
                "{\"user\": [\"root\"]}",
                "{\"entrypoint\": {}}",
                "{\"cmd\": [\"a\", null]}",
                "{\"start_cmd\": \"yes\"}",
                "{\"start_cmd\": 1}",
                "{\"env\": [\"A=1\"]} trailing",
                "{\"a\": [[[[[[[[[[[[1]]]]]]]]]]]]}",
        };

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                ImageConfig c = {};
                const char *why = NULL;
                int r = image_config_parse(bad[i], strlen(bad[i]), &c, &why);

                if (r >= 0)
                        fail_msg("accepted: %s", bad[i]);
                assert_non_null(why);
                assert_null(c.env);
                assert_null(c.user);
        }
}

static void test_image_config_limits(void **state) {
        _cleanup_free_ char *big = NULL, *many = NULL, *huge = NULL;
        ImageConfig c = {};
        size_t n;
        FILE *f;

        /* a string over 64 KiB */
        big = malloc(IMAGE_STRING_MAX + 64);
        assert_non_null(big);
        n = (size_t) sprintf(big, "{\"user\": \"");
        memset(big + n, 'a', IMAGE_STRING_MAX + 1);
        strcpy(big + n + IMAGE_STRING_MAX + 1, "\"}");
        assert_int_equal(parse(big, &c), -E2BIG);

        /* more than 256 arguments */
        many = malloc(16 * 300 + 64);
        assert_non_null(many);
        n = (size_t) sprintf(many, "{\"cmd\": [");
        for (unsigned i = 0; i < 257; i++)
                n += (size_t) sprintf(many + n, "%s\"x\"", i ? "," : "");
        strcpy(many + n, "]}");
        assert_int_equal(parse(many, &c), -E2BIG);

        /* a file over 1 MiB, and a missing one */
        char path[] = "/tmp/test-agent-image-XXXXXX";
        int fd = mkstemp(path);

        assert_true(fd >= 0);
        f = fdopen(fd, "w");
        assert_non_null(f);
        huge = malloc(IMAGE_CONFIG_MAX + 2);
        assert_non_null(huge);
        memset(huge, ' ', IMAGE_CONFIG_MAX + 1);
        huge[0] = '{';
        huge[IMAGE_CONFIG_MAX] = '}';
        assert_int_equal(fwrite(huge, 1, IMAGE_CONFIG_MAX + 1, f), IMAGE_CONFIG_MAX + 1);
        fclose(f);
        assert_int_equal(image_config_load(path, &c, NULL), -E2BIG);
        unlink(path);
        assert_int_equal(image_config_load(path, &c, NULL), -ENOENT);
}

static void test_env_merge(void **state) {
        char *base[] = { (char *) "PATH=/bin", (char *) "A=1", (char *) "B=2", (char *) "A=3", NULL };
        char *over[] = { (char *) "B=x", (char *) "C=", (char *) "PATH=/usr/bin:/bin", NULL };
        _cleanup_strv_free_ char **m = NULL, **m2 = NULL, **m3 = NULL;

        m = env_merge(base, over);
        assert_non_null(m);
        assert_int_equal(strv_length(m), 4);
        assert_string_equal(m[0], "PATH=/usr/bin:/bin");
        assert_string_equal(m[1], "A=3");
        assert_string_equal(m[2], "B=x");
        assert_string_equal(m[3], "C=");
        assert_string_equal(env_get(m, "C"), "");
        assert_string_equal(env_get(m, "A"), "3");
        assert_null(env_get(m, "AB"));
        assert_null(env_get(m, "P"));

        m2 = env_merge(NULL, NULL);
        assert_non_null(m2);
        assert_int_equal(strv_length(m2), 0);
        m3 = env_merge(NULL, over);
        assert_int_equal(strv_length(m3), 3);
}

static void test_find_in_path(void **state) {
        _cleanup_free_ char *p = NULL, *q = NULL;

        assert_int_equal(find_in_path("sh", "/nonexistent:/bin:/usr/bin", &p), 0);
        assert_true(strcmp(p, "/bin/sh") == 0 || strcmp(p, "/usr/bin/sh") == 0);
        assert_int_equal(find_in_path("no-such-program-here", "/bin:/usr/bin", &q), -ENOENT);
        assert_int_equal(find_in_path("", "/bin", &q), -ENOENT);
        assert_int_equal(find_in_path("/x/y", "/bin", &q), 0);
        assert_string_equal(q, "/x/y");
}

static void test_passwd_group_lines(void **state) {
        char l1[] = "app:x:1000:1001:App,,,:/home/app:/bin/sh\n";
        char l2[] = "bad:x:notanumber:1:::\n";
        char l3[] = "short:x:1\n";
        char l4[] = "toolong:x:1:2:g:/h:/s:extra\n";
        char l5[] = ":x:1:2:g:/h:/s\n";
        char l6[] = "neg:x:-1:2:g:/h:/s\n";
        char l7[] = "max:x:4294967295:2:g:/h:/s\n";
        char g1[] = "staff:x:50:app,other\n";
        char g2[] = "staff:x:50\n";
        const char *name, *home, *members;
        uid_t uid;
        gid_t gid;

        assert_int_equal(passwd_parse_line(l1, &name, &uid, &gid, &home), 0);
        assert_string_equal(name, "app");
        assert_int_equal(uid, 1000);
        assert_int_equal(gid, 1001);
        assert_string_equal(home, "/home/app");
        assert_int_equal(passwd_parse_line(l2, &name, &uid, &gid, &home), -EINVAL);
        assert_int_equal(passwd_parse_line(l3, &name, &uid, &gid, &home), -EINVAL);
        assert_int_equal(passwd_parse_line(l4, &name, &uid, &gid, &home), -EINVAL);
        assert_int_equal(passwd_parse_line(l5, &name, &uid, &gid, &home), -EINVAL);
        assert_int_equal(passwd_parse_line(l6, &name, &uid, &gid, &home), -EINVAL);
        assert_int_equal(passwd_parse_line(l7, &name, &uid, &gid, &home), -EINVAL);
        assert_int_equal(group_parse_line(g1, &name, &gid, &members), 0);
        assert_string_equal(name, "staff");
        assert_int_equal(gid, 50);
        assert_string_equal(members, "app,other");
        assert_int_equal(group_parse_line(g2, &name, &gid, &members), -EINVAL);
}

static void write_file(const char *dir, const char *name, const char *text) {
        char p[600];
        FILE *f;

        assert_true(strlen(dir) + 1 + strlen(name) < sizeof p);
        snprintf(p, sizeof p, "%s/%s", dir, name);
        f = fopen(p, "w");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
}

static void test_user_resolve(void **state) {
        char root[] = "/tmp/test-agent-users-XXXXXX", etc[512], p[600];
        UserIds u = {};

        assert_non_null(mkdtemp(root));
        snprintf(etc, sizeof etc, "%s/etc", root);
        assert_int_equal(mkdir(etc, 0755), 0);
        write_file(etc, "passwd",
                   "root:x:0:0:root:/root:/bin/sh\n"
                   "garbage line\n"
                   "app:x:1000:1001:App:/home/app:/bin/sh\n"
                   "nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n");
        write_file(etc, "group",
                   "root:x:0:\n"
                   "broken\n"
                   "app:x:1001:\n"
                   "staff:x:50:app,other\n"
                   "video:x:44:app\n"
                   "nogroup:x:65534:\n");

        assert_int_equal(user_resolve(root, "app", &u), 0);
        assert_int_equal(u.uid, 1000);
        assert_int_equal(u.gid, 1001);
        assert_string_equal(u.home, "/home/app");
        assert_int_equal(u.n_groups, 2);
        assert_int_equal(u.groups[0], 50);
        assert_int_equal(u.groups[1], 44);
        user_ids_done(&u);

        assert_int_equal(user_resolve(root, "1000", &u), 0); /* a known uid: its entry's group */
        assert_int_equal(u.gid, 1001);
        user_ids_done(&u);
        u = (UserIds) {};
        assert_int_equal(user_resolve(root, "4242", &u), 0); /* unknown uid: group 0 */
        assert_int_equal(u.uid, 4242);
        assert_int_equal(u.gid, 0);
        assert_null(u.home);
        user_ids_done(&u);
        u = (UserIds) {};
        assert_int_equal(user_resolve(root, "4242:77", &u), 0);
        assert_int_equal(u.gid, 77);
        user_ids_done(&u);
        u = (UserIds) {};
        assert_int_equal(user_resolve(root, "app:staff", &u), 0);
        assert_int_equal(u.uid, 1000);
        assert_int_equal(u.gid, 50);
        user_ids_done(&u);
        u = (UserIds) {};
        assert_int_equal(user_resolve(root, "nobody:nogroup", &u), 0);
        assert_int_equal(u.uid, 65534);
        assert_int_equal(u.gid, 65534);
        user_ids_done(&u);
        u = (UserIds) {};

        assert_int_equal(user_resolve(root, "ghost", &u), -ESRCH);
        assert_int_equal(user_resolve(root, "app:ghosts", &u), -ESRCH);
        assert_int_equal(user_resolve(root, "", &u), -EINVAL);
        assert_int_equal(user_resolve(root, ":1", &u), -EINVAL);
        assert_int_equal(user_resolve(root, "app:", &u), -EINVAL);
        assert_int_equal(user_resolve(root, "a:b:c", &u), -EINVAL);

        snprintf(p, sizeof p, "%s/passwd", etc);
        unlink(p);
        snprintf(p, sizeof p, "%s/group", etc);
        unlink(p);
        /* without the files: numbers still work, names do not */
        assert_int_equal(user_resolve(root, "1:2", &u), 0);
        assert_int_equal(u.uid, 1);
        assert_int_equal(u.gid, 2);
        user_ids_done(&u);
        assert_int_equal(user_resolve(root, "app", &u), -ESRCH);
        rmdir(etc);
        rmdir(root);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_image_config_full),
                cmocka_unit_test(test_image_config_empty),
                cmocka_unit_test(test_image_config_hostile),
                cmocka_unit_test(test_image_config_limits),
                cmocka_unit_test(test_env_merge),
                cmocka_unit_test(test_find_in_path),
                cmocka_unit_test(test_passwd_group_lines),
                cmocka_unit_test(test_user_resolve),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
