/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * virtio-mmio transport, split virtqueues, virtio-blk and virtio-console,
 * driven through the MMIO register callbacks exactly as a guest driver would,
 * against guest RAM that is a plain mmap (no KVM: vm_fd = -1, so
 * vmm_irq_pulse() fails harmlessly and interrupts are observed through
 * InterruptStatus).
 */

#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "bootinfo.h"
#include "virtio-blk.h"
#include "virtio-console.h"
#include "virtio-mmio.h"
#include "vmm.h"
#include "vmstate.h"

#define MEM_SIZE (4u << 20)
#define BLK_BASE FORKD_VIRTIO_MMIO_BASE
#define CON_BASE (FORKD_VIRTIO_MMIO_BASE + FORKD_VIRTIO_MMIO_SIZE)
#define BLK2_BASE (FORKD_VIRTIO_MMIO_BASE + 2 * FORKD_VIRTIO_MMIO_SIZE)
#define CON2_BASE (FORKD_VIRTIO_MMIO_BASE + 3 * FORKD_VIRTIO_MMIO_SIZE)

/* base image: not a multiple of 4 KiB (partial last overlay block) and a tail
 * that is not a whole sector (rounded off) */
#define BASE_FILE_SIZE ((1u << 20) + 3 * 512 + 100)
#define CAP_SECTORS (((1u << 20) + 3 * 512) / 512)
#define DISK_BYTES (CAP_SECTORS * 512u)

#define HDR_GPA    0x80000ull
#define STATUS_GPA 0x80100ull
#define DATA_GPA   0x100000ull  /* up to 1 MiB of data buffers */
#define BIG_GPA    0x200000ull  /* console flood buffers */

static struct vmm *tv;

/* ---- a tiny guest driver ---------------------------------------------------- */

struct gdesc {
        uint64_t addr;
        uint32_t len;
        uint16_t flags;
        uint16_t next;
};

struct gq {
        uint64_t desc, avail, used;
        uint16_t num;
        uint16_t avail_idx;
        uint16_t used_seen;
        uint16_t next;
};

struct gbuf {
        uint64_t gpa;
        uint32_t len;
        bool write;
};

static void *G(uint64_t gpa) {
        return tv->mem + gpa;
}

static struct vmm *test_vmm_new(void) {
        struct vmm *v = calloc(1, sizeof *v);

        assert_non_null(v);
        v->kvm_fd = v->vm_fd = v->vcpu_fd = v->mem_fd = -1;
        v->mem = mmap(NULL, MEM_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        assert_true(v->mem != MAP_FAILED);
        v->mem_size = MEM_SIZE;
        /* as vmm_new(): the devices count in the VMM's own page */
        v->own_stats = (struct vmm_stats) { .magic = VMM_STATS_MAGIC, .version = VMM_STATS_VERSION };
        v->stats = &v->own_stats;
        return v;
}

static void test_vmm_free(struct vmm *v) {
        munmap(v->mem, v->mem_size);
        free(v);
}

static void w32(struct virtio_mmio *d, uint64_t off, uint32_t v) {
        struct mmio_dev *m = virtio_mmio_bus_dev(d);
        m->write(tv, m, off, &v, 4);
}

static uint32_t r32(struct virtio_mmio *d, uint64_t off) {
        struct mmio_dev *m = virtio_mmio_bus_dev(d);
        uint32_t v = 0xdeadbeef;
        m->read(tv, m, off, &v, 4);
        return v;
}

static void gq_init(struct gq *q, unsigned idx, uint16_t num) {
        *q = (struct gq) {
                .desc = 0x10000 + idx * 0x8000ull,
                .num = num,
        };
        q->avail = q->desc + 0x1000;
        q->used = q->desc + 0x2000;
        memset(G(q->desc), 0, 0x8000);
}

static void queue_setup(struct virtio_mmio *d, unsigned idx, struct gq *q) {
        w32(d, VIRTIO_MMIO_QUEUE_SEL, idx);
        assert_int_equal(r32(d, VIRTIO_MMIO_QUEUE_NUM_MAX), 256);
        assert_int_equal(r32(d, VIRTIO_MMIO_QUEUE_READY), 0);
        w32(d, VIRTIO_MMIO_QUEUE_NUM, q->num);
        w32(d, VIRTIO_MMIO_QUEUE_DESC_LOW, (uint32_t) q->desc);
        w32(d, VIRTIO_MMIO_QUEUE_DESC_HIGH, (uint32_t) (q->desc >> 32));
        w32(d, VIRTIO_MMIO_QUEUE_DRIVER_LOW, (uint32_t) q->avail);
        w32(d, VIRTIO_MMIO_QUEUE_DRIVER_HIGH, (uint32_t) (q->avail >> 32));
        w32(d, VIRTIO_MMIO_QUEUE_DEVICE_LOW, (uint32_t) q->used);
        w32(d, VIRTIO_MMIO_QUEUE_DEVICE_HIGH, (uint32_t) (q->used >> 32));
        w32(d, VIRTIO_MMIO_QUEUE_READY, 1);
}

/* Status handshake up to FEATURES_OK (accepting everything offered). */
static void driver_features(struct virtio_mmio *d) {
        uint32_t lo, hi;

        w32(d, VIRTIO_MMIO_STATUS, 0);
        assert_int_equal(r32(d, VIRTIO_MMIO_STATUS), 0);
        w32(d, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE);
        w32(d, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER);
        w32(d, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
        lo = r32(d, VIRTIO_MMIO_DEVICE_FEATURES);
        w32(d, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
        hi = r32(d, VIRTIO_MMIO_DEVICE_FEATURES);
        assert_true(hi & 1); /* VERSION_1 */
        w32(d, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        w32(d, VIRTIO_MMIO_DRIVER_FEATURES, lo);
        w32(d, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        w32(d, VIRTIO_MMIO_DRIVER_FEATURES, hi);
        w32(d, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK);
        assert_true(r32(d, VIRTIO_MMIO_STATUS) & VIRTIO_STATUS_FEATURES_OK);
}

static void driver_ok(struct virtio_mmio *d) {
        w32(d, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK |
                                   VIRTIO_STATUS_DRIVER_OK);
        assert_int_equal(r32(d, VIRTIO_MMIO_STATUS) & 0xff, 0x0f);
}

static void driver_up(struct virtio_mmio *d, struct gq *qs, unsigned nq) {
        driver_features(d);
        for (unsigned i = 0; i < nq; i++) {
                gq_init(&qs[i], i, 256);
                queue_setup(d, i, &qs[i]);
                assert_int_equal(r32(d, VIRTIO_MMIO_QUEUE_READY), 1);
        }
        driver_ok(d);
}

static struct gdesc *gq_desc(struct gq *q, uint16_t i) {
        return (struct gdesc *) G(q->desc + 16ull * i);
}

static void gq_publish(struct gq *q, uint16_t head) {
        uint16_t *ring = (uint16_t *) G(q->avail + 4);

        ring[q->avail_idx % q->num] = head;
        __atomic_store_n((uint16_t *) G(q->avail + 2), ++q->avail_idx, __ATOMIC_RELEASE);
}

static uint16_t gq_add(struct gq *q, const struct gbuf *b, unsigned n) {
        uint16_t head = q->next;

        for (unsigned i = 0; i < n; i++) {
                uint16_t k = (uint16_t) ((head + i) % q->num);
                *gq_desc(q, k) = (struct gdesc) {
                        .addr = b[i].gpa,
                        .len = b[i].len,
                        .flags = (uint16_t) ((b[i].write ? 2 : 0) | (i + 1 < n ? 1 : 0)),
                        .next = (uint16_t) ((k + 1) % q->num),
                };
        }
        q->next = (uint16_t) ((head + n) % q->num);
        gq_publish(q, head);
        return head;
}

static uint16_t gq_used_idx(struct gq *q) {
        return __atomic_load_n((uint16_t *) G(q->used + 2), __ATOMIC_ACQUIRE);
}

static bool gq_get_used(struct gq *q, uint32_t *ret_id, uint32_t *ret_len) {
        uint32_t *e;

        if (gq_used_idx(q) == q->used_seen)
                return false;
        e = (uint32_t *) G(q->used + 4 + 8ull * (q->used_seen % q->num));
        *ret_id = e[0];
        *ret_len = e[1];
        q->used_seen++;
        return true;
}

static bool needs_reset(struct virtio_mmio *d) {
        return r32(d, VIRTIO_MMIO_STATUS) & VIRTIO_STATUS_DEVICE_NEEDS_RESET;
}

/* ---- virtio-blk fixture ----------------------------------------------------- */

struct blk_fx {
        char dir[64];
        char base_path[96];
        int base_fd;
        struct virtio_mmio *dev;
        struct gq q;
        uint8_t *expect; /* what the disk must contain */
};

static uint8_t pattern(uint64_t o) {
        return (uint8_t) (o * 7 + (o / 4096) * 13 + 1);
}

static int blk_setup(void **state) {
        struct blk_fx *f = calloc(1, sizeof *f);
        _cleanup_free_ uint8_t *buf = malloc(BASE_FILE_SIZE);
        int fd;

        assert_non_null(f);
        assert_non_null(buf);
        tv = test_vmm_new();

        strcpy(f->dir, "/tmp/test-virtqueue-XXXXXX");
        assert_non_null(mkdtemp(f->dir));
        snprintf(f->base_path, sizeof f->base_path, "%s/base.img", f->dir);
        for (uint64_t o = 0; o < BASE_FILE_SIZE; o++)
                buf[o] = pattern(o);
        fd = open(f->base_path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, buf, BASE_FILE_SIZE), BASE_FILE_SIZE);
        close(fd);

        f->expect = malloc(DISK_BYTES);
        assert_non_null(f->expect);
        memcpy(f->expect, buf, DISK_BYTES);

        f->base_fd = open(f->base_path, O_RDONLY | O_CLOEXEC);
        assert_true(f->base_fd >= 0);
        assert_int_equal(virtio_blk_new(tv, BLK_BASE, 5, f->base_fd, f->dir, &f->dev), 0);
        *state = f;
        return 0;
}

static int blk_teardown(void **state) {
        struct blk_fx *f = *state;
        char path[160];

        virtio_mmio_free(f->dev);
        free(f->expect);
        unlink(f->base_path);
        snprintf(path, sizeof path, "%s/export.img", f->dir);
        unlink(path);
        assert_int_equal(rmdir(f->dir), 0); /* the overlay left nothing behind */
        test_vmm_free(tv);
        tv = NULL;
        free(f);
        return 0;
}

/* Submit one request (header, optional data, status) and run it. Returns the
 * status byte, or -1 if the device did not complete the chain. */
static int blk_req_ex(struct blk_fx *f, uint32_t type, uint64_t sector, const struct gbuf *data, unsigned n_data,
                      uint32_t *ret_used_len) {
        struct gbuf b[8];
        unsigned n = 0;
        uint32_t id, len;
        uint16_t head;

        memcpy(G(HDR_GPA), &type, 4);
        memset(G(HDR_GPA + 4), 0, 4);
        memcpy(G(HDR_GPA + 8), &sector, 8);
        *(uint8_t *) G(STATUS_GPA) = 0xee;

        b[n++] = (struct gbuf) { HDR_GPA, 16, false };
        for (unsigned i = 0; i < n_data; i++)
                b[n++] = data[i];
        b[n++] = (struct gbuf) { STATUS_GPA, 1, true };
        head = gq_add(&f->q, b, n);
        w32(f->dev, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        if (!gq_get_used(&f->q, &id, &len))
                return -1;
        assert_int_equal(id, head);
        if (ret_used_len)
                *ret_used_len = len;
        return *(uint8_t *) G(STATUS_GPA);
}

static int blk_req(struct blk_fx *f, uint32_t type, uint64_t sector, uint32_t len, bool data_write) {
        struct gbuf d = { DATA_GPA, len, data_write };
        return blk_req_ex(f, type, sector, &d, len ? 1 : 0, NULL);
}

static void blk_write_bytes(struct blk_fx *f, uint64_t sector, uint32_t nsec, uint8_t seed) {
        uint8_t *p = G(DATA_GPA);

        for (uint32_t i = 0; i < nsec * 512; i++)
                p[i] = (uint8_t) (seed + i * 3);
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_OUT, sector, nsec * 512, false), VIRTIO_BLK_S_OK);
        memcpy(f->expect + sector * 512, p, nsec * 512);
}

static void blk_check_all(struct blk_fx *f) {
        for (uint32_t s = 0; s < CAP_SECTORS; s += 128) {
                uint32_t n = MIN(128u, CAP_SECTORS - s);
                memset(G(DATA_GPA), 0xaa, n * 512);
                assert_int_equal(blk_req(f, VIRTIO_BLK_T_IN, s, n * 512, true), VIRTIO_BLK_S_OK);
                assert_memory_equal(G(DATA_GPA), f->expect + s * 512ull, n * 512);
        }
}

/* ---- tests: transport ------------------------------------------------------- */

static void test_mmio_registers(void **state) {
        struct blk_fx *f = *state;
        struct mmio_dev *m = virtio_mmio_bus_dev(f->dev);
        uint64_t cap = 0;
        uint8_t b8[8];
        uint16_t v16;

        assert_int_equal(m->base, BLK_BASE);
        assert_int_equal(m->size, FORKD_VIRTIO_MMIO_SIZE);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_MAGIC_VALUE), 0x74726976);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_VERSION), 2);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_DEVICE_ID), FORKD_VIRTIO_ID_BLK);
        assert_int_not_equal(r32(f->dev, VIRTIO_MMIO_VENDOR_ID), 0);
        w32(f->dev, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_DEVICE_FEATURES), 1u << VIRTIO_BLK_F_FLUSH_BIT);
        w32(f->dev, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_DEVICE_FEATURES), 1); /* VERSION_1, no INDIRECT/EVENT_IDX */
        w32(f->dev, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 2);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_DEVICE_FEATURES), 0);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_QUEUE_NUM_MAX), 256);
        w32(f->dev, VIRTIO_MMIO_QUEUE_SEL, 1); /* blk has one queue */
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_QUEUE_NUM_MAX), 0);
        w32(f->dev, VIRTIO_MMIO_QUEUE_SEL, 0);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_CONFIG_GENERATION), 0);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_SHM_LEN_LOW), UINT32_MAX);

        /* config: capacity as one u64 and as two u32 */
        m->read(tv, m, VIRTIO_MMIO_CONFIG, &cap, 8);
        assert_int_equal(cap, CAP_SECTORS);
        assert_int_equal(virtio_blk_capacity(f->dev), CAP_SECTORS);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_CONFIG), CAP_SECTORS);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_CONFIG + 4), 0);
        /* config past the end, odd sizes: zeros */
        memset(b8, 0x55, sizeof b8);
        m->read(tv, m, VIRTIO_MMIO_CONFIG + 4, b8, 8);
        assert_memory_equal(b8, "\0\0\0\0\0\0\0\0", 8);
        memset(b8, 0x55, sizeof b8);
        m->read(tv, m, VIRTIO_MMIO_CONFIG, b8, 3);
        assert_memory_equal(b8, "\0\0\0", 3);
        memset(b8, 0x55, sizeof b8);
        m->read(tv, m, 0xff0, b8, 8);
        assert_memory_equal(b8, "\0\0\0\0\0\0\0\0", 8);
        m->read(tv, m, UINT64_MAX - 3, b8, 4); /* hostile offset */
        assert_memory_equal(b8, "\0\0\0\0", 4);
        /* config writes ignored */
        cap = 1;
        m->write(tv, m, VIRTIO_MMIO_CONFIG, &cap, 8);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_CONFIG), CAP_SECTORS);

        /* non-32-bit or unaligned register accesses are ignored */
        w32(f->dev, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE);
        v16 = 0xff;
        m->write(tv, m, VIRTIO_MMIO_STATUS, &v16, 2);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_STATUS), VIRTIO_STATUS_ACKNOWLEDGE);
        m->write(tv, m, VIRTIO_MMIO_STATUS + 1, &cap, 4);
        m->write(tv, m, VIRTIO_MMIO_STATUS, &cap, 8);
        m->write(tv, m, 0x7f0, &cap, 4);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_STATUS), VIRTIO_STATUS_ACKNOWLEDGE);
        v16 = 0x1234;
        m->read(tv, m, VIRTIO_MMIO_MAGIC_VALUE, &v16, 2);
        assert_int_equal(v16, 0);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_MAGIC_VALUE + 2), 0);
        assert_int_equal(r32(f->dev, 0x0e0), 0); /* unknown */

        /* FEATURES_OK refused without VERSION_1 ... */
        w32(f->dev, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER);
        w32(f->dev, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        w32(f->dev, VIRTIO_MMIO_DRIVER_FEATURES, 1u << VIRTIO_BLK_F_FLUSH_BIT);
        w32(f->dev, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK);
        assert_false(r32(f->dev, VIRTIO_MMIO_STATUS) & VIRTIO_STATUS_FEATURES_OK);
        /* ... and with a feature not offered (INDIRECT_DESC, bit 28) */
        w32(f->dev, VIRTIO_MMIO_DRIVER_FEATURES, (1u << VIRTIO_BLK_F_FLUSH_BIT) | (1u << 28));
        w32(f->dev, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        w32(f->dev, VIRTIO_MMIO_DRIVER_FEATURES, 1);
        w32(f->dev, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK);
        assert_false(r32(f->dev, VIRTIO_MMIO_STATUS) & VIRTIO_STATUS_FEATURES_OK);
        /* accepted features are frozen after FEATURES_OK */
        w32(f->dev, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        w32(f->dev, VIRTIO_MMIO_DRIVER_FEATURES, 1u << VIRTIO_BLK_F_FLUSH_BIT);
        w32(f->dev, VIRTIO_MMIO_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK);
        assert_true(r32(f->dev, VIRTIO_MMIO_STATUS) & VIRTIO_STATUS_FEATURES_OK);

        /* reset on 0 clears status, queue state, ISR */
        gq_init(&f->q, 0, 16);
        queue_setup(f->dev, 0, &f->q);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_QUEUE_READY), 1);
        w32(f->dev, VIRTIO_MMIO_STATUS, 0);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_STATUS), 0);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_QUEUE_READY), 0);

        /* full bring-up, one request, then ISR bit 0 and ACK */
        driver_up(f->dev, &f->q, 1);
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_FLUSH, 0, 0, false), VIRTIO_BLK_S_OK);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_INTERRUPT_STATUS), VIRTIO_MMIO_INT_VRING);
        w32(f->dev, VIRTIO_MMIO_INTERRUPT_ACK, VIRTIO_MMIO_INT_VRING);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_INTERRUPT_STATUS), 0);
        /* NO_INTERRUPT suppresses the interrupt but not the completion */
        *(uint16_t *) G(f->q.avail) = 1;
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_FLUSH, 0, 0, false), VIRTIO_BLK_S_OK);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_INTERRUPT_STATUS), 0);
        *(uint16_t *) G(f->q.avail) = 0;

        /* notify for a queue that does not exist, queue regs of a bad QueueSel */
        w32(f->dev, VIRTIO_MMIO_QUEUE_NOTIFY, 7);
        w32(f->dev, VIRTIO_MMIO_QUEUE_SEL, 1000);
        w32(f->dev, VIRTIO_MMIO_QUEUE_READY, 1);
        w32(f->dev, VIRTIO_MMIO_QUEUE_NUM, 3);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_QUEUE_READY), 0);
        assert_false(needs_reset(f->dev));
        /* queue registers of a ready queue are ignored */
        w32(f->dev, VIRTIO_MMIO_QUEUE_SEL, 0);
        w32(f->dev, VIRTIO_MMIO_QUEUE_DESC_LOW, 0xfffff000);
        w32(f->dev, VIRTIO_MMIO_QUEUE_NUM, 3);
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_FLUSH, 0, 0, false), VIRTIO_BLK_S_OK);
}

/* ---- tests: virtio-blk ------------------------------------------------------ */

static void test_blk_roundtrip(void **state) {
        struct blk_fx *f = *state;
        _cleanup_free_ uint8_t *img = malloc(BASE_FILE_SIZE);
        char path[160];
        struct stat st;
        int fd;

        driver_up(f->dev, &f->q, 1);

        /* reads before any write: base content, no overlay */
        blk_check_all(f);
        assert_int_equal(virtio_blk_overlay_blocks(f->dev), 0);

        blk_write_bytes(f, 8, 8, 1);       /* one full, aligned block */
        blk_write_bytes(f, 17, 1, 2);      /* one sector inside a block: RMW */
        blk_write_bytes(f, 30, 6, 3);      /* two partial blocks */
        blk_write_bytes(f, 101, 40, 4);    /* partial head, full middle, partial tail */
        blk_write_bytes(f, CAP_SECTORS - 2, 2, 5); /* inside the short last block */
        blk_write_bytes(f, 17, 1, 6);      /* rewrite a block already in the overlay */
        assert_int_equal(virtio_blk_overlay_blocks(f->dev), 1 + 1 + 2 + 6 + 1);
        /* the stats page: six writes of 8 + 1 + 6 + 40 + 2 + 1 sectors */
        assert_int_equal(tv->stats->disk_write_ops, 6);
        assert_int_equal(tv->stats->disk_written_bytes, 58 * 512);
        blk_check_all(f);

        /* a read whose data is spread over odd-sized descriptors */
        {
                uint64_t ops = tv->stats->disk_read_ops, bytes = tv->stats->disk_read_bytes;
                struct gbuf d[3] = {
                        { DATA_GPA, 100, true },
                        { DATA_GPA + 0x10000, 412, true },
                        { DATA_GPA + 0x20000, 1024, true },
                };
                uint32_t used = 0;
                assert_int_equal(blk_req_ex(f, VIRTIO_BLK_T_IN, 16, d, 3, &used), VIRTIO_BLK_S_OK);
                assert_int_equal(used, 1536 + 1);
                assert_memory_equal(G(DATA_GPA), f->expect + 16 * 512, 100);
                assert_memory_equal(G(DATA_GPA + 0x10000), f->expect + 16 * 512 + 100, 412);
                assert_memory_equal(G(DATA_GPA + 0x20000), f->expect + 17 * 512, 1024);
                assert_int_equal(tv->stats->disk_read_ops, ops + 1);
                assert_int_equal(tv->stats->disk_read_bytes, bytes + 1536);
        }

        /* the base file never changed */
        assert_int_equal(pread(f->base_fd, img, BASE_FILE_SIZE, 0), BASE_FILE_SIZE);
        for (uint64_t o = 0; o < BASE_FILE_SIZE; o++)
                if (img[o] != pattern(o))
                        fail_msg("base image modified at %" PRIu64, o);

        /* export = base + overlay */
        snprintf(path, sizeof path, "%s/export.img", f->dir);
        fd = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, "garbage-longer-than-nothing", 27), 27);
        assert_int_equal(virtio_blk_export(f->dev, fd), 0);
        assert_int_equal(fstat(fd, &st), 0);
        assert_int_equal(st.st_size, DISK_BYTES);
        assert_int_equal(pread(fd, img, DISK_BYTES, 0), DISK_BYTES);
        assert_memory_equal(img, f->expect, DISK_BYTES);
        close(fd);
}

static void test_blk_export_untouched(void **state) {
        struct blk_fx *f = *state;
        _cleanup_free_ uint8_t *img = malloc(DISK_BYTES);
        char path[160];
        int fd;

        snprintf(path, sizeof path, "%s/export.img", f->dir);
        fd = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_int_equal(virtio_blk_export(f->dev, fd), 0);
        assert_int_equal(pread(fd, img, DISK_BYTES, 0), DISK_BYTES);
        assert_memory_equal(img, f->expect, DISK_BYTES);
        close(fd);
        assert_int_equal(virtio_blk_overlay_blocks(f->dev), 0);
}

static void test_blk_errors(void **state) {
        struct blk_fx *f = *state;
        uint32_t used = 0;

        driver_up(f->dev, &f->q, 1);

        memset(G(DATA_GPA), 0x11, 4096);
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_IN, CAP_SECTORS, 512, true), VIRTIO_BLK_S_IOERR);
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_IN, CAP_SECTORS - 1, 1024, true), VIRTIO_BLK_S_IOERR);
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_IN, UINT64_MAX, 512, true), VIRTIO_BLK_S_IOERR);
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_IN, UINT64_MAX / 512 + 1, 512, true), VIRTIO_BLK_S_IOERR);
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_OUT, CAP_SECTORS, 512, false), VIRTIO_BLK_S_IOERR);
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_OUT, CAP_SECTORS - 1, 1024, false), VIRTIO_BLK_S_IOERR);
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_OUT, 0, 100, false), VIRTIO_BLK_S_IOERR); /* not a sector multiple */
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_IN, CAP_SECTORS - 1, 512, true), VIRTIO_BLK_S_OK); /* last sector */
        assert_int_equal(virtio_blk_overlay_blocks(f->dev), 0);

        /* wrong direction: T_IN into a device-readable buffer is refused
         * and the buffer is not touched */
        memset(G(DATA_GPA), 0x11, 512);
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_IN, 0, 512, false), VIRTIO_BLK_S_IOERR);
        for (int i = 0; i < 512; i++)
                assert_int_equal(((uint8_t *) G(DATA_GPA))[i], 0x11);
        /* T_OUT from a device-writable buffer: refused, nothing written */
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_OUT, 0, 512, true), VIRTIO_BLK_S_IOERR);
        assert_int_equal(virtio_blk_overlay_blocks(f->dev), 0);

        assert_int_equal(blk_req(f, VIRTIO_BLK_T_FLUSH, 0, 0, false), VIRTIO_BLK_S_OK);
        assert_int_equal(blk_req(f, 99, 0, 512, true), VIRTIO_BLK_S_UNSUPP);
        assert_int_equal(blk_req(f, 11 /* WRITE_ZEROES */, 0, 16, false), VIRTIO_BLK_S_UNSUPP);

        memset(G(DATA_GPA), 0x11, 20);
        {
                struct gbuf d = { DATA_GPA, 20, true };
                assert_int_equal(blk_req_ex(f, VIRTIO_BLK_T_GET_ID, 0, &d, 1, &used), VIRTIO_BLK_S_OK);
        }
        assert_int_equal(used, 21);
        assert_memory_equal(G(DATA_GPA), "forkd\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 20);
        assert_int_equal(virtio_blk_set_id(f->dev, "serial-0123456789abc"), 0);
        assert_int_equal(virtio_blk_set_id(f->dev, "serial-0123456789abcd"), -EINVAL);
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_GET_ID, 0, 20, true), VIRTIO_BLK_S_OK);
        assert_memory_equal(G(DATA_GPA), "serial-0123456789abc", 20);

        /* a short header: IOERR, still a status */
        {
                struct gbuf b[2] = { { HDR_GPA, 8, false }, { STATUS_GPA, 1, true } };
                uint32_t id, len;
                *(uint8_t *) G(STATUS_GPA) = 0xee;
                gq_add(&f->q, b, 2);
                w32(f->dev, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
                assert_true(gq_get_used(&f->q, &id, &len));
                assert_int_equal(*(uint8_t *) G(STATUS_GPA), VIRTIO_BLK_S_IOERR);
        }
        /* no writable byte at all: completed, nothing done, nothing written */
        {
                uint32_t type = VIRTIO_BLK_T_OUT, id, len = 99;
                uint64_t sector = 0;
                struct gbuf b[2] = { { HDR_GPA, 16, false }, { DATA_GPA, 512, false } };
                memcpy(G(HDR_GPA), &type, 4);
                memcpy(G(HDR_GPA + 8), &sector, 8);
                gq_add(&f->q, b, 2);
                w32(f->dev, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
                assert_true(gq_get_used(&f->q, &id, &len));
                assert_int_equal(len, 0);
                assert_int_equal(virtio_blk_overlay_blocks(f->dev), 0);
        }
        assert_false(needs_reset(f->dev));
}

/* ---- tests: hostile rings --------------------------------------------------- */

/* Put a hand-made chain on the avail ring, notify, and expect the device to
 * give up: NEEDS_RESET, config interrupt, nothing on the used ring. Then a
 * reset and a fresh bring-up must work again. */
static void expect_broken(struct blk_fx *f) {
        w32(f->dev, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        assert_true(needs_reset(f->dev));
        assert_true(r32(f->dev, VIRTIO_MMIO_INTERRUPT_STATUS) & VIRTIO_MMIO_INT_CONFIG);
        assert_int_equal(gq_used_idx(&f->q), f->q.used_seen);
        /* no more work until reset */
        w32(f->dev, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        assert_int_equal(gq_used_idx(&f->q), f->q.used_seen);

        driver_up(f->dev, &f->q, 1);
        assert_false(needs_reset(f->dev));
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_INTERRUPT_STATUS), 0);
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_IN, 0, 512, true), VIRTIO_BLK_S_OK);
}

static void set_req_hdr(uint32_t type) {
        uint64_t sector = 0;
        memcpy(G(HDR_GPA), &type, 4);
        memset(G(HDR_GPA + 4), 0, 4);
        memcpy(G(HDR_GPA + 8), &sector, 8);
}

static void test_hostile_descriptors(void **state) {
        struct blk_fx *f = *state;

        driver_up(f->dev, &f->q, 1);
        set_req_hdr(VIRTIO_BLK_T_IN);

        /* head index out of range */
        gq_publish(&f->q, 256);
        expect_broken(f);
        gq_publish(&f->q, 0xffff);
        expect_broken(f);

        /* next index out of range */
        *gq_desc(&f->q, 0) = (struct gdesc) { HDR_GPA, 16, 1, 300 };
        gq_publish(&f->q, 0);
        expect_broken(f);

        /* a loop: 0 -> 1 -> 0 */
        *gq_desc(&f->q, 0) = (struct gdesc) { HDR_GPA, 16, 1, 1 };
        *gq_desc(&f->q, 1) = (struct gdesc) { DATA_GPA, 512, 1 | 2, 0 };
        gq_publish(&f->q, 0);
        expect_broken(f);
        /* a loop of readable descriptors (direction checks cannot catch it) */
        *gq_desc(&f->q, 0) = (struct gdesc) { HDR_GPA, 16, 1, 1 };
        *gq_desc(&f->q, 1) = (struct gdesc) { DATA_GPA, 512, 1, 2 };
        *gq_desc(&f->q, 2) = (struct gdesc) { DATA_GPA, 512, 1, 0 };
        gq_publish(&f->q, 0);
        expect_broken(f);
        /* a self loop */
        *gq_desc(&f->q, 5) = (struct gdesc) { STATUS_GPA, 1, 1 | 2, 5 };
        gq_publish(&f->q, 5);
        expect_broken(f);

        /* buffers outside guest RAM, straddling its end, overflowing */
        *gq_desc(&f->q, 0) = (struct gdesc) { HDR_GPA, 16, 1, 1 };
        *gq_desc(&f->q, 1) = (struct gdesc) { MEM_SIZE - 8, 16, 2, 0 };
        gq_publish(&f->q, 0);
        expect_broken(f);
        *gq_desc(&f->q, 0) = (struct gdesc) { HDR_GPA, 16, 1, 1 };
        *gq_desc(&f->q, 1) = (struct gdesc) { 0xfffffffffffffe00ull, 0x400, 2, 0 };
        gq_publish(&f->q, 0);
        expect_broken(f);
        *gq_desc(&f->q, 0) = (struct gdesc) { 1ull << 40, 16, 0, 0 };
        gq_publish(&f->q, 0);
        expect_broken(f);

        /* readable after writable */
        *gq_desc(&f->q, 0) = (struct gdesc) { HDR_GPA, 16, 1, 1 };
        *gq_desc(&f->q, 1) = (struct gdesc) { STATUS_GPA, 1, 1 | 2, 2 };
        *gq_desc(&f->q, 2) = (struct gdesc) { DATA_GPA, 512, 0, 0 };
        gq_publish(&f->q, 0);
        expect_broken(f);

        /* indirect descriptor (not offered) */
        *gq_desc(&f->q, 0) = (struct gdesc) { DATA_GPA, 64, 4, 0 };
        gq_publish(&f->q, 0);
        expect_broken(f);

        /* avail idx jumping more than num ahead */
        __atomic_store_n((uint16_t *) G(f->q.avail + 2), (uint16_t) (f->q.avail_idx + 257), __ATOMIC_RELEASE);
        expect_broken(f);
        __atomic_store_n((uint16_t *) G(f->q.avail + 2), (uint16_t) (f->q.avail_idx - 1), __ATOMIC_RELEASE);
        expect_broken(f);

        /* ring memory vanishing while ready (RAM shrunk under a restored queue) */
        tv->mem_size = 0x10000;
        gq_publish(&f->q, 0);
        w32(f->dev, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        tv->mem_size = MEM_SIZE;
        assert_true(needs_reset(f->dev));
        driver_up(f->dev, &f->q, 1);
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_IN, 0, 512, true), VIRTIO_BLK_S_OK);
}

static void expect_queue_refused(struct blk_fx *f) {
        w32(f->dev, VIRTIO_MMIO_QUEUE_READY, 1);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_QUEUE_READY), 0);
        assert_true(needs_reset(f->dev));
        w32(f->dev, VIRTIO_MMIO_STATUS, 0);
}

static void queue_regs(struct blk_fx *f, uint32_t num, uint64_t desc, uint64_t avail, uint64_t used) {
        driver_features(f->dev);
        w32(f->dev, VIRTIO_MMIO_QUEUE_SEL, 0);
        w32(f->dev, VIRTIO_MMIO_QUEUE_NUM, num);
        w32(f->dev, VIRTIO_MMIO_QUEUE_DESC_LOW, (uint32_t) desc);
        w32(f->dev, VIRTIO_MMIO_QUEUE_DESC_HIGH, (uint32_t) (desc >> 32));
        w32(f->dev, VIRTIO_MMIO_QUEUE_DRIVER_LOW, (uint32_t) avail);
        w32(f->dev, VIRTIO_MMIO_QUEUE_DRIVER_HIGH, (uint32_t) (avail >> 32));
        w32(f->dev, VIRTIO_MMIO_QUEUE_DEVICE_LOW, (uint32_t) used);
        w32(f->dev, VIRTIO_MMIO_QUEUE_DEVICE_HIGH, (uint32_t) (used >> 32));
}

static void test_hostile_queue_setup(void **state) {
        struct blk_fx *f = *state;
        const uint64_t D = 0x10000, A = 0x11000, U = 0x12000;

        queue_regs(f, 100, D, A, U);  /* not a power of two */
        expect_queue_refused(f);
        queue_regs(f, 512, D, A, U);  /* bigger than QueueNumMax */
        expect_queue_refused(f);
        queue_regs(f, 0, D, A, U);
        expect_queue_refused(f);
        queue_regs(f, 0x10100, D, A, U); /* 256 in the low 16 bits */
        expect_queue_refused(f);

        queue_regs(f, 256, MEM_SIZE - 16, A, U); /* desc table runs out of RAM */
        expect_queue_refused(f);
        queue_regs(f, 256, D, MEM_SIZE - 6, U);
        expect_queue_refused(f);
        queue_regs(f, 256, D, A, MEM_SIZE - 8);
        expect_queue_refused(f);
        queue_regs(f, 256, D, A, 1ull << 32);
        expect_queue_refused(f);
        queue_regs(f, 256, 0xfffffffffffff000ull, A, U); /* overflow */
        expect_queue_refused(f);
        queue_regs(f, 256, D + 8, A, U);  /* misaligned */
        expect_queue_refused(f);
        queue_regs(f, 256, D, A + 1, U);
        expect_queue_refused(f);
        queue_regs(f, 256, D, A, U + 2);
        expect_queue_refused(f);

        /* and a good one still works */
        queue_regs(f, 256, D, A, U);
        w32(f->dev, VIRTIO_MMIO_QUEUE_READY, 1);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_QUEUE_READY), 1);
        assert_false(needs_reset(f->dev));
        /* a tiny queue: ring indices and descriptors wrap many times */
        w32(f->dev, VIRTIO_MMIO_STATUS, 0);
        driver_features(f->dev);
        gq_init(&f->q, 0, 4);
        queue_setup(f->dev, 0, &f->q);
        driver_ok(f->dev);
        for (int i = 0; i < 20; i++)
                assert_int_equal(blk_req(f, VIRTIO_BLK_T_IN, 0, 512, true), VIRTIO_BLK_S_OK);
}

/* ---- tests: virtio-console -------------------------------------------------- */

struct con_fx {
        struct virtio_mmio *dev;
        struct gq q[2];
        int peer;
};

static int con_setup(void **state) {
        struct con_fx *f = calloc(1, sizeof *f);
        int sv[2];

        assert_non_null(f);
        tv = test_vmm_new();
        assert_int_equal(virtio_console_new(tv, CON_BASE, 6, &f->dev), 0);
        assert_int_equal(r32(f->dev, VIRTIO_MMIO_DEVICE_ID), FORKD_VIRTIO_ID_CONSOLE);
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        assert_int_equal(virtio_console_set_host_fd(f->dev, sv[0]), 0);
        assert_int_equal(virtio_console_host_fd(f->dev), sv[0]);
        assert_true(fcntl(sv[0], F_GETFL) & O_NONBLOCK);
        f->peer = sv[1];
        assert_int_equal(fcntl(f->peer, F_SETFL, O_NONBLOCK), 0);
        driver_up(f->dev, f->q, 2);
        *state = f;
        return 0;
}

static int con_teardown(void **state) {
        struct con_fx *f = *state;

        virtio_mmio_free(f->dev); /* closes the host fd */
        if (f->peer >= 0)
                close(f->peer);
        test_vmm_free(tv);
        tv = NULL;
        free(f);
        return 0;
}

static uint16_t post_rx(struct con_fx *f, uint64_t gpa, uint32_t len) {
        struct gbuf b = { gpa, len, true };
        uint16_t head = gq_add(&f->q[0], &b, 1);
        w32(f->dev, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        return head;
}

static uint16_t post_tx(struct con_fx *f, uint64_t gpa, uint32_t len) {
        struct gbuf b = { gpa, len, false };
        uint16_t head = gq_add(&f->q[1], &b, 1);
        w32(f->dev, VIRTIO_MMIO_QUEUE_NOTIFY, 1);
        return head;
}

static void test_console_rx(void **state) {
        struct con_fx *f = *state;
        uint32_t id, len;
        uint16_t h1, h2;

        /* no buffers posted: do not poll for input */
        assert_int_equal(virtio_console_poll_events(f->dev), 0);
        assert_int_equal(write(f->peer, "hello", 5), 5);
        virtio_console_process(tv, f->dev);
        assert_false(gq_get_used(&f->q[0], &id, &len));

        h1 = post_rx(f, 0x300000, 3);
        h2 = post_rx(f, 0x301000, 64);
        assert_true(gq_get_used(&f->q[0], &id, &len));
        assert_int_equal(id, h1);
        assert_int_equal(len, 3);
        assert_memory_equal(G(0x300000), "hel", 3);
        assert_true(gq_get_used(&f->q[0], &id, &len));
        assert_int_equal(id, h2);
        assert_int_equal(len, 2);
        assert_memory_equal(G(0x301000), "lo", 2);
        assert_true(r32(f->dev, VIRTIO_MMIO_INTERRUPT_STATUS) & VIRTIO_MMIO_INT_VRING);

        /* buffer posted, nothing to read: wait for POLLIN */
        post_rx(f, 0x302000, 64);
        assert_false(gq_get_used(&f->q[0], &id, &len));
        assert_int_equal(virtio_console_poll_events(f->dev), POLLIN);
        assert_int_equal(write(f->peer, "world", 5), 5);
        virtio_console_process(tv, f->dev);
        assert_true(gq_get_used(&f->q[0], &id, &len));
        assert_int_equal(len, 5);
        assert_memory_equal(G(0x302000), "world", 5);
        assert_int_equal(virtio_console_poll_events(f->dev), 0);
}

static void test_console_inject(void **state) {
        struct con_fx *f = *state;
        static uint8_t big[VIRTIO_CONSOLE_INJECT_MAX + 1];
        char got[64] = {};
        size_t got_len = 0;
        uint32_t id, len;

        assert_int_equal(write(f->peer, "HOST", 4), 4);
        assert_int_equal(virtio_console_inject(tv, f->dev, "ID:", 3), 0);
        assert_int_equal(virtio_console_inject(tv, f->dev, "42|", 3), 0);
        assert_int_equal(virtio_console_inject_pending(f->dev), 6);
        assert_int_equal(virtio_console_inject(tv, f->dev, big, sizeof big - 6), -ENOBUFS);
        assert_int_equal(virtio_console_inject_pending(f->dev), 6);

        /* small buffers: the injected bytes are split but still go first */
        for (int i = 0; i < 6; i++)
                post_rx(f, 0x300000 + 0x100 * i, 4);
        while (gq_get_used(&f->q[0], &id, &len)) {
                memcpy(got + got_len, G(0x300000 + 0x100 * id), len);
                got_len += len;
        }
        assert_int_equal(got_len, 10);
        assert_memory_equal(got, "ID:42|HOST", 10);
        assert_int_equal(virtio_console_inject_pending(f->dev), 0);

        /* the limit is on pending bytes */
        assert_int_equal(virtio_console_inject(tv, f->dev, big, VIRTIO_CONSOLE_INJECT_MAX), 0);
        /* 3 buffers of 4 bytes were still posted */
        assert_int_equal(virtio_console_inject_pending(f->dev), VIRTIO_CONSOLE_INJECT_MAX - 12);
        assert_int_equal(virtio_console_inject(tv, f->dev, big, 13), -ENOBUFS);
        assert_int_equal(virtio_console_inject(tv, f->dev, big, 12), 0);
        assert_int_equal(virtio_console_inject(tv, f->dev, big, 1), -ENOBUFS);
}

static void test_console_tx(void **state) {
        struct con_fx *f = *state;
        uint32_t id, len;
        char buf[16];
        uint16_t h;

        memcpy(G(0x300000), "ping", 4);
        h = post_tx(f, 0x300000, 4);
        assert_true(gq_get_used(&f->q[1], &id, &len));
        assert_int_equal(id, h);
        assert_int_equal(len, 0);
        assert_int_equal(read(f->peer, buf, sizeof buf), 4);
        assert_memory_equal(buf, "ping", 4);
        assert_int_equal(virtio_console_backlog(f->dev), 0);

        /* a chain of several readable buffers */
        {
                struct gbuf b[3] = { { 0x300000, 2, false }, { 0x300010, 3, false }, { 0x300020, 1, false } };
                memcpy(G(0x300010), "abc", 3);
                memcpy(G(0x300020), "!", 1);
                gq_add(&f->q[1], b, 3);
                w32(f->dev, VIRTIO_MMIO_QUEUE_NOTIFY, 1);
                assert_true(gq_get_used(&f->q[1], &id, &len));
                assert_int_equal(read(f->peer, buf, sizeof buf), 6);
                assert_memory_equal(buf, "piabc!", 6);
        }
}

static void test_console_backlog(void **state) {
        struct con_fx *f = *state;
        const unsigned n_chains = 24, chunk = 64 * 1024;
        _cleanup_free_ uint8_t *rx = malloc((size_t) n_chains * chunk);
        size_t got = 0;
        uint32_t id, len;
        unsigned done = 0;
        int small = 4096;

        assert_non_null(rx);
        assert_int_equal(setsockopt(virtio_console_host_fd(f->dev), SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
        for (unsigned i = 0; i < n_chains * chunk; i++)
                ((uint8_t *) G(BIG_GPA))[i] = (uint8_t) (i * 31 + i / chunk);

        /* the peer never reads: the device must stop at the backlog bound */
        for (unsigned i = 0; i < n_chains; i++)
                post_tx(f, BIG_GPA + (uint64_t) i * chunk, chunk);
        while (gq_get_used(&f->q[1], &id, &len))
                done++;
        assert_true(done < n_chains);
        assert_true(virtio_console_backlog(f->dev) <= VIRTIO_CONSOLE_BACKLOG_MAX);
        assert_true(virtio_console_backlog(f->dev) > 0);
        assert_true(virtio_console_poll_events(f->dev) & POLLOUT);
        /* more notifies do not grow it */
        for (int i = 0; i < 10; i++)
                w32(f->dev, VIRTIO_MMIO_QUEUE_NOTIFY, 1);
        assert_true(virtio_console_backlog(f->dev) <= VIRTIO_CONSOLE_BACKLOG_MAX);

        /* now the peer drains: every byte arrives, in order */
        for (int rounds = 0; rounds < 100000 && got < (size_t) n_chains * chunk; rounds++) {
                ssize_t n = read(f->peer, rx + got, (size_t) n_chains * chunk - got);
                if (n > 0)
                        got += (size_t) n;
                virtio_console_process(tv, f->dev);
        }
        assert_int_equal(got, (size_t) n_chains * chunk);
        assert_memory_equal(rx, G(BIG_GPA), got);
        while (gq_get_used(&f->q[1], &id, &len))
                done++;
        assert_int_equal(done, n_chains);
        assert_int_equal(virtio_console_backlog(f->dev), 0);
        assert_false(virtio_console_poll_events(f->dev) & POLLOUT);
}

static void test_console_eof(void **state) {
        struct con_fx *f = *state;
        uint32_t id, len;

        assert_int_equal(write(f->peer, "bye", 3), 3);
        close(f->peer);
        f->peer = -1;

        post_rx(f, 0x300000, 64);
        post_rx(f, 0x301000, 64);
        /* the bytes before EOF arrive, then reading stops */
        assert_true(gq_get_used(&f->q[0], &id, &len));
        assert_int_equal(len, 3);
        assert_false(gq_get_used(&f->q[0], &id, &len));
        assert_int_equal(virtio_console_poll_events(f->dev), 0);
        virtio_console_process(tv, f->dev);
        assert_false(gq_get_used(&f->q[0], &id, &len));

        /* guest output is dropped, not stuck, and no SIGPIPE */
        for (int i = 0; i < 4; i++) {
                memcpy(G(0x310000), "lost", 4);
                post_tx(f, 0x310000, 4);
                assert_true(gq_get_used(&f->q[1], &id, &len));
        }
        assert_int_equal(virtio_console_backlog(f->dev), 0);
        assert_false(needs_reset(f->dev));

        /* injected bytes still reach the guest */
        assert_int_equal(virtio_console_inject(tv, f->dev, "new", 3), 0);
        assert_true(gq_get_used(&f->q[0], &id, &len));
        assert_int_equal(len, 3);

        /* a new connection revives the channel */
        {
                int sv[2];
                assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
                assert_int_equal(virtio_console_set_host_fd(f->dev, sv[0]), 0);
                f->peer = sv[1];
                assert_int_equal(virtio_console_poll_events(f->dev), 0); /* no buffers left */
                post_rx(f, 0x302000, 64);
                assert_int_equal(virtio_console_poll_events(f->dev), POLLIN);
                assert_int_equal(write(f->peer, "again", 5), 5);
                virtio_console_process(tv, f->dev);
                assert_true(gq_get_used(&f->q[0], &id, &len));
                assert_int_equal(len, 5);
        }
        assert_int_equal(virtio_console_set_host_fd(f->dev, -1), 0);
        assert_int_equal(virtio_console_host_fd(f->dev), -1);
        assert_int_equal(virtio_console_poll_events(f->dev), 0);
        assert_int_equal(virtio_console_set_host_fd(f->dev, 9999), -EBADF);
}

static void test_console_hostile(void **state) {
        struct con_fx *f = *state;
        uint32_t id, len;

        /* a receive buffer with nothing writable is returned empty */
        {
                struct gbuf b = { 0x300000, 8, false };
                memcpy(G(0x300000), "keepkeep", 8);
                assert_int_equal(write(f->peer, "x", 1), 1);
                gq_add(&f->q[0], &b, 1);
                w32(f->dev, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
                assert_true(gq_get_used(&f->q[0], &id, &len));
                assert_int_equal(len, 0);
                assert_memory_equal(G(0x300000), "keepkeep", 8);
        }
        /* a broken tx ring: NEEDS_RESET, nothing sent, host side untouched */
        gq_publish(&f->q[1], 999);
        w32(f->dev, VIRTIO_MMIO_QUEUE_NOTIFY, 1);
        assert_true(needs_reset(f->dev));
        assert_int_equal(virtio_console_poll_events(f->dev), 0); /* device inactive: no rx */
        {
                char c;
                assert_int_equal(read(f->peer, &c, 1), -1);
        }
}

/* ---- tests: save / restore -------------------------------------------------- */

static void put_u32(uint8_t *b, size_t off, uint32_t v) {
        memcpy(b + off, &v, 4);
}

static void put_u64(uint8_t *b, size_t off, uint64_t v) {
        memcpy(b + off, &v, 8);
}

static void test_save_restore(void **state) {
        struct blk_fx *f = *state;
        struct virtio_mmio *dev2 = NULL, *con = NULL;
        uint8_t blob[VMSTATE_DEV_BLOB_MAX], blob2[VMSTATE_DEV_BLOB_MAX], bad[VMSTATE_DEV_BLOB_MAX],
                before[VMSTATE_DEV_BLOB_MAX], after[VMSTATE_DEV_BLOB_MAX], cblob[VMSTATE_DEV_BLOB_MAX];
        size_t len = 0, len2 = 0, blen = 0, alen = 0, clen = 0;
        int base2;

        assert_true(VIRTIO_MMIO_STATE_MAX <= VMSTATE_DEV_BLOB_MAX);
        driver_up(f->dev, &f->q, 1);
        blk_write_bytes(f, 3, 2, 9);
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_IN, 0, 4096, true), VIRTIO_BLK_S_OK);
        w32(f->dev, VIRTIO_MMIO_QUEUE_SEL, 0);

        assert_int_equal(virtio_mmio_save(f->dev, blob, 10, &len), -ENOBUFS);
        assert_int_equal(len, 0);
        assert_int_equal(virtio_mmio_save(f->dev, blob, sizeof blob, &len), 0);
        assert_true(len > 0 && len <= VIRTIO_MMIO_STATE_MAX);

        /* a second device on a fresh "process": same disk */
        base2 = open(f->base_path, O_RDONLY | O_CLOEXEC);
        assert_true(base2 >= 0);
        assert_int_equal(virtio_blk_new(tv, BLK2_BASE, 7, base2, f->dir, &dev2), 0);
        assert_int_equal(virtio_console_new(tv, CON2_BASE, 8, &con), 0);
        assert_int_equal(virtio_mmio_save(con, cblob, sizeof cblob, &clen), 0);

        /* invalid blobs: each refused, target unchanged */
        assert_int_equal(virtio_mmio_save(dev2, before, sizeof before, &blen), 0);
        struct {
                const char *what;
                size_t off;
                int width; /* 0: truncate/extend to off */
                uint64_t val;
        } cases[] = {
                { "truncated", 20, 0, 0 },
                { "header only", 48, 0, 0 },
                { "empty", 0, 0, 0 },
                { "one byte more", 1, -1, 0 },
                { "magic", 0, 4, 0x12345678 },
                { "version", 4, 2, 2 },
                { "n_queues", 6, 2, 2 },
                { "device id", 8, 4, FORKD_VIRTIO_ID_CONSOLE },
                { "status bits", 12, 4, 0x10f },
                { "isr bits", 16, 4, 4 },
                { "features not offered", 32, 8, (1ull << 32) | (1ull << 28) },
                { "features without VERSION_1", 32, 8, 1ull << 9 },
                { "dev len", 44, 4, 1000 },
                { "num not pow2", 48, 4, 100 },
                { "num too big", 48, 4, 512 },
                { "num zero", 48, 4, 0 },
                { "indices apart", 52, 2, 300 },
                { "desc out of RAM", 56, 8, MEM_SIZE - 16 },
                { "desc overflow", 56, 8, UINT64_MAX - 15 },
                { "avail out of RAM", 64, 8, MEM_SIZE },
                { "used misaligned", 72, 8, 0x12002 },
                { "queue flags", 80, 4, 4 },
                { "queue reserved", 84, 4, 1 },
                { "blk version", 88, 4, 2 },
                { "blk capacity", 96, 8, CAP_SECTORS + 1 },
        };
        assert_int_equal(len, 48 + 40 + 16);
        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                size_t blen2 = len;

                memcpy(bad, blob, len);
                if (cases[i].width == 0)
                        blen2 = cases[i].off;
                else if (cases[i].width == -1)
                        bad[blen2++] = 0;
                else if (cases[i].width == 2) {
                        uint16_t v = (uint16_t) cases[i].val;
                        memcpy(bad + cases[i].off, &v, 2);
                } else if (cases[i].width == 4)
                        put_u32(bad, cases[i].off, (uint32_t) cases[i].val);
                else
                        put_u64(bad, cases[i].off, cases[i].val);

                if (virtio_mmio_restore(tv, dev2, bad, blen2) != -EBADMSG)
                        fail_msg("blob with bad %s accepted", cases[i].what);
                assert_int_equal(virtio_mmio_save(dev2, after, sizeof after, &alen), 0);
                assert_int_equal(alen, blen);
                assert_memory_equal(after, before, blen);
        }
        /* a console blob into a blk device and vice versa */
        assert_int_equal(virtio_mmio_restore(tv, dev2, cblob, clen), -EBADMSG);
        assert_int_equal(virtio_mmio_restore(tv, con, blob, len), -EBADMSG);

        /* the real thing */
        assert_int_equal(virtio_mmio_restore(tv, dev2, blob, len), 0);
        assert_int_equal(virtio_mmio_save(dev2, blob2, sizeof blob2, &len2), 0);
        assert_int_equal(len2, len);
        assert_memory_equal(blob2, blob, len);
        assert_int_equal(r32(dev2, VIRTIO_MMIO_STATUS), r32(f->dev, VIRTIO_MMIO_STATUS));
        assert_int_equal(r32(dev2, VIRTIO_MMIO_QUEUE_READY), 1);

        /* the restored device continues the same rings (its overlay starts
         * empty: in real life the disk is the exported image) */
        virtio_mmio_free(f->dev);
        f->dev = TAKE_PTR(dev2);
        assert_int_equal(blk_req(f, VIRTIO_BLK_T_IN, 0, 1024, true), VIRTIO_BLK_S_OK);
        assert_memory_equal(G(DATA_GPA), f->expect, 1024);
        assert_false(needs_reset(f->dev));

        virtio_mmio_free(con);
}

static void test_console_save_restore(void **state) {
        struct con_fx *f = *state;
        struct virtio_mmio *c2 = NULL;
        uint8_t blob[VMSTATE_DEV_BLOB_MAX], blob2[VMSTATE_DEV_BLOB_MAX];
        size_t len = 0, len2 = 0;
        uint32_t id, len_used;
        int sv[2];

        /* a tx chain stuck behind a host that does not read is saved as not popped */
        memcpy(G(0x300000), "abc", 3);
        post_tx(f, 0x300000, 3);
        assert_true(gq_get_used(&f->q[1], &id, &len_used));
        post_rx(f, 0x301000, 16);

        assert_int_equal(virtio_mmio_save(f->dev, blob, sizeof blob, &len), 0);
        assert_int_equal(virtio_console_new(tv, CON2_BASE, 9, &c2), 0);
        assert_int_equal(virtio_mmio_restore(tv, c2, blob, len), 0);
        assert_int_equal(virtio_mmio_save(c2, blob2, sizeof blob2, &len2), 0);
        assert_int_equal(len2, len);
        assert_memory_equal(blob2, blob, len);

        /* the restored device is a new connection: injected identity first */
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        assert_int_equal(virtio_console_set_host_fd(c2, sv[0]), 0);
        assert_int_equal(write(sv[1], "host", 4), 4);
        virtio_mmio_free(f->dev);
        f->dev = c2;
        assert_int_equal(virtio_console_inject(tv, f->dev, "IDENT", 5), 0);
        assert_true(gq_get_used(&f->q[0], &id, &len_used));
        assert_int_equal(len_used, 5);
        assert_memory_equal(G(0x301000), "IDENT", 5);
        post_rx(f, 0x302000, 16);
        assert_true(gq_get_used(&f->q[0], &id, &len_used));
        assert_int_equal(len_used, 4);
        assert_memory_equal(G(0x302000), "host", 4);
        close(f->peer);
        f->peer = sv[1];
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_mmio_registers, blk_setup, blk_teardown),
                cmocka_unit_test_setup_teardown(test_blk_roundtrip, blk_setup, blk_teardown),
                cmocka_unit_test_setup_teardown(test_blk_export_untouched, blk_setup, blk_teardown),
                cmocka_unit_test_setup_teardown(test_blk_errors, blk_setup, blk_teardown),
                cmocka_unit_test_setup_teardown(test_hostile_descriptors, blk_setup, blk_teardown),
                cmocka_unit_test_setup_teardown(test_hostile_queue_setup, blk_setup, blk_teardown),
                cmocka_unit_test_setup_teardown(test_save_restore, blk_setup, blk_teardown),
                cmocka_unit_test_setup_teardown(test_console_rx, con_setup, con_teardown),
                cmocka_unit_test_setup_teardown(test_console_inject, con_setup, con_teardown),
                cmocka_unit_test_setup_teardown(test_console_tx, con_setup, con_teardown),
                cmocka_unit_test_setup_teardown(test_console_backlog, con_setup, con_teardown),
                cmocka_unit_test_setup_teardown(test_console_eof, con_setup, con_teardown),
                cmocka_unit_test_setup_teardown(test_console_hostile, con_setup, con_teardown),
                cmocka_unit_test_setup_teardown(test_console_save_restore, con_setup, con_teardown),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
