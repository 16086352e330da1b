/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * virtio-blk with a lazily created copy-on-write overlay. See virtio-blk.h.
 */

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bootinfo.h"
#include "io-util.h"
#include "vmm-limits.h"
#include "virtio-blk.h"

#define BLK_BLOCK VIRTIO_BLK_OVERLAY_BLOCK
#define EXPORT_CHUNK (1u << 20)

/* An overlay frozen by virtio_blk_freeze_overlay(): read-only from then on. */
struct blk_layer {
        int fd;
        uint64_t *bitmap;
};

struct blk {
        int base_fd;
        enum virtio_blk_mode mode;
        struct blk_layer layers[VIRTIO_BLK_LAYERS_MAX]; /* frozen overlays, oldest first */
        unsigned n_layers;
        uint64_t size;           /* bytes, multiple of 512 */
        int overlay_fd;          /* -EBADF until the first write */
        uint64_t *bitmap;        /* NULL until the first write */
        uint64_t n_blocks;
        uint64_t n_written;      /* bits set in bitmap */
        char *overlay_dir;
        char id[VIRTIO_BLK_ID_BYTES];
        struct virtq_chain chain; /* scratch for the request being handled */
};

static struct blk *blk_of(struct virtio_mmio *dev) {
        if (!dev || virtio_mmio_device_id(dev) != FORKD_VIRTIO_ID_BLK)
                return NULL;
        return virtio_mmio_priv(dev);
}

static void blk_free(void *p) {
        struct blk *b = p;

        if (!b)
                return;
        safe_close(b->base_fd);
        for (unsigned i = 0; i < b->n_layers; i++) {
                safe_close(b->layers[i].fd);
                free(b->layers[i].bitmap);
        }
        safe_close(b->overlay_fd);
        free(b->bitmap);
        free(b->overlay_dir);
        free(b);
}

static inline void blk_freep(struct blk **b) {
        blk_free(*b);
}

/* ---- the overlay ------------------------------------------------------------ */

static bool block_in_overlay(const struct blk *b, uint64_t blk) {
        return b->bitmap && (b->bitmap[blk / 64] >> (blk % 64)) & 1;
}

/* The file that holds block blk as the guest sees it: the live overlay, the
 * newest frozen layer that has it, or the base. */
static int block_source(const struct blk *b, uint64_t blk) {
        if (block_in_overlay(b, blk))
                return b->overlay_fd;
        for (unsigned i = b->n_layers; i > 0; i--)
                if ((b->layers[i - 1].bitmap[blk / 64] >> (blk % 64)) & 1)
                        return b->layers[i - 1].fd;
        return b->base_fd;
}

static void mark_block(struct blk *b, uint64_t blk) {
        if (!block_in_overlay(b, blk)) {
                b->bitmap[blk / 64] |= 1ull << (blk % 64);
                b->n_written++;
        }
}

static int open_overlay_file(const char *dir) {
        _cleanup_free_ char *path = NULL;
        int fd;

        fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (fd >= 0)
                return fd;
        /* filesystems without O_TMPFILE: a named file, unlinked at once */
        if (asprintf(&path, "%s/.forkd-overlay-XXXXXX", dir) < 0)
                return -ENOMEM;
        fd = mkostemp(path, O_CLOEXEC);
        if (fd < 0)
                return negative_errno();
        if (unlink(path) < 0) {
                int r = negative_errno();
                safe_close(fd);
                return r;
        }
        return fd;
}

static int ensure_overlay(struct blk *b) {
        _cleanup_close_ int fd = -EBADF;
        uint64_t *bitmap;

        if (b->overlay_fd >= 0)
                return 0;

        fd = open_overlay_file(b->overlay_dir);
        if (fd < 0)
                return fd;
        bitmap = calloc(b->n_blocks / 64 + 1, sizeof(uint64_t));
        if (!bitmap)
                return -ENOMEM;
        b->bitmap = bitmap;
        b->overlay_fd = TAKE_FD(fd);
        return 0;
}

static int pwrite_full(int fd, const void *buf, size_t len, uint64_t off) {
        const uint8_t *p = buf;

        while (len > 0) {
                ssize_t n = pwrite(fd, p, len, (off_t) off);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return negative_errno();
                }
                if (n == 0)
                        return -EIO;
                p += n;
                off += (uint64_t) n;
                len -= (size_t) n;
        }
        return 0;
}

/* End (exclusive, <= end) of the run starting at off whose blocks all come
 * from the same file (*ret_fd). */
static uint64_t same_source_run(const struct blk *b, uint64_t off, uint64_t end, int *ret_fd) {
        int fd = block_source(b, off / BLK_BLOCK);
        uint64_t next = (off / BLK_BLOCK + 1) * BLK_BLOCK;

        while (next < end && block_source(b, next / BLK_BLOCK) == fd)
                next += BLK_BLOCK;
        *ret_fd = fd;
        return MIN(next, end);
}

/* [off, off+len) lies inside the disk (checked by the caller). */
static int blk_read(struct blk *b, uint64_t off, uint8_t *buf, size_t len) {
        uint64_t end = off + len;

        while (off < end) {
                int fd;
                uint64_t run_end = same_source_run(b, off, end, &fd);
                int r = pread_exact(fd, buf, run_end - off, off);
                if (r < 0)
                        return r;
                buf += run_end - off;
                off = run_end;
        }
        return 0;
}

static int blk_write(struct blk *b, uint64_t off, const uint8_t *buf, size_t len) {
        uint64_t end = off + len;
        int r;

        if (len == 0)
                return 0;
        if (b->mode == VIRTIO_BLK_READ_ONLY)
                return -EROFS;
        if (b->mode == VIRTIO_BLK_DIRECT)
                return pwrite_full(b->base_fd, buf, len, off);
        r = ensure_overlay(b);
        if (r < 0)
                return r;

        while (off < end) {
                uint64_t blk = off / BLK_BLOCK;
                uint64_t bstart = blk * BLK_BLOCK, bend = MIN(bstart + BLK_BLOCK, b->size);
                uint64_t run_end;

                if (!block_in_overlay(b, blk) && (off != bstart || end < bend)) {
                        /* partial block not in the overlay yet: read-modify-write */
                        uint8_t tmp[BLK_BLOCK];
                        uint64_t chunk = MIN(bend, end) - off;

                        r = pread_exact(block_source(b, blk), tmp, bend - bstart, bstart);
                        if (r < 0)
                                return r;
                        memcpy(tmp + (off - bstart), buf, chunk);
                        r = pwrite_full(b->overlay_fd, tmp, bend - bstart, bstart);
                        if (r < 0)
                                return r;
                        mark_block(b, blk);
                        buf += chunk;
                        off += chunk;
                        continue;
                }

                /* a run of blocks each fully covered or already in the overlay */
                run_end = MIN(bend, end);
                while (run_end < end) {
                        uint64_t nblk = run_end / BLK_BLOCK;
                        uint64_t nend = MIN((nblk + 1) * BLK_BLOCK, b->size);

                        if (!block_in_overlay(b, nblk) && end < nend)
                                break;
                        run_end = MIN(nend, end);
                }
                r = pwrite_full(b->overlay_fd, buf, run_end - off, off);
                if (r < 0)
                        return r;
                for (uint64_t k = blk; k * BLK_BLOCK < run_end; k++)
                        mark_block(b, k);
                buf += run_end - off;
                off = run_end;
        }
        return 0;
}

/* ---- requests --------------------------------------------------------------- */

static bool range_ok(const struct blk *b, uint64_t sector, uint64_t bytes) {
        uint64_t cap = b->size / VIRTIO_BLK_SECTOR_SIZE;

        if (bytes % VIRTIO_BLK_SECTOR_SIZE)
                return false;
        return sector <= cap && bytes / VIRTIO_BLK_SECTOR_SIZE <= cap - sector;
}

/* What a request moves, for disk_rate: its data, not the header or status. */
static uint64_t request_bytes(const struct virtq_chain *c) {
        return (c->out_len > 16 ? c->out_len - 16 : 0) + (c->in_len > 1 ? c->in_len - 1 : 0);
}

/* Runs a request; returns the status, *ret_written = data bytes written to
 * the guest (excluding the status byte). */
static uint8_t blk_do_request(struct blk *b, const struct virtq_chain *c, uint32_t *ret_written) {
        struct iovec iov[VIRTQ_MAX_SIZE];
        uint8_t hdr[16];
        uint32_t type;
        uint64_t sector, off, data_len;
        int n;

        *ret_written = 0;
        if (virtq_chain_read(c, 0, hdr, sizeof hdr) != sizeof hdr)
                return VIRTIO_BLK_S_IOERR;
        memcpy(&type, hdr, 4);
        type = le32toh(type);
        memcpy(&sector, hdr + 8, 8);
        sector = le64toh(sector);

        switch (type) {
        case VIRTIO_BLK_T_IN:
                /* header only readable; data + status writable */
                if (c->out_len != sizeof hdr)
                        return VIRTIO_BLK_S_IOERR;
                data_len = c->in_len - 1;
                if (!range_ok(b, sector, data_len))
                        return VIRTIO_BLK_S_IOERR;
                n = virtq_chain_iov(c, true, 0, data_len, iov, ELEMENTSOF(iov));
                if (n < 0)
                        return VIRTIO_BLK_S_IOERR;
                off = sector * VIRTIO_BLK_SECTOR_SIZE;
                for (int k = 0; k < n; k++) {
                        if (blk_read(b, off, iov[k].iov_base, iov[k].iov_len) < 0)
                                return VIRTIO_BLK_S_IOERR;
                        off += iov[k].iov_len;
                }
                *ret_written = (uint32_t) MIN(data_len, (uint64_t) UINT32_MAX - 1);
                return VIRTIO_BLK_S_OK;

        case VIRTIO_BLK_T_OUT:
                /* header + data readable; only the status writable */
                if (c->in_len != 1)
                        return VIRTIO_BLK_S_IOERR;
                data_len = c->out_len - sizeof hdr;
                if (!range_ok(b, sector, data_len))
                        return VIRTIO_BLK_S_IOERR;
                n = virtq_chain_iov(c, false, sizeof hdr, data_len, iov, ELEMENTSOF(iov));
                if (n < 0)
                        return VIRTIO_BLK_S_IOERR;
                off = sector * VIRTIO_BLK_SECTOR_SIZE;
                for (int k = 0; k < n; k++) {
                        if (blk_write(b, off, iov[k].iov_base, iov[k].iov_len) < 0)
                                return VIRTIO_BLK_S_IOERR;
                        off += iov[k].iov_len;
                }
                return VIRTIO_BLK_S_OK;

        case VIRTIO_BLK_T_FLUSH:
                /* an overlay dies with us: only a direct disk has something to make durable */
                if (b->mode == VIRTIO_BLK_DIRECT && fdatasync(b->base_fd) < 0)
                        return VIRTIO_BLK_S_IOERR;
                return VIRTIO_BLK_S_OK;

        case VIRTIO_BLK_T_GET_ID:
                *ret_written = (uint32_t) virtq_chain_write(c, 0, b->id, MIN((uint64_t) VIRTIO_BLK_ID_BYTES, c->in_len - 1));
                return VIRTIO_BLK_S_OK;

        default:
                return VIRTIO_BLK_S_UNSUPP;
        }
}

/* Count a request that completed with status in the VMM's stats page (vmm-stats.h):
 * the bytes of a read or a write, and one op. */
static void blk_account(struct vmm *vmm, const struct virtq_chain *c, uint8_t status) {
        uint32_t type;

        if (status != VIRTIO_BLK_S_OK || virtq_chain_read(c, 0, &type, sizeof type) != sizeof type)
                return;
        type = le32toh(type);
        if (type == VIRTIO_BLK_T_IN) {
                vmm_stats_add(&vmm->stats->disk_read_bytes, c->in_len - 1);
                vmm_stats_add(&vmm->stats->disk_read_ops, 1);
        } else if (type == VIRTIO_BLK_T_OUT) {
                vmm_stats_add(&vmm->stats->disk_written_bytes, c->out_len - 16);
                vmm_stats_add(&vmm->stats->disk_write_ops, 1);
        }
}

static void blk_notify(struct vmm *vmm, struct virtio_mmio *dev, unsigned q) {
        struct blk *b = virtio_mmio_priv(dev);
        struct virtq *vq = virtio_mmio_queue(dev, 0);
        bool pushed = false;

        if (q != 0 && q != VIRTIO_MMIO_KICK_ALL)
                return;

        for (;;) {
                struct virtq_chain *c = &b->chain;
                uint32_t written = 0;
                int r;

                r = virtq_pop(vmm, vq, c);
                if (r == 0)
                        break;
                if (r < 0) {
                        virtio_mmio_set_needs_reset(vmm, dev);
                        break;
                }
                /* No tokens: the request stays in the ring, the queue waits
                 * for vmm_limits_service() to kick it again. */
                if (!vmm_limits_disk_take(vmm, request_bytes(c))) {
                        virtq_unpop(vq);
                        break;
                }

                if (c->in_len > 0) {
                        uint8_t status = blk_do_request(b, c, &written);
                        blk_account(vmm, c, status);
                        /* the status is the last writable byte */
                        (void) virtq_chain_write(c, c->in_len - 1, &status, 1);
                        written++;
                }
                /* else: nowhere to report a status; do nothing, just complete */

                if (virtq_push(vmm, vq, c->head, written) < 0) {
                        virtio_mmio_set_needs_reset(vmm, dev);
                        break;
                }
                pushed = true;
        }
        if (pushed)
                virtio_mmio_signal_used(vmm, dev, 0);
}

/* ---- save/restore: the device part is the capacity, to catch a swapped disk */

#define BLK_STATE_VERSION 1u

static int blk_save(struct virtio_mmio *dev, uint8_t *buf, size_t cap, size_t *ret_len) {
        struct blk *b = virtio_mmio_priv(dev);
        uint32_t v = htole32(BLK_STATE_VERSION), pad = 0;
        uint64_t sectors = htole64(b->size / VIRTIO_BLK_SECTOR_SIZE);

        if (cap < 16)
                return -ENOBUFS;
        memcpy(buf, &v, 4);
        memcpy(buf + 4, &pad, 4);
        memcpy(buf + 8, &sectors, 8);
        *ret_len = 16;
        return 0;
}

static int blk_restore_check(struct virtio_mmio *dev, const uint8_t *buf, size_t len) {
        struct blk *b = virtio_mmio_priv(dev);
        uint32_t v, pad;
        uint64_t sectors;

        if (len != 16)
                return -EBADMSG;
        memcpy(&v, buf, 4);
        memcpy(&pad, buf + 4, 4);
        memcpy(&sectors, buf + 8, 8);
        if (le32toh(v) != BLK_STATE_VERSION || pad != 0 || le64toh(sectors) != b->size / VIRTIO_BLK_SECTOR_SIZE)
                return -EBADMSG;
        return 0;
}

static const struct virtio_dev_ops blk_ops = {
        .device_id = FORKD_VIRTIO_ID_BLK,
        .notify = blk_notify,
        .save = blk_save,
        .restore_check = blk_restore_check,
        .free = blk_free,
};

/* ---- public ----------------------------------------------------------------- */

static int fd_size(int fd, uint64_t *ret) {
        struct stat st;

        if (fstat(fd, &st) < 0)
                return negative_errno();
        if (S_ISREG(st.st_mode)) {
                *ret = (uint64_t) st.st_size;
                return 0;
        }
        if (S_ISBLK(st.st_mode)) {
                uint64_t sz;
                if (ioctl(fd, BLKGETSIZE64, &sz) < 0)
                        return negative_errno();
                *ret = sz;
                return 0;
        }
        return -EINVAL;
}

int virtio_blk_new(struct vmm *vmm, uint64_t mmio_base, uint32_t gsi, int base_fd, const char *overlay_dir,
                   struct virtio_mmio **ret) {
        return virtio_blk_new_mode(vmm, mmio_base, gsi, base_fd, overlay_dir, VIRTIO_BLK_COPY_ON_WRITE, ret);
}

int virtio_blk_new_mode(struct vmm *vmm, uint64_t mmio_base, uint32_t gsi, int base_fd, const char *overlay_dir,
                        enum virtio_blk_mode mode, struct virtio_mmio **ret) {
        _cleanup_(blk_freep) struct blk *b = NULL;
        uint64_t features = 1ull << VIRTIO_BLK_F_FLUSH_BIT;
        struct virtio_mmio *dev;
        uint8_t config[8];
        uint64_t size, cap_le;
        int r;

        if (!vmm || base_fd < 0 || !ret || (unsigned) mode >= _VIRTIO_BLK_MODE_MAX)
                return -EINVAL;
        if (mode == VIRTIO_BLK_READ_ONLY)
                features |= 1ull << VIRTIO_BLK_F_RO_BIT;
        r = fd_size(base_fd, &size);
        if (r < 0)
                return r;
        size -= size % VIRTIO_BLK_SECTOR_SIZE;

        if (!overlay_dir)
                overlay_dir = secure_getenv("TMPDIR") ?: "/var/tmp";

        b = calloc(1, sizeof *b);
        if (!b)
                return -ENOMEM;
        b->base_fd = -EBADF; /* not ours until success */
        b->overlay_fd = -EBADF;
        b->mode = mode;
        b->size = size;
        b->n_blocks = (size + BLK_BLOCK - 1) / BLK_BLOCK;
        memcpy(b->id, "forkd", 5);
        b->overlay_dir = strdup(overlay_dir);
        if (!b->overlay_dir)
                return -ENOMEM;

        cap_le = htole64(size / VIRTIO_BLK_SECTOR_SIZE);
        memcpy(config, &cap_le, 8);

        r = virtio_mmio_new(vmm, mmio_base, gsi, &blk_ops, features, 1,
                            VIRTIO_BLK_QUEUE_SIZE, config, sizeof config, b, &dev);
        if (r < 0)
                return r;

        b->base_fd = base_fd;
        TAKE_PTR(b);
        *ret = dev;
        return 0;
}

int virtio_blk_set_id(struct virtio_mmio *dev, const char *id) {
        struct blk *b = blk_of(dev);
        size_t l;

        if (!b || !id)
                return -EINVAL;
        l = strlen(id);
        if (l > VIRTIO_BLK_ID_BYTES)
                return -EINVAL;
        memset(b->id, 0, sizeof b->id);
        memcpy(b->id, id, l);
        return 0;
}

uint64_t virtio_blk_capacity(struct virtio_mmio *dev) {
        struct blk *b = blk_of(dev);

        return b ? b->size / VIRTIO_BLK_SECTOR_SIZE : 0;
}

uint64_t virtio_blk_overlay_blocks(struct virtio_mmio *dev) {
        struct blk *b = blk_of(dev);

        return b ? b->n_written : 0;
}

/* copy_file_range() errors that mean "not between these two files": copy by hand */
static bool cfr_unsupported(int err) {
        return err == EXDEV || err == EINVAL || err == ENOSYS || err == EOPNOTSUPP || err == EBADF ||
               err == ETXTBSY || err == EPERM;
}

static bool all_zero(const uint8_t *p, size_t len) {
        for (size_t i = 0; i < len; i++)
                if (p[i])
                        return false;
        return true;
}

/* Copy [off, off+len) from in_fd to the same offset of out_fd. */
static int copy_range(int in_fd, int out_fd, uint64_t off, uint64_t len) {
        _cleanup_free_ uint8_t *buf = NULL;
        bool use_cfr = true;

        while (len > 0) {
                if (use_cfr) {
                        loff_t oi = (loff_t) off, oo = (loff_t) off;
                        ssize_t n = copy_file_range(in_fd, &oi, out_fd, &oo, MIN(len, (uint64_t) 1 << 30), 0);
                        if (n > 0) {
                                off += (uint64_t) n;
                                len -= (uint64_t) n;
                                continue;
                        }
                        if (n == 0)
                                return -EIO;
                        if (errno == EINTR)
                                continue;
                        if (!cfr_unsupported(errno))
                                return negative_errno();
                        use_cfr = false;
                }

                if (!buf) {
                        buf = malloc(EXPORT_CHUNK);
                        if (!buf)
                                return -ENOMEM;
                }
                size_t chunk = MIN(len, (uint64_t) EXPORT_CHUNK);
                int r = pread_exact(in_fd, buf, chunk, off);
                if (r < 0)
                        return r;
                if (!all_zero(buf, chunk)) { /* zeros stay a hole in the truncated output */
                        r = pwrite_full(out_fd, buf, chunk, off);
                        if (r < 0)
                                return r;
                }
                off += chunk;
                len -= chunk;
        }
        return 0;
}

/* Copy the data parts of [off, end) of the base, skipping its holes. */
static int copy_base_range(int base_fd, int out_fd, uint64_t off, uint64_t end) {
        while (off < end) {
                off_t data = lseek(base_fd, (off_t) off, SEEK_DATA), hole;
                if (data < 0) {
                        if (errno == ENXIO)
                                return 0; /* only a hole up to EOF */
                        return copy_range(base_fd, out_fd, off, end - off); /* no SEEK_DATA */
                }
                if ((uint64_t) data >= end)
                        return 0;
                hole = lseek(base_fd, data, SEEK_HOLE);
                if (hole < 0 || (uint64_t) hole <= (uint64_t) data)
                        hole = (off_t) end;
                int r = copy_range(base_fd, out_fd, (uint64_t) data, MIN((uint64_t) hole, end) - (uint64_t) data);
                if (r < 0)
                        return r;
                off = MIN((uint64_t) hole, end);
        }
        return 0;
}

int virtio_blk_export(struct virtio_mmio *dev, int out_fd) {
        struct blk *b = blk_of(dev);
        uint64_t off = 0;

        if (!b || out_fd < 0)
                return -EINVAL;
        if (ftruncate(out_fd, 0) < 0 || ftruncate(out_fd, (off_t) b->size) < 0)
                return negative_errno();

        while (off < b->size) {
                int fd;
                uint64_t run_end = same_source_run(b, off, b->size, &fd);
                int r;

                if (fd != b->base_fd)
                        r = copy_range(fd, out_fd, off, run_end - off);
                else
                        r = copy_base_range(fd, out_fd, off, run_end);
                if (r < 0)
                        return r;
                off = run_end;
        }
        return 0;
}

int virtio_blk_freeze_overlay(struct virtio_mmio *dev) {
        struct blk *b = blk_of(dev);

        if (!b)
                return -EINVAL;
        if (b->overlay_fd < 0)
                return 0; /* never written: nothing to freeze */
        if (b->n_layers >= VIRTIO_BLK_LAYERS_MAX)
                return -E2BIG;
        b->layers[b->n_layers++] = (struct blk_layer) { .fd = b->overlay_fd, .bitmap = b->bitmap };
        b->overlay_fd = -EBADF;
        b->bitmap = NULL;
        b->n_written = 0;
        return 1;
}

unsigned virtio_blk_layers(struct virtio_mmio *dev) {
        struct blk *b = blk_of(dev);

        return b ? b->n_layers : 0;
}

static size_t bitmap_words(const struct blk *b) {
        return b->n_blocks / 64 + 1;
}

int virtio_blk_push_layer(struct virtio_mmio *dev, int fd, int map_fd) {
        struct blk *b = blk_of(dev);
        _cleanup_free_ uint64_t *bitmap = NULL;
        size_t words;
        struct stat st;
        int r;

        if (!b || fd < 0 || map_fd < 0)
                return -EINVAL;
        if (b->n_layers >= VIRTIO_BLK_LAYERS_MAX)
                return -E2BIG;
        if (b->overlay_fd >= 0)
                return -EBUSY; /* layers go under the live overlay, before any write */
        words = bitmap_words(b);
        if (fstat(map_fd, &st) < 0)
                return negative_errno();
        if (!S_ISREG(st.st_mode) || (uint64_t) st.st_size != words * sizeof(uint64_t))
                return -EBADMSG;
        if (fstat(fd, &st) < 0)
                return negative_errno();
        if (!S_ISREG(st.st_mode) || (uint64_t) st.st_size > b->size + BLK_BLOCK)
                return -EBADMSG;
        bitmap = malloc(words * sizeof(uint64_t));
        if (!bitmap)
                return -ENOMEM;
        r = pread_exact(map_fd, bitmap, words * sizeof(uint64_t), 0);
        if (r < 0)
                return r;
        for (size_t i = 0; i < words; i++)
                bitmap[i] = le64toh(bitmap[i]);
        /* No block beyond the disk. */
        if (b->n_blocks % 64)
                bitmap[b->n_blocks / 64] &= (UINT64_C(1) << (b->n_blocks % 64)) - 1;
        else
                bitmap[b->n_blocks / 64] = 0;
        b->layers[b->n_layers++] = (struct blk_layer) { .fd = fd, .bitmap = TAKE_PTR(bitmap) };
        return 0;
}

static virtio_blk_link_refused_t link_refused;

void virtio_blk_on_link_refused(virtio_blk_link_refused_t fn) {
        link_refused = fn;
}

static int link_fd(int fd, int dfd, const char *name) {
        char path[64];
        int r;

        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        if (linkat(AT_FDCWD, path, dfd, name, AT_SYMLINK_FOLLOW) >= 0)
                return 0;
        r = negative_errno();
        /* Not ours to link (fs.protected_hardlinks), or on another mount: maybe the caller's. */
        if ((r == -EPERM || r == -EXDEV) && link_refused)
                return link_refused(fd, dfd, name);
        return r;
}

int virtio_blk_link_layers(struct virtio_mmio *dev, int dfd, const char *disk_name, unsigned *ret_n) {
        struct blk *b = blk_of(dev);
        struct stat st;
        unsigned i;
        int r;

        if (!b || !ret_n)
                return -EINVAL;
        if (b->overlay_fd >= 0)
                return -EBUSY; /* unfrozen writes: export instead */
        if (fstat(b->base_fd, &st) < 0)
                return negative_errno();
        if (!S_ISREG(st.st_mode) || st.st_nlink == 0)
                return -EXDEV;
        r = link_fd(b->base_fd, dfd, disk_name);
        if (r < 0)
                return r;
        for (i = 0; i < b->n_layers; i++) {
                _cleanup_free_ uint64_t *le = NULL;
                _cleanup_close_ int mfd = -EBADF;
                char name[64], map[72];
                size_t words = bitmap_words(b);

                snprintf(name, sizeof(name), "disk.layer.%u", i + 1);
                snprintf(map, sizeof(map), "%s.map", name);
                r = link_fd(b->layers[i].fd, dfd, name);
                if (r < 0)
                        goto fail;
                le = malloc(words * sizeof(uint64_t));
                if (!le) {
                        r = -ENOMEM;
                        goto fail;
                }
                for (size_t k = 0; k < words; k++)
                        le[k] = htole64(b->layers[i].bitmap[k]);
                mfd = openat(dfd, map, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
                if (mfd < 0) {
                        r = negative_errno();
                        goto fail;
                }
                r = pwrite_full(mfd, le, words * sizeof(uint64_t), 0);
                if (r >= 0 && fsync(mfd) < 0)
                        r = negative_errno();
                if (r < 0)
                        goto fail;
        }
        *ret_n = b->n_layers;
        return 0;
fail:
        (void) unlinkat(dfd, disk_name, 0);
        for (unsigned k = 0; k <= i && k < b->n_layers; k++) {
                char name[64], map[72];

                snprintf(name, sizeof(name), "disk.layer.%u", k + 1);
                snprintf(map, sizeof(map), "%s.map", name);
                (void) unlinkat(dfd, name, 0);
                (void) unlinkat(dfd, map, 0);
        }
        return r;
}

int virtio_blk_link_base(struct virtio_mmio *dev, int dfd, const char *name) {
        struct blk *b = blk_of(dev);

        if (!b || !name)
                return -EINVAL;
        return link_fd(b->base_fd, dfd, name);
}

int virtio_blk_open_layers(struct virtio_mmio *dev, int *ret_base_fd, int *layer_fds, int *map_fds,
                           unsigned *ret_n) {
        struct blk *b = blk_of(dev);
        _cleanup_close_ int base = -EBADF;
        unsigned i;
        int r;

        if (!b || !ret_base_fd || !ret_n)
                return -EINVAL;
        if (b->overlay_fd >= 0)
                return -EBUSY;
        base = fcntl(b->base_fd, F_DUPFD_CLOEXEC, 3);
        if (base < 0)
                return negative_errno();
        for (i = 0; i < b->n_layers; i++) {
                size_t words = bitmap_words(b);
                _cleanup_free_ uint64_t *le = malloc(words * sizeof(uint64_t));

                layer_fds[i] = map_fds[i] = -EBADF;
                if (!le) {
                        r = -ENOMEM;
                        goto fail;
                }
                for (size_t k = 0; k < words; k++)
                        le[k] = htole64(b->layers[i].bitmap[k]);
                layer_fds[i] = fcntl(b->layers[i].fd, F_DUPFD_CLOEXEC, 3);
                map_fds[i] = memfd_create("forkd-layer-map", MFD_CLOEXEC);
                if (layer_fds[i] < 0 || map_fds[i] < 0) {
                        r = negative_errno();
                        i++;
                        goto fail;
                }
                r = pwrite_full(map_fds[i], le, words * sizeof(uint64_t), 0);
                if (r < 0) {
                        i++;
                        goto fail;
                }
        }
        *ret_base_fd = TAKE_FD(base);
        *ret_n = b->n_layers;
        return 0;
fail:
        for (unsigned k = 0; k < i; k++) {
                safe_close(layer_fds[k]);
                safe_close(map_fds[k]);
        }
        return r;
}

const char *virtio_blk_overlay_dir(struct virtio_mmio *dev) {
        struct blk *b = blk_of(dev);

        return b ? b->overlay_dir : NULL;
}
