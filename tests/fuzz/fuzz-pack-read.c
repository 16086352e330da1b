/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The bundle walker: pack_read() on any bytes, as forkd unpacks a bundle a
 * caller hands it. The first byte picks a mode, the rest is the bundle. Mode
 * bit 0 set: the rest is a tar that the target compresses with zstd first, so
 * that the fuzzer mutates members rather than compressed bytes and reaches the
 * member checks; clear: the bytes go in as they are. The bundle is a memfd;
 * unpacking goes into a staging directory under $TMPDIR, emptied after every input.
 * FORKD_FUZZ_DEBUG=1 prints why an input was refused.
 */

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zstd.h>

#include "pack.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char staging[4096];
static int staging_dfd = -1;

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        if (ftw->level > 0)
                (void) remove(path);
        return 0;
}

static void cleanup_staging(void) {
        (void) nftw(staging, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void remove_staging(void) {
        cleanup_staging();
        (void) rmdir(staging);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        struct pack_manifest m = {};
        char *err = NULL;
        int fd, r;

        if (size < 1)
                return 0;
        if (staging_dfd < 0) {
                snprintf(staging, sizeof(staging), "%s/forkd-fuzz-pack-read.XXXXXX", getenv("TMPDIR") ?: "/tmp");
                if (!mkdtemp(staging))
                        abort();
                staging_dfd = open(staging, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (staging_dfd < 0)
                        abort();
                atexit(remove_staging);
        }

        fd = memfd_create("bundle", MFD_CLOEXEC);
        if (fd < 0)
                abort();
        if (data[0] & 1) {
                size_t cap = ZSTD_compressBound(size - 1), n;
                void *z = malloc(cap);

                if (!z)
                        abort();
                n = ZSTD_compress(z, cap, data + 1, size - 1, 1);
                if (ZSTD_isError(n) || write(fd, z, n) != (ssize_t) n)
                        abort();
                free(z);
        } else if (size > 1 && write(fd, data + 1, size - 1) != (ssize_t) (size - 1))
                abort();
        if (lseek(fd, 0, SEEK_SET) < 0)
                abort();

        r = pack_read(fd, staging_dfd, NULL, &m, &err);
        if (r >= 0)
                pack_manifest_done(&m);
        else {
                if (!err && r != -ENOMEM)
                        abort(); /* a refusal says why */
                if (getenv("FORKD_FUZZ_DEBUG"))
                        fprintf(stderr, "pack_read: %s\n", err ?: strerror(-r));
                free(err);
        }
        close(fd);
        cleanup_staging();
        return 0;
}
