/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Writes the pack-read seeds (tests/fuzz/make-corpus runs it): real bundles
 * from pack_write(), of one snapshot and of a chain of two, made as
 * tests/unit/test-pack.c makes its snapshots (a 4 MiB memory file of holes
 * and two pages). Usage: seed-pack DIR
 */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pack.h"
#include "sha256.h"

static void die(const char *what) {
        fprintf(stderr, "seed-pack: %s: %s\n", what, strerror(errno));
        exit(1);
}

static void write_at(int dfd, const char *name, const void *p, size_t n, off_t off, off_t size) {
        int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_CLOEXEC, 0640);

        if (fd < 0 || (n && pwrite(fd, p, n, off) != (ssize_t) n) || ftruncate(fd, size) < 0)
                die(name);
        close(fd);
}

static void make_link(const char *root, const char *tag, const char *parent, const char *parent_hash) {
        struct snapshot_meta m = {
                .format = 1, .created_at_unix = 1, .mem_size = 4u << 20, .vcpus = 1,
                .memory_file = "memory.bin", .vmstate_file = "vmstate", .disk_file = "disk.img",
                .disk_size = 8192, .kernel = "/k", .guest = "test",
        };
        char page[4096], path[4096];
        char *json;
        int dfd;

        snprintf(m.tag, sizeof(m.tag), "%s", tag);
        snprintf(m.parent_tag, sizeof(m.parent_tag), "%s", parent);
        snprintf(m.parent_content_hash, sizeof(m.parent_content_hash), "%s", parent_hash);
        snprintf(path, sizeof(path), "%s/%s", root, tag);
        if (mkdir(path, 0750) < 0)
                die(path);
        dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                die(path);
        if (snapshot_meta_format(&m, &json) < 0)
                die("snapshot_meta_format");
        write_at(dfd, "snapshot.json", json, strlen(json), 0, (off_t) strlen(json));
        free(json);
        memset(page, tag[0], sizeof(page));
        write_at(dfd, "memory.bin", page, sizeof(page), 1 << 20, 4 << 20);
        write_at(dfd, "memory.bin", page, 100, (3 << 20) + 5, 4 << 20);
        write_at(dfd, "vmstate", "QZQZQ", 5, 0, 5);
        write_at(dfd, "disk.img", NULL, 0, 0, 8192);
        close(dfd);
}

static void bundle(const char *out, const char *const *dirs, size_t n) {
        char *error = NULL;
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

        if (fd < 0)
                die(out);
        if (pack_write(fd, dirs, n, NULL, &error) < 0) {
                fprintf(stderr, "seed-pack: %s\n", error ?: "pack_write failed");
                exit(1);
        }
        close(fd);
}

int main(int argc, char **argv) {
        char tmp[] = "/tmp/forkd-seed-pack.XXXXXX", d0[512], d1[512], out[4096], hex[SHA256_HEX_SIZE];
        const char *dirs[2] = { d0, d1 };
        uint8_t page[4096] = {}, digest[32];
        sha256_ctx c;

        if (argc != 2) {
                fprintf(stderr, "usage: seed-pack DIR\n");
                return 2;
        }
        if (!mkdtemp(tmp))
                die("mkdtemp");
        make_link(tmp, "base", "", "");
        /* The parent's content hash: SHA-256 of its memory file, holes and all. */
        sha256_init(&c);
        for (unsigned i = 0; i < 1024; i++) {
                memset(page, 0, sizeof(page));
                if (i == 256)
                        memset(page, 'b', sizeof(page));
                if (i == 768)
                        memset(page + 5, 'b', 100);
                sha256_update(&c, page, sizeof(page));
        }
        sha256_final(&c, digest);
        sha256_hex(digest, hex);
        make_link(tmp, "l1", "base", hex);
        snprintf(d0, sizeof(d0), "%s/base", tmp);
        snprintf(d1, sizeof(d1), "%s/l1", tmp);

        snprintf(out, sizeof(out), "%s/one.tar.zst", argv[1]);
        bundle(out, dirs, 1);
        snprintf(out, sizeof(out), "%s/chain.tar.zst", argv[1]);
        bundle(out, dirs, 2);
        return 0;
}
