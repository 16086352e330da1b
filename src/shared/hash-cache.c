/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hash-cache.h"
#include "io-util.h"
#include "macro.h"

#define LINE_MAX_BYTES 256

static void cache_line(const struct stat *st, const char *hash, char line[LINE_MAX_BYTES]) {
        snprintf(line, LINE_MAX_BYTES, "v1 %llu %llu %llu %llu %llu %s\n", (unsigned long long) st->st_dev,
                 (unsigned long long) st->st_ino, (unsigned long long) st->st_size,
                 (unsigned long long) st->st_mtim.tv_sec * 1000000000ull + (unsigned long long) st->st_mtim.tv_nsec,
                 (unsigned long long) st->st_ctim.tv_sec * 1000000000ull + (unsigned long long) st->st_ctim.tv_nsec,
                 hash);
}

int hash_cache_get(int dfd, const char *name, int fd, char ret[SNAPSHOT_HASH_LEN + 1]) {
        char cache[SNAPSHOT_FILE_NAME_MAX + 32], line[LINE_MAX_BYTES], want[LINE_MAX_BYTES];
        const char *hex;
        _cleanup_close_ int cfd = -EBADF;
        struct stat st;
        ssize_t n;

        if (strlen(name) > SNAPSHOT_FILE_NAME_MAX || fstat(fd, &st) < 0)
                return 0;
        snprintf(cache, sizeof(cache), "%s" SNAPSHOT_HASH_CACHE_SUFFIX, name);
        cfd = openat(dfd, cache, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (cfd < 0)
                return 0;
        n = pread(cfd, line, sizeof(line) - 1, 0);
        if (n <= 0)
                return 0;
        line[n] = 0;
        /* the line this very file would have, with the line's own hash in it */
        hex = strrchr(line, ' ');
        if (!hex || strlen(hex + 1) != SNAPSHOT_HASH_LEN + 1 || hex[1 + SNAPSHOT_HASH_LEN] != '\n')
                return 0;
        memcpy(ret, hex + 1, SNAPSHOT_HASH_LEN);
        ret[SNAPSHOT_HASH_LEN] = 0;
        if (!snapshot_content_hash_is_valid(ret))
                return 0;
        cache_line(&st, ret, want);
        return strcmp(line, want) == 0;
}

void hash_cache_put(int dfd, const char *name, int fd, const char *hash) {
        char cache[SNAPSHOT_FILE_NAME_MAX + 32], tmp[SNAPSHOT_FILE_NAME_MAX + 64], line[LINE_MAX_BYTES];
        _cleanup_close_ int cfd = -EBADF;
        struct stat st;
        size_t len;

        if (strlen(name) > SNAPSHOT_FILE_NAME_MAX || !snapshot_content_hash_is_valid(hash) || fstat(fd, &st) < 0)
                return;
        cache_line(&st, hash, line);
        len = strlen(line);
        snprintf(cache, sizeof(cache), "%s" SNAPSHOT_HASH_CACHE_SUFFIX, name);
        snprintf(tmp, sizeof(tmp), "%s.%d.tmp" SNAPSHOT_HASH_CACHE_SUFFIX, name, (int) getpid());
        cfd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0644);
        if (cfd < 0)
                return;
        if (loop_write(cfd, line, len) < 0 || renameat(dfd, tmp, dfd, cache) < 0)
                (void) unlinkat(dfd, tmp, 0);
}
