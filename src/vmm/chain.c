/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Diff snapshots: see chain.h. */
#include <endian.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <limits.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <openssl/evp.h>

#include "chain.h"
#include "hash-cache.h"
#include "vmm.h"

#define PAGE 4096u
#define PAGEMAP_BATCH 4096u
#define PM_PRESENT (UINT64_C(1) << 63)
#define PM_SWAPPED (UINT64_C(1) << 62)
#define PM_FILE (UINT64_C(1) << 61)

static int pwrite_all(int fd, const void *buf, size_t len, off_t off) {
        const uint8_t *p = buf;

        while (len > 0) {
                ssize_t n = pwrite(fd, p, len, off);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                p += n;
                off += n;
                len -= (size_t) n;
        }
        return 0;
}

static size_t map_words(uint64_t mem_size) {
        return (size_t) (mem_size / PAGE / 64);
}


/* /proc/self/pagemap of this process. A confined VMM (jail.c) is not dumpable
 * since it left uid 0, so its /proc/self files belong to root and it may not
 * open them: it becomes dumpable for the one open() and stops being so at once
 * (the fd keeps working; only other processes of its user could have opened
 * its files in between). */
static int open_self_pagemap(void) {
        int d = prctl(PR_GET_DUMPABLE, 0, 0, 0, 0), fd, r;

        if (d == 0)
                (void) prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
        fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
        r = fd < 0 ? -errno : fd;
        if (d == 0)
                (void) prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
        return r;
}
int chain_write_memory_diff(int dfd, const struct vmm *vmm) {
        _cleanup_close_ int pm = -EBADF, fd = -EBADF, mfd = -EBADF;
        _cleanup_free_ uint64_t *map = NULL, *ent = NULL;
        uint64_t n_pages = vmm->mem_size / PAGE, first = (uintptr_t) vmm->mem / PAGE;
        size_t words = map_words(vmm->mem_size);
        int r;

        if ((uintptr_t) vmm->mem % PAGE || vmm->mem_size % (PAGE * 64))
                return -EINVAL;
        map = calloc(words, sizeof(uint64_t));
        ent = malloc(PAGEMAP_BATCH * sizeof(uint64_t));
        if (!map || !ent)
                return -ENOMEM;
        pm = open_self_pagemap();
        if (pm < 0)
                return pm;
        fd = openat(dfd, SNAPSHOT_MEMORY_FILE, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
        if (fd < 0)
                return -errno;
        if (ftruncate(fd, (off_t) vmm->mem_size) < 0)
                return -errno;

        for (uint64_t base = 0; base < n_pages; base += PAGEMAP_BATCH) {
                uint64_t k = MIN((uint64_t) PAGEMAP_BATCH, n_pages - base), run = 0, run_len = 0;
                ssize_t n = pread(pm, ent, k * sizeof(uint64_t), (off_t) ((first + base) * sizeof(uint64_t)));

                if (n != (ssize_t) (k * sizeof(uint64_t)))
                        return n < 0 ? -errno : -EIO;
                for (uint64_t i = 0; i <= k; i++) {
                        bool changed = i < k && (((ent[i] & PM_PRESENT) && !(ent[i] & PM_FILE)) ||
                                                 (ent[i] & PM_SWAPPED));
                        if (changed) {
                                uint64_t p = base + i;
                                map[p / 64] |= UINT64_C(1) << (p % 64);
                                if (run_len == 0)
                                        run = p;
                                run_len++;
                                continue;
                        }
                        if (run_len > 0) {
                                r = pwrite_all(fd, vmm->mem + run * PAGE, run_len * PAGE, (off_t) (run * PAGE));
                                if (r < 0)
                                        return r;
                                run_len = 0;
                        }
                }
        }
        if (fsync(fd) < 0)
                return -errno;
        for (size_t i = 0; i < words; i++)
                map[i] = htole64(map[i]);
        mfd = openat(dfd, SNAPSHOT_MEMORY_MAP_FILE, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
        if (mfd < 0)
                return -errno;
        r = pwrite_all(mfd, map, words * sizeof(uint64_t), 0);
        if (r < 0)
                return r;
        return fsync(mfd) < 0 ? -errno : 0;
}

int chain_hash_file(int fd, char ret[SNAPSHOT_HASH_LEN + 1]) {
        _cleanup_free_ uint8_t *buf = NULL;
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned int md_len = 0;
        EVP_MD_CTX *ctx;
        off_t off = 0;
        int r = 0;

        buf = malloc(1u << 20);
        ctx = EVP_MD_CTX_new();
        if (!buf || !ctx) {
                EVP_MD_CTX_free(ctx);
                return -ENOMEM;
        }
        if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
                r = -EIO;
                goto out;
        }
        for (;;) {
                ssize_t n = pread(fd, buf, 1u << 20, off);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        r = -errno;
                        goto out;
                }
                if (n == 0)
                        break;
                if (EVP_DigestUpdate(ctx, buf, (size_t) n) != 1) {
                        r = -EIO;
                        goto out;
                }
                off += n;
        }
        if (EVP_DigestFinal_ex(ctx, md, &md_len) != 1 || md_len != 32) {
                r = -EIO;
                goto out;
        }
        for (unsigned i = 0; i < 32; i++)
                snprintf(ret + 2 * i, 3, "%02x", md[i]);
out:
        EVP_MD_CTX_free(ctx);
        return r;
}

int chain_hash_file_cached(int dfd, const char *name, int fd, char ret[SNAPSHOT_HASH_LEN + 1]) {
        int r;

        if (hash_cache_get(dfd, name, fd, ret) > 0)
                return 0;
        r = chain_hash_file(fd, ret);
        if (r < 0)
                return r;
        hash_cache_put(dfd, name, fd, ret); /* for the next one, best effort */
        return 0;
}

static int chain_error(char **ret_error, int r, const char *fmt, ...) _printf_(3, 4);
static int chain_error(char **ret_error, int r, const char *fmt, ...) {
        va_list ap;

        if (ret_error) {
                free(*ret_error);
                va_start(ap, fmt);
                if (vasprintf(ret_error, fmt, ap) < 0)
                        *ret_error = NULL;
                va_end(ap);
        }
        return r;
}

static int read_map(int dfd, uint64_t mem_size, uint64_t **ret) {
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ uint64_t *map = NULL;
        size_t words = map_words(mem_size);
        struct stat st;
        ssize_t n;

        fd = openat(dfd, SNAPSHOT_MEMORY_MAP_FILE, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return -errno;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t) st.st_size != words * sizeof(uint64_t))
                return -EBADMSG;
        map = malloc(words * sizeof(uint64_t));
        if (!map)
                return -ENOMEM;
        n = pread(fd, map, words * sizeof(uint64_t), 0);
        if (n != (ssize_t) (words * sizeof(uint64_t)))
                return -EBADMSG;
        for (size_t i = 0; i < words; i++)
                map[i] = le64toh(map[i]);
        *ret = TAKE_PTR(map);
        return 0;
}

void chain_free(struct snapshot *snap) {
        for (unsigned i = 0; i < snap->n_chain; i++) {
                safe_close(snap->chain_mem_fds[i]);
                free(snap->chain_maps[i]);
        }
        snap->n_chain = 0;
}

int chain_load(struct snapshot *snap, char **ret_error) {
        /* Walk up from snap to the root, then store root first. */
        int mem_fds[CHAIN_DEPTH_MAX + 1];
        uint64_t *maps[CHAIN_DEPTH_MAX + 1];
        unsigned n = 0;
        char dir[PATH_MAX], parent_tag[SNAPSHOT_TAG_MAX + 1], want_hash[SNAPSHOT_HASH_LEN + 1],
                link_tag[SNAPSHOT_TAG_MAX + 1];
        char *slash;
        int r, dfd;

        if (!snap->meta.parent_tag[0])
                return 0;
        if (!snap->meta.parent_content_hash[0])
                return chain_error(ret_error, -EBADMSG, "a diff snapshot without parent_content_hash");

        /* this snapshot: its own memory.bin and map */
        dfd = open(snap->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return chain_error(ret_error, -errno, "%s: cannot open", snap->dir);
        r = read_map(dfd, snap->meta.mem_size, &maps[0]);
        close(dfd);
        if (r < 0)
                return chain_error(ret_error, r, "%s: missing or bad", SNAPSHOT_MEMORY_MAP_FILE);
        mem_fds[0] = fcntl(snap->mem_fd, F_DUPFD_CLOEXEC, 3);
        if (mem_fds[0] < 0) {
                free(maps[0]);
                return -errno;
        }
        n = 1;

        snprintf(dir, sizeof(dir), "%s", snap->dir);
        snprintf(link_tag, sizeof(link_tag), "%s", snap->meta.tag);
        snprintf(parent_tag, sizeof(parent_tag), "%s", snap->meta.parent_tag);
        snprintf(want_hash, sizeof(want_hash), "%s", snap->meta.parent_content_hash);
        for (;;) {
                struct snapshot_meta pm;
                const char *err = NULL;
                char path[PATH_MAX + 80], got_hash[SNAPSHOT_HASH_LEN + 1];
                _cleanup_close_ int pdfd = -EBADF, mfd = -EBADF;
                struct stat st;

                if (n > CHAIN_DEPTH_MAX) {
                        r = chain_error(ret_error, -ELOOP, "chain deeper than %u links", CHAIN_DEPTH_MAX);
                        goto fail;
                }
                slash = strrchr(dir, '/');
                if (!slash) {
                        r = chain_error(ret_error, -EINVAL, "%s: no parent directory", dir);
                        goto fail;
                }
                snprintf(slash + 1, sizeof(dir) - (size_t) (slash + 1 - dir), "%s", parent_tag);
                pdfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (pdfd < 0 && errno == ENOENT) {
                        r = chain_error(ret_error, -ENOLINK,
                                        "chain `%s` references parent `%s`, which no longer exists (deleted with "
                                        "force?); the chain cannot be restored: delete it, or rebuild it with "
                                        "`forkctl snapshot diff --from %s`",
                                        link_tag, parent_tag, parent_tag);
                        goto fail;
                }
                if (pdfd < 0) {
                        r = chain_error(ret_error, -errno, "parent snapshot %s: cannot open %s", parent_tag, dir);
                        goto fail;
                }
                snprintf(path, sizeof(path), "%s/%s", dir, SNAPSHOT_META_FILE);
                r = snapshot_meta_read_file(path, &pm, &err);
                if (r < 0) {
                        r = chain_error(ret_error, r, "parent snapshot %s: %s", parent_tag, err ?: strerror(-r));
                        goto fail;
                }
                if (pm.mem_size != snap->meta.mem_size) {
                        r = chain_error(ret_error, -EBADMSG, "parent snapshot %s has another memory size", parent_tag);
                        goto fail;
                }
                mfd = openat(pdfd, pm.memory_file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
                if (mfd < 0 || fstat(mfd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t) st.st_size != pm.mem_size) {
                        r = chain_error(ret_error, -EBADMSG, "parent snapshot %s: bad %s", parent_tag, pm.memory_file);
                        goto fail;
                }
                r = chain_hash_file_cached(pdfd, pm.memory_file, mfd, got_hash);
                if (r < 0) {
                        r = chain_error(ret_error, r, "parent snapshot %s: cannot hash %s", parent_tag,
                                        pm.memory_file);
                        goto fail;
                }
                if (strcmp(got_hash, want_hash) != 0) {
                        /* forkd's documented words for a stale chain */
                        r = chain_error(ret_error, -ESTALE,
                                        "chain `%s` references `%s` content `%.8s...`, but parent now has content "
                                        "`%.8s...`; rebuild with `forkctl snapshot diff --from %s`",
                                        link_tag, parent_tag, want_hash, got_hash, parent_tag);
                        goto fail;
                }
                maps[n] = NULL;
                if (pm.parent_tag[0]) {
                        r = read_map(pdfd, pm.mem_size, &maps[n]);
                        if (r < 0) {
                                r = chain_error(ret_error, r, "parent snapshot %s: missing or bad %s", parent_tag,
                                                SNAPSHOT_MEMORY_MAP_FILE);
                                goto fail;
                        }
                }
                mem_fds[n++] = TAKE_FD(mfd);
                if (!pm.parent_tag[0])
                        break; /* the root */
                snprintf(link_tag, sizeof(link_tag), "%s", parent_tag);
                snprintf(parent_tag, sizeof(parent_tag), "%s", pm.parent_tag);
                snprintf(want_hash, sizeof(want_hash), "%s", pm.parent_content_hash);
        }
        /* root first */
        for (unsigned i = 0; i < n; i++) {
                snap->chain_mem_fds[i] = mem_fds[n - 1 - i];
                snap->chain_maps[i] = maps[n - 1 - i];
        }
        snap->n_chain = n;
        return 0;
fail:
        for (unsigned i = 0; i < n; i++) {
                safe_close(mem_fds[i]);
                free(maps[i]);
        }
        return r;
}

int snapshot_map_memory(const struct snapshot *snap, uint8_t **ret) {
        uint64_t size = snap->meta.mem_size, n_pages = size / PAGE;
        uint8_t *mem;

        if (snap->n_chain == 0) {
                mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, snap->mem_fd, 0);
                if (mem == MAP_FAILED)
                        return -errno;
                *ret = mem;
                return 0;
        }
        mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, snap->chain_mem_fds[0], 0);
        if (mem == MAP_FAILED)
                return -errno;
        for (unsigned l = 1; l < snap->n_chain; l++) {
                const uint64_t *map = snap->chain_maps[l];

                for (uint64_t p = 0; p < n_pages;) {
                        uint64_t end;

                        if (!((map[p / 64] >> (p % 64)) & 1)) {
                                p++;
                                continue;
                        }
                        for (end = p + 1; end < n_pages && ((map[end / 64] >> (end % 64)) & 1); end++)
                                ;
                        if (mmap(mem + p * PAGE, (end - p) * PAGE, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, snap->chain_mem_fds[l],
                                 (off_t) (p * PAGE)) == MAP_FAILED) {
                                int r = -errno;
                                munmap(mem, size);
                                return r;
                        }
                        p = end;
                }
        }
        *ret = mem;
        return 0;
}
