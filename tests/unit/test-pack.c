/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* Snapshot bundles (src/shared/pack.c): the manifest parser, and a chain
 * packed and unpacked again with its holes kept. */

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/sha.h>

#include "hash-cache.h"
#include "macro.h"
#include "pack.h"

#define H64(c) c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c
#define HA H64("a")
#define HB H64("b")

static int parse(const char *json, char **error) {
        struct pack_manifest m = {}, sentinel = {};
        int r;

        free(*error);
        *error = NULL;
        r = pack_manifest_parse(json, strlen(json), &m, error);
        if (r < 0) {
                assert_memory_equal(&m, &sentinel, sizeof(m)); /* untouched */
                assert_non_null(*error);
        }
        pack_manifest_done(&m);
        return r;
}

static void test_manifest(void **state) {
        _cleanup_free_ char *error = NULL;
        struct pack_manifest m = {};
        const char *good =
                "{\"version\":2,\"chain\":["
                "{\"tag\":\"base\",\"parent_tag\":null,\"parent_content_hash\":null,\"files\":["
                "{\"name\":\"snapshot.json\",\"size\":10,\"sha256\":\"" HA "\"},"
                "{\"name\":\"memory.bin\",\"size\":4096,\"sha256\":\"" HB "\"}]},"
                "{\"tag\":\"l1\",\"parent_tag\":\"base\",\"parent_content_hash\":\"" HB "\",\"files\":["
                "{\"name\":\"snapshot.json\",\"size\":10,\"sha256\":\"" HA "\"}]}]}";
        char *s;

        assert_int_equal(pack_manifest_parse(good, strlen(good), &m, &error), 0);
        assert_int_equal(m.n_links, 2);
        assert_string_equal(m.links[0].tag, "base");
        assert_string_equal(m.links[0].parent_tag, "");
        assert_string_equal(m.links[1].parent_tag, "base");
        assert_int_equal(m.links[0].n_files, 2);
        assert_int_equal(m.links[0].files[1].size, 4096);
        /* format, then parse again: the same */
        assert_int_equal(pack_manifest_format(&m, &s), 0);
        pack_manifest_done(&m);
        assert_int_equal(pack_manifest_parse(s, strlen(s), &m, &error), 0);
        assert_int_equal(m.n_links, 2);
        assert_string_equal(m.links[1].parent_content_hash, HB);
        pack_manifest_done(&m);
        free(s);

        assert_int_equal(parse("{\"version\":1,\"chain\":[]}", &error), -EBADMSG);
        assert_non_null(strstr(error, "version 1"));
        assert_int_equal(parse("{\"version\":2,\"chain\":[]}", &error), -EBADMSG);
        assert_int_equal(parse("{\"version\":2}", &error), -EBADMSG);
        assert_int_equal(parse("{\"version\":2,\"chain\":[],\"x\":1}", &error), -EBADMSG);
        assert_int_equal(parse("[]", &error), -EBADMSG);
        /* the root has a parent */
        assert_int_equal(parse("{\"version\":2,\"chain\":[{\"tag\":\"l1\",\"parent_tag\":\"base\",\"parent_content_hash\":\"" HB
                               "\",\"files\":[{\"name\":\"snapshot.json\",\"size\":1,\"sha256\":\"" HA "\"}]}]}",
                               &error),
                         -EBADMSG);
        assert_non_null(strstr(error, "root link"));
        /* a file name with a slash, "..", a missing snapshot.json, a duplicate file */
        assert_int_equal(parse("{\"version\":2,\"chain\":[{\"tag\":\"b\",\"parent_tag\":null,\"parent_content_hash\":null,"
                               "\"files\":[{\"name\":\"../x\",\"size\":1,\"sha256\":\"" HA "\"}]}]}",
                               &error),
                         -EBADMSG);
        assert_int_equal(parse("{\"version\":2,\"chain\":[{\"tag\":\"b\",\"parent_tag\":null,\"parent_content_hash\":null,"
                               "\"files\":[{\"name\":\"..\",\"size\":1,\"sha256\":\"" HA "\"}]}]}",
                               &error),
                         -EBADMSG);
        assert_int_equal(parse("{\"version\":2,\"chain\":[{\"tag\":\"b\",\"parent_tag\":null,\"parent_content_hash\":null,"
                               "\"files\":[{\"name\":\"vmstate\",\"size\":1,\"sha256\":\"" HA "\"}]}]}",
                               &error),
                         -EBADMSG);
        assert_non_null(strstr(error, "no snapshot.json"));
        assert_int_equal(parse("{\"version\":2,\"chain\":[{\"tag\":\"b\",\"parent_tag\":null,\"parent_content_hash\":null,"
                               "\"files\":[{\"name\":\"snapshot.json\",\"size\":1,\"sha256\":\"" HA "\"},"
                               "{\"name\":\"snapshot.json\",\"size\":1,\"sha256\":\"" HA "\"}]}]}",
                               &error),
                         -EBADMSG);
        assert_non_null(strstr(error, "twice"));
        /* oversized */
        assert_int_equal(parse("{\"version\":2,\"chain\":[{\"tag\":\"b\",\"parent_tag\":null,\"parent_content_hash\":null,"
                               "\"files\":[{\"name\":\"snapshot.json\",\"size\":99999999999999,\"sha256\":\"" HA "\"}]}]}",
                               &error),
                         -EBADMSG);
        assert_non_null(strstr(error, "too large"));
        /* a bad digest, a tag twice, a parent that is not the link before */
        assert_int_equal(parse("{\"version\":2,\"chain\":[{\"tag\":\"b\",\"parent_tag\":null,\"parent_content_hash\":null,"
                               "\"files\":[{\"name\":\"snapshot.json\",\"size\":1,\"sha256\":\"xyz\"}]}]}",
                               &error),
                         -EBADMSG);
        assert_int_equal(parse("{\"version\":2,\"chain\":[{\"tag\":\"b\",\"parent_tag\":null,\"parent_content_hash\":null,"
                               "\"files\":[{\"name\":\"snapshot.json\",\"size\":1,\"sha256\":\"" HA "\"}]},"
                               "{\"tag\":\"c\",\"parent_tag\":\"x\",\"parent_content_hash\":\"" HA "\","
                               "\"files\":[{\"name\":\"snapshot.json\",\"size\":1,\"sha256\":\"" HA "\"}]}]}",
                               &error),
                         -EBADMSG);
        assert_non_null(strstr(error, "not the link before"));
}

/* ---- round trip ---- */

static void write_at(int dfd, const char *name, const void *p, size_t n, off_t off, off_t size) {
        int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_CLOEXEC, 0640);

        assert_true(fd >= 0);
        if (n)
                assert_int_equal(pwrite(fd, p, n, off), (ssize_t) n);
        assert_int_equal(ftruncate(fd, size), 0);
        close(fd);
}

static void file_sha256(int dfd, const char *name, char hex[65]) {
        int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC);
        uint8_t buf[65536], d[32];
        SHA256_CTX c;
        ssize_t n;

        assert_true(fd >= 0);
        SHA256_Init(&c);
        while ((n = read(fd, buf, sizeof(buf))) > 0)
                SHA256_Update(&c, buf, (size_t) n);
        SHA256_Final(d, &c);
        close(fd);
        for (int i = 0; i < 32; i++)
                snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

static void make_link(int root, const char *tag, const char *parent, const char *parent_hash) {
        struct snapshot_meta m = {
                .format = 1, .created_at_unix = 1, .mem_size = 4u << 20, .vcpus = 1,
                .memory_file = "memory.bin", .vmstate_file = "vmstate", .disk_file = "disk.img",
                .disk_size = 8192, .kernel = "/k", .guest = "test",
        };
        char page[4096];
        char *json;
        int dfd;

        snprintf(m.tag, sizeof(m.tag), "%s", tag);
        snprintf(m.parent_tag, sizeof(m.parent_tag), "%s", parent);
        snprintf(m.parent_content_hash, sizeof(m.parent_content_hash), "%s", parent_hash);
        assert_int_equal(mkdirat(root, tag, 0750), 0);
        dfd = openat(root, tag, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(dfd >= 0);
        assert_int_equal(snapshot_meta_format(&m, &json), 0);
        write_at(dfd, "snapshot.json", json, strlen(json), 0, (off_t) strlen(json));
        free(json);
        memset(page, tag[0], sizeof(page));
        /* a 4 MiB memory file with two pages of data, the rest holes */
        write_at(dfd, "memory.bin", page, sizeof(page), 1 << 20, 4 << 20);
        write_at(dfd, "memory.bin", page, 100, (3 << 20) + 5, 4 << 20);
        write_at(dfd, "vmstate", "QZQZQ", 5, 0, 5);
        write_at(dfd, "disk.img", NULL, 0, 0, 8192);
        close(dfd);
}

/* The test's directory, then the fds still open on it, gone. */
static void remove_tree(const char *dir, int fds[], size_t n) {
        char cmd[256];

        for (size_t i = 0; i < n; i++)
                close(fds[i]);
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        assert_int_equal(system(cmd), 0);
}

static void test_round_trip(void **state) {
        char tmpl[] = "/tmp/test-pack.XXXXXX", cmd[256], path[512], a[65], b[65];
        _cleanup_free_ char *error = NULL;
        struct pack_manifest m = {};
        const char *dirs[2];
        char d0[300], d1[300];
        int root, out, in, staging;
        struct stat st;

        assert_non_null(mkdtemp(tmpl));
        root = open(tmpl, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(root >= 0);
        assert_int_equal(mkdirat(root, "src", 0750), 0);
        assert_int_equal(mkdirat(root, "out", 0750), 0);
        int src = openat(root, "src", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        make_link(src, "base", "", "");
        file_sha256(src, "base/memory.bin", a);
        make_link(src, "l1", "base", a);
        snprintf(d0, sizeof(d0), "%s/src/base", tmpl);
        snprintf(d1, sizeof(d1), "%s/src/l1", tmpl);
        dirs[0] = d0;
        dirs[1] = d1;

        out = openat(root, "b.tar.zst", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
        assert_true(out >= 0);
        assert_int_equal(pack_write(out, dirs, 2, NULL, &error), 0);
        close(out);

        in = openat(root, "b.tar.zst", O_RDONLY | O_CLOEXEC);
        staging = openat(root, "out", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_int_equal(pack_read(in, staging, NULL, &m, &error), 0);
        close(in);
        assert_int_equal(m.n_links, 2);
        assert_string_equal(m.links[0].tag, "base");
        assert_string_equal(m.links[1].tag, "l1");
        pack_manifest_done(&m);
        file_sha256(staging, "l1/memory.bin", b);
        file_sha256(src, "l1/memory.bin", a);
        assert_string_equal(a, b);
        assert_int_equal(fstatat(staging, "base/memory.bin", &st, 0), 0);
        assert_int_equal(st.st_size, 4 << 20);
        assert_true(st.st_blocks * 512 <= 64 * 1024); /* holes stay holes */

        /* --tag for a chain: refused; for one link: renamed */
        in = openat(root, "b.tar.zst", O_RDONLY | O_CLOEXEC);
        assert_int_equal(mkdirat(root, "out2", 0750), 0);
        int staging2 = openat(root, "out2", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_int_equal(pack_read(in, staging2, "other", &m, &error), -EBADMSG);
        assert_non_null(strstr(error, "chain of 2"));
        close(in);
        out = openat(root, "one.tar.zst", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
        assert_int_equal(pack_write(out, dirs, 1, NULL, &error), 0);
        close(out);
        in = openat(root, "one.tar.zst", O_RDONLY | O_CLOEXEC);
        assert_int_equal(pack_read(in, staging2, "other", &m, &error), 0);
        close(in);
        assert_string_equal(m.links[0].tag, "other");
        pack_manifest_done(&m);
        struct snapshot_meta meta;
        const char *reason;
        snprintf(path, sizeof(path), "%s/out2/other/snapshot.json", tmpl);
        assert_int_equal(snapshot_meta_read_file(path, &meta, &reason), 0);
        assert_string_equal(meta.tag, "other");

        /* one byte changed in the compressed stream: refused */
        snprintf(cmd, sizeof(cmd), "cd %s && zstd -q -d -c b.tar.zst > b.tar", tmpl);
        assert_int_equal(system(cmd), 0);
        snprintf(path, sizeof(path), "%s/b.tar", tmpl);
        int t = open(path, O_RDWR | O_CLOEXEC);
        char buf[1 << 16];
        ssize_t n = read(t, buf, sizeof(buf));
        assert_true(n > 0);
        char *v = memmem(buf, (size_t) n, "QZQZQ", 5); /* the vmstate content */
        assert_non_null(v);
        assert_int_equal(pwrite(t, "X", 1, v - buf), 1);
        close(t);
        snprintf(cmd, sizeof(cmd), "cd %s && zstd -q -c b.tar > bad.tar.zst", tmpl);
        assert_int_equal(system(cmd), 0);
        in = openat(root, "bad.tar.zst", O_RDONLY | O_CLOEXEC);
        assert_int_equal(mkdirat(root, "out3", 0750), 0);
        int staging3 = openat(root, "out3", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_int_equal(pack_read(in, staging3, NULL, &m, &error), -EBADMSG);
        assert_non_null(strstr(error, "SHA-256"));
        close(in);

        remove_tree(tmpl, (int[]) { staging, staging2, staging3, src, root }, 5);
}

/* ---- the hash cache beside each file ---- */

static void read_cache(int dfd, const char *name, char *line, size_t size) {
        int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC);
        ssize_t n;

        assert_true(fd >= 0);
        n = read(fd, line, size - 1);
        assert_true(n > 0);
        line[n] = 0;
        close(fd);
}

static void test_hash_cache(void **state) {
        char tmpl[] = "/tmp/test-pack-cache.XXXXXX", want[65], got[65], line[256], forged[256];
        _cleanup_free_ char *error = NULL;
        struct pack_manifest m = {};
        const char *dirs[1];
        char d0[300];
        int root, src, staging, out, in, fd;

        assert_non_null(mkdtemp(tmpl));
        root = open(tmpl, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_int_equal(mkdirat(root, "src", 0750), 0);
        assert_int_equal(mkdirat(root, "out", 0750), 0);
        src = openat(root, "src", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        make_link(src, "base", "", "");
        file_sha256(src, "base/memory.bin", want);
        snprintf(d0, sizeof(d0), "%s/src/base", tmpl);
        dirs[0] = d0;

        /* a forged entry for this very file, with the wrong inode, is not believed by pack */
        fd = openat(src, "base/memory.bin", O_RDONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        {
                int dfd = openat(src, "base", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                struct stat st;

                assert_int_equal(fstat(fd, &st), 0);
                snprintf(forged, sizeof(forged), "v1 %llu %llu %llu 0 0 %064d\n", (unsigned long long) st.st_dev,
                         (unsigned long long) st.st_ino + 1, (unsigned long long) st.st_size, 0);
                write_at(dfd, "memory.bin.sha256", forged, strlen(forged), 0, (off_t) strlen(forged));
                assert_int_equal(hash_cache_get(dfd, "memory.bin", fd, got), 0);
                close(dfd);
        }
        out = openat(root, "b.tar.zst", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
        assert_int_equal(pack_write(out, dirs, 1, NULL, &error), 0);
        close(out);
        /* pack hashed the file itself and wrote the entry for it ... */
        read_cache(src, "base/memory.bin.sha256", line, sizeof(line));
        assert_non_null(strstr(line, want));
        {
                int dfd = openat(src, "base", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

                assert_int_equal(hash_cache_get(dfd, "memory.bin", fd, got), 1);
                assert_string_equal(got, want);
                close(dfd);
        }
        close(fd);
        /* ... and the bundle carries the right hash: unpack checks it, and leaves an entry too */
        in = openat(root, "b.tar.zst", O_RDONLY | O_CLOEXEC);
        staging = openat(root, "out", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_int_equal(pack_read(in, staging, NULL, &m, &error), 0);
        close(in);
        pack_manifest_done(&m);
        {
                int dfd = openat(staging, "base", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                int mfd = openat(dfd, "memory.bin", O_RDWR | O_CLOEXEC);

                assert_int_equal(hash_cache_get(dfd, "memory.bin", mfd, got), 1);
                assert_string_equal(got, want);
                /* a write to the file makes the entry stale */
                assert_int_equal(pwrite(mfd, "x", 1, 0), 1);
                assert_int_equal(hash_cache_get(dfd, "memory.bin", mfd, got), 0);
                close(mfd);
                close(dfd);
        }
        remove_tree(tmpl, (int[]) { staging, src, root }, 3);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_manifest),
                cmocka_unit_test(test_round_trip),
                cmocka_unit_test(test_hash_cache),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
