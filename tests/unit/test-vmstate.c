/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * vmstate format tests. The test carries its own builder of the on-disk
 * format, written from the description in vmstate.h rather than from the
 * encoder, so that the encoder is checked against the documentation and so
 * that every kind of corruption can be produced with valid CRCs.
 */

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

#include "crc32c.h"
#include "macro.h"
#include "vmstate.h"

#define MiB (UINT64_C(1) << 20)

static const char *const section_names[_VMSTATE_SEC_MAX] = {
        [VMSTATE_SEC_MEMORY] = "MEMORY",       [VMSTATE_SEC_CPUID] = "CPUID",
        [VMSTATE_SEC_MP_STATE] = "MP_STATE",   [VMSTATE_SEC_REGS] = "REGS",
        [VMSTATE_SEC_SREGS] = "SREGS",         [VMSTATE_SEC_XSAVE] = "XSAVE",
        [VMSTATE_SEC_XCRS] = "XCRS",           [VMSTATE_SEC_DEBUGREGS] = "DEBUGREGS",
        [VMSTATE_SEC_LAPIC] = "LAPIC",         [VMSTATE_SEC_MSRS] = "MSRS",
        [VMSTATE_SEC_EVENTS] = "EVENTS",       [VMSTATE_SEC_PIT] = "PIT",
        [VMSTATE_SEC_CLOCK] = "CLOCK",         [VMSTATE_SEC_PIC_MASTER] = "PIC_MASTER",
        [VMSTATE_SEC_PIC_SLAVE] = "PIC_SLAVE", [VMSTATE_SEC_IOAPIC] = "IOAPIC",
        [VMSTATE_SEC_DEVICE] = "DEVICE",
};

/* ---- helpers ---- */

static void put32(uint8_t *p, uint32_t v) {
        for (int i = 0; i < 4; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v) {
        for (int i = 0; i < 8; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

static uint32_t rng_state = 0x12345678;

static void fill_random(void *p, size_t n) {
        uint8_t *b = p;

        for (size_t i = 0; i < n; i++) {
                rng_state ^= rng_state << 13;
                rng_state ^= rng_state >> 17;
                rng_state ^= rng_state << 5;
                b[i] = (uint8_t) rng_state;
        }
}

/* A vCPU's state, random but for its counts, in a fixed order. */
static void fill_random_vcpu(struct vmstate_vcpu *v, uint32_t n_cpuid, uint32_t n_msrs) {
        v->n_cpuid = n_cpuid;
        fill_random(v->cpuid, n_cpuid * sizeof(v->cpuid[0]));
        fill_random(&v->mp_state, sizeof(v->mp_state));
        fill_random(&v->regs, sizeof(v->regs));
        fill_random(&v->sregs, sizeof(v->sregs));
        fill_random(&v->xsave, sizeof(v->xsave));
        fill_random(&v->xcrs, sizeof(v->xcrs));
        fill_random(&v->debugregs, sizeof(v->debugregs));
        fill_random(&v->lapic, sizeof(v->lapic));
        v->n_msrs = n_msrs;
        fill_random(v->msrs, n_msrs * sizeof(v->msrs[0]));
        fill_random(&v->events, sizeof(v->events));
}

static struct vmstate *make_state(uint32_t n_cpuid, uint32_t n_msrs, uint32_t n_devs, size_t blob_len) {
        struct vmstate *s = calloc(1, sizeof(*s));
        struct vmstate_vcpu *v;

        assert_non_null(s);
        s->memory.mem_size = 512 * MiB;
        s->memory.tsc_khz = 2999999;
        s->memory.generation = 7;

        s->n_vcpus = 1;
        v = &s->vcpus[0];
        fill_random_vcpu(v, n_cpuid, n_msrs);

        fill_random(&s->pit, sizeof(s->pit));
        fill_random(&s->clock, sizeof(s->clock));
        fill_random(&s->pic_master, sizeof(s->pic_master));
        fill_random(&s->pic_slave, sizeof(s->pic_slave));
        fill_random(&s->ioapic, sizeof(s->ioapic));
        s->pic_master.chip_id = KVM_IRQCHIP_PIC_MASTER;
        s->pic_slave.chip_id = KVM_IRQCHIP_PIC_SLAVE;
        s->ioapic.chip_id = KVM_IRQCHIP_IOAPIC;

        s->n_devs = n_devs;
        for (uint32_t i = 0; i < n_devs; i++) {
                s->devs[i].kind = 1 + i % 4;
                s->devs[i].len = (uint32_t) (blob_len ? blob_len : 13 + 100 * i);
                fill_random(s->devs[i].blob, s->devs[i].len);
        }

        return s;
}

/* More vCPUs: each with its own random state, as an SMP guest's differ. */
static struct vmstate *make_smp_state(uint32_t n_vcpus) {
        struct vmstate *s = make_state(5, 10, 3, 0);

        s->n_vcpus = n_vcpus;
        for (uint32_t i = 1; i < n_vcpus; i++) {
                struct vmstate_vcpu *v = &s->vcpus[i];

                fill_random_vcpu(v, 5, 10);
        }
        return s;
}

static struct vmstate *default_state(void) {
        return make_state(5, 10, 3, 0);
}

/* ---- an independent builder of the documented format ---- */

struct tsec {
        uint32_t type, index, len, reserved;
        uint8_t *data;      /* at least len bytes */
        uint8_t pad_byte;   /* value of the padding bytes (0 in a valid file) */
};

struct tbuild {
        struct tsec secs[16 + 10 * VMSTATE_MAX_VCPUS + VMSTATE_MAX_DEVS];
        size_t n;
};

static void tb_add(struct tbuild *b, uint32_t type, uint32_t index, const void *head, size_t head_len,
                   const void *data, size_t len) {
        struct tsec *t;

        assert_true(b->n < ELEMENTSOF(b->secs));
        t = &b->secs[b->n++];
        *t = (struct tsec) { .type = type, .index = index, .len = (uint32_t) (head_len + len) };
        t->data = calloc(1, head_len + len + 1);
        assert_non_null(t->data);
        if (head_len)
                memcpy(t->data, head, head_len);
        if (len)
                memcpy(t->data + head_len, data, len);
}

static void tb_add_counted(struct tbuild *b, uint32_t type, uint32_t index, uint32_t count,
                           const void *data, size_t len) {
        uint8_t head[8] = {};

        put32(head, count);
        tb_add(b, type, index, head, sizeof(head), data, len);
}

static void tb_from_state(struct tbuild *b, const struct vmstate *s) {
        b->n = 0;
        tb_add(b, VMSTATE_SEC_MEMORY, 0, NULL, 0, &s->memory, sizeof(s->memory));
        for (uint32_t i = 0; i < s->n_vcpus; i++) {
                const struct vmstate_vcpu *v = &s->vcpus[i];

                tb_add_counted(b, VMSTATE_SEC_CPUID, i, v->n_cpuid, v->cpuid, v->n_cpuid * sizeof(v->cpuid[0]));
                tb_add(b, VMSTATE_SEC_MP_STATE, i, NULL, 0, &v->mp_state, sizeof(v->mp_state));
                tb_add(b, VMSTATE_SEC_REGS, i, NULL, 0, &v->regs, sizeof(v->regs));
                tb_add(b, VMSTATE_SEC_SREGS, i, NULL, 0, &v->sregs, sizeof(v->sregs));
                tb_add(b, VMSTATE_SEC_XSAVE, i, NULL, 0, &v->xsave, sizeof(v->xsave));
                tb_add(b, VMSTATE_SEC_XCRS, i, NULL, 0, &v->xcrs, sizeof(v->xcrs));
                tb_add(b, VMSTATE_SEC_DEBUGREGS, i, NULL, 0, &v->debugregs, sizeof(v->debugregs));
                tb_add(b, VMSTATE_SEC_LAPIC, i, NULL, 0, &v->lapic, sizeof(v->lapic));
                tb_add_counted(b, VMSTATE_SEC_MSRS, i, v->n_msrs, v->msrs, v->n_msrs * sizeof(v->msrs[0]));
                tb_add(b, VMSTATE_SEC_EVENTS, i, NULL, 0, &v->events, sizeof(v->events));
        }
        tb_add(b, VMSTATE_SEC_PIT, 0, NULL, 0, &s->pit, sizeof(s->pit));
        tb_add(b, VMSTATE_SEC_CLOCK, 0, NULL, 0, &s->clock, sizeof(s->clock));
        tb_add(b, VMSTATE_SEC_PIC_MASTER, 0, NULL, 0, &s->pic_master, sizeof(s->pic_master));
        tb_add(b, VMSTATE_SEC_PIC_SLAVE, 0, NULL, 0, &s->pic_slave, sizeof(s->pic_slave));
        tb_add(b, VMSTATE_SEC_IOAPIC, 0, NULL, 0, &s->ioapic, sizeof(s->ioapic));
        for (uint32_t i = 0; i < s->n_devs; i++)
                tb_add_counted(b, VMSTATE_SEC_DEVICE, i, s->devs[i].kind, s->devs[i].blob, s->devs[i].len);
}

static void tb_default(struct tbuild *b) {
        struct vmstate *s = default_state();

        tb_from_state(b, s);
        free(s);
}

static void tb_free(struct tbuild *b) {
        for (size_t i = 0; i < b->n; i++)
                free(b->secs[i].data);
        b->n = 0;
}

static size_t tb_find(const struct tbuild *b, uint32_t type, uint32_t index) {
        for (size_t i = 0; i < b->n; i++)
                if (b->secs[i].type == type && b->secs[i].index == index)
                        return i;
        fail_msg("section %u/%u not found", type, index);
        return 0;
}

static void tb_remove(struct tbuild *b, size_t pos) {
        free(b->secs[pos].data);
        memmove(&b->secs[pos], &b->secs[pos + 1], (b->n - pos - 1) * sizeof(b->secs[0]));
        b->n--;
}

/* Insert a copy of the section at src before position pos. */
static void tb_insert_copy(struct tbuild *b, size_t pos, size_t src) {
        struct tsec t = b->secs[src];

        assert_true(b->n < ELEMENTSOF(b->secs));
        t.data = malloc(t.len + 1);
        assert_non_null(t.data);
        memcpy(t.data, b->secs[src].data, t.len);
        memmove(&b->secs[pos + 1], &b->secs[pos], (b->n - pos) * sizeof(b->secs[0]));
        b->secs[pos] = t;
        b->n++;
}

/* Move the section at from to position to (after removal). */
static void tb_move(struct tbuild *b, size_t from, size_t to) {
        struct tsec t = b->secs[from];

        memmove(&b->secs[from], &b->secs[from + 1], (b->n - from - 1) * sizeof(b->secs[0]));
        memmove(&b->secs[to + 1], &b->secs[to], (b->n - 1 - to) * sizeof(b->secs[0]));
        b->secs[to] = t;
}

/* Replace the data of the section at pos with len bytes (zero-filled). */
static uint8_t *tb_resize(struct tbuild *b, size_t pos, uint32_t len) {
        struct tsec *t = &b->secs[pos];
        uint8_t *d = calloc(1, (size_t) len + 1);

        assert_non_null(d);
        memcpy(d, t->data, MIN(len, t->len));
        free(t->data);
        t->data = d;
        t->len = len;
        return d;
}

static void fix_crcs(uint8_t *buf) {
        uint64_t payload_len = 0;

        for (int i = 0; i < 8; i++)
                payload_len |= (uint64_t) buf[16 + i] << (8 * i);
        put32(buf + 24, crc32c(buf + 32, payload_len));
        put32(buf + 28, crc32c(buf, 28));
}

static uint8_t *tb_serialize(const struct tbuild *b, size_t *ret_len) {
        size_t len = 32, off;
        uint8_t *buf;

        for (size_t i = 0; i < b->n; i++)
                len += 16 + ALIGN_UP((size_t) b->secs[i].len, (size_t) 8);

        buf = calloc(1, len);
        assert_non_null(buf);
        memcpy(buf, "FKVMSTAT", 8);
        put32(buf + 8, 2);
        put32(buf + 12, 0);
        put64(buf + 16, len - 32);

        off = 32;
        for (size_t i = 0; i < b->n; i++) {
                const struct tsec *t = &b->secs[i];
                size_t padded = ALIGN_UP((size_t) t->len, (size_t) 8);

                put32(buf + off, t->type);
                put32(buf + off + 4, t->index);
                put32(buf + off + 8, t->len);
                put32(buf + off + 12, t->reserved);
                memcpy(buf + off + 16, t->data, t->len);
                memset(buf + off + 16 + t->len, t->pad_byte, padded - t->len);
                off += 16 + padded;
        }

        fix_crcs(buf);
        *ret_len = len;
        return buf;
}

/* ---- decode assertions ---- */

static void assert_decode_fails(const void *buf, size_t len, int expected_r, const char *expected_error) {
        struct vmstate *out, *sentinel;
        const char *error = NULL;
        int r;

        out = malloc(sizeof(*out));
        sentinel = malloc(sizeof(*sentinel));
        assert_non_null(out);
        assert_non_null(sentinel);
        memset(sentinel, 0xa5, sizeof(*sentinel));
        memcpy(out, sentinel, sizeof(*out));

        r = vmstate_decode(buf, len, out, &error);
        if (expected_r != 0)
                assert_int_equal(r, expected_r);
        else
                assert_true(r < 0);
        assert_non_null(error);
        if (expected_error)
                assert_string_equal(error, expected_error);
        /* the output parameter is untouched on failure */
        assert_true(memcmp(out, sentinel, sizeof(*out)) == 0);

        free(out);
        free(sentinel);
}

static void assert_tb_fails(const struct tbuild *b, int expected_r, const char *expected_error) {
        size_t len;
        uint8_t *buf = tb_serialize(b, &len);

        assert_decode_fails(buf, len, expected_r, expected_error);
        free(buf);
}

static void assert_tb_ok(const struct tbuild *b) {
        struct vmstate *out = calloc(1, sizeof(*out));
        const char *error = NULL;
        size_t len;
        uint8_t *buf = tb_serialize(b, &len);
        int r;

        assert_non_null(out);
        r = vmstate_decode(buf, len, out, &error);
        if (r < 0)
                fail_msg("decode failed: %s", error);
        free(buf);
        free(out);
}

/* ---- tests ---- */

static void test_crc32c(void **state) {
        uint8_t buf[32];

        assert_int_equal(crc32c("123456789", 9), 0xE3069283u);
        assert_int_equal(crc32c("", 0), 0);

        /* iSCSI (RFC 3720, B.4) vectors */
        memset(buf, 0, sizeof(buf));
        assert_int_equal(crc32c(buf, sizeof(buf)), 0x8A9136AAu);
        memset(buf, 0xff, sizeof(buf));
        assert_int_equal(crc32c(buf, sizeof(buf)), 0x62A8AB43u);
        for (size_t i = 0; i < sizeof(buf); i++)
                buf[i] = (uint8_t) i;
        assert_int_equal(crc32c(buf, sizeof(buf)), 0x46DD794Eu);

        /* extending in pieces equals one pass */
        for (size_t split = 0; split <= 9; split++)
                assert_int_equal(crc32c_extend(crc32c("123456789", split), "123456789" + split, 9 - split),
                                 0xE3069283u);
}

static void roundtrip(struct vmstate *s) {
        struct vmstate *out = calloc(1, sizeof(*out));
        struct tbuild b = {};
        void *buf = NULL, *buf2 = NULL;
        uint8_t *ref;
        size_t len = 0, len2 = 0, ref_len;
        const char *error = NULL;

        assert_non_null(out);
        assert_int_equal(vmstate_encode(s, &buf, &len), 0);
        assert_non_null(buf);
        assert_true(len >= VMSTATE_HEADER_SIZE);
        assert_true(len % 8 == 0);

        /* byte-for-byte what the documentation describes */
        tb_from_state(&b, s);
        ref = tb_serialize(&b, &ref_len);
        assert_int_equal(len, ref_len);
        assert_memory_equal(buf, ref, len);

        /* deterministic */
        assert_int_equal(vmstate_encode(s, &buf2, &len2), 0);
        assert_int_equal(len, len2);
        assert_memory_equal(buf, buf2, len);

        assert_int_equal(vmstate_decode(buf, len, out, &error), 0);
        assert_true(memcmp(out, s, sizeof(*s)) == 0);

        free(ref);
        tb_free(&b);
        free(buf);
        free(buf2);
        free(out);
}

static void test_roundtrip(void **state) {
        struct vmstate *s = default_state();

        roundtrip(s);
        free(s);
}

static void test_roundtrip_minimal(void **state) {
        struct vmstate *s = make_state(0, 0, 0, 0);

        roundtrip(s);
        free(s);
}

static void test_roundtrip_maximal(void **state) {
        struct vmstate *s = make_state(VMSTATE_MAX_CPUID, VMSTATE_MAX_MSRS, VMSTATE_MAX_DEVS, VMSTATE_DEV_BLOB_MAX);

        roundtrip(s);
        free(s);
}

static void test_roundtrip_smp(void **state) {
        static const uint32_t counts[] = { 2, VMSTATE_MAX_VCPUS };

        for (size_t i = 0; i < ELEMENTSOF(counts); i++) {
                struct vmstate *s = make_smp_state(counts[i]);

                roundtrip(s);
                free(s);
        }
}

/* A version 1 file (one vCPU, written before snapshots had several) still
 * decodes; a version 1 header on a state with two vCPUs is refused. */
static void test_version1(void **state) {
        struct vmstate *s = default_state(), *out = calloc(1, sizeof(*out));
        const char *error = NULL;
        uint8_t *buf;
        size_t len;

        assert_non_null(out);
        assert_int_equal(vmstate_encode(s, (void **) &buf, &len), 0);
        assert_int_equal(buf[8], VMSTATE_VERSION);
        put32(buf + 8, 1);
        fix_crcs(buf);
        assert_int_equal(vmstate_decode(buf, len, out, &error), 0);
        assert_int_equal(out->n_vcpus, 1);
        assert_true(memcmp(out, s, sizeof(*s)) == 0);
        free(buf);
        free(s);

        s = make_smp_state(2);
        assert_int_equal(vmstate_encode(s, (void **) &buf, &len), 0);
        put32(buf + 8, 1);
        fix_crcs(buf);
        assert_decode_fails(buf, len, -EBADMSG, "a version 1 vmstate has exactly one vCPU");
        free(buf);
        free(s);
        free(out);
}

/* The offsets the truncation and byte-flip tests try: every one of the first
 * DENSE_BYTES (the header and the first section), then every 251st. Each
 * decode allocates a whole struct vmstate (room for 32 vCPUs), which under
 * AddressSanitizer costs milliseconds: every offset of a state's tens of
 * kilobytes took minutes there. */
#define DENSE_BYTES 512u
static size_t next_offset(size_t i) {
        return i < DENSE_BYTES ? i + 1 : i + 251;
}

static void test_truncated(void **state) {
        struct vmstate *s = default_state();
        void *buf;
        size_t len;

        assert_int_equal(vmstate_encode(s, &buf, &len), 0);
        for (size_t l = 0; l < len; l = next_offset(l))
                assert_decode_fails(buf, l, -EBADMSG, NULL);

        assert_decode_fails(buf, 0, -EBADMSG, "truncated header");
        assert_decode_fails(buf, VMSTATE_HEADER_SIZE - 1, -EBADMSG, "truncated header");
        assert_decode_fails(buf, len - 1, -EBADMSG, "truncated payload");
        assert_decode_fails(NULL, 0, -EBADMSG, "truncated header");

        free(buf);
        free(s);
}

static void test_header_byte_flips(void **state) {
        static const uint8_t masks[] = { 0x01, 0x10, 0x80, 0xff };
        struct vmstate *s = default_state();
        uint8_t *buf;
        size_t len;

        assert_int_equal(vmstate_encode(s, (void **) &buf, &len), 0);
        for (size_t i = 0; i < VMSTATE_HEADER_SIZE; i++)
                for (size_t m = 0; m < ELEMENTSOF(masks); m++) {
                        buf[i] ^= masks[m];
                        assert_decode_fails(buf, len, -EBADMSG, i < 8 ? "bad magic" : "CRC mismatch in header");
                        buf[i] ^= masks[m];
                }

        free(buf);
        free(s);
}

static void test_payload_byte_flips(void **state) {
        struct vmstate *s = default_state();
        uint8_t *buf;
        size_t len;

        assert_int_equal(vmstate_encode(s, (void **) &buf, &len), 0);
        for (size_t i = VMSTATE_HEADER_SIZE; i < len; i = next_offset(i)) {
                buf[i] ^= 0x01;
                assert_decode_fails(buf, len, -EBADMSG, "CRC mismatch in payload");
                buf[i] ^= 0x01;
        }

        free(buf);
        free(s);
}

static void test_wrong_version(void **state) {
        static const uint32_t versions[] = { 0, 3, 7, UINT32_MAX };
        struct vmstate *s = default_state();
        uint8_t *buf;
        size_t len;

        assert_int_equal(vmstate_encode(s, (void **) &buf, &len), 0);
        for (size_t i = 0; i < ELEMENTSOF(versions); i++) {
                put32(buf + 8, versions[i]);
                fix_crcs(buf);
                assert_decode_fails(buf, len, -EPROTONOSUPPORT, NULL);
        }

        free(buf);
        free(s);
}

static void test_nonzero_flags(void **state) {
        struct vmstate *s = default_state();
        uint8_t *buf;
        size_t len;

        assert_int_equal(vmstate_encode(s, (void **) &buf, &len), 0);
        for (unsigned bit = 0; bit < 32; bit++) {
                put32(buf + 12, 1u << bit);
                fix_crcs(buf);
                assert_decode_fails(buf, len, -EBADMSG, "non-zero flags in header");
        }

        free(buf);
        free(s);
}

static void test_payload_len_mismatch(void **state) {
        struct vmstate *s = default_state();
        uint8_t *buf, *bigger;
        size_t len;

        assert_int_equal(vmstate_encode(s, (void **) &buf, &len), 0);

        /* trailing bytes after the payload the header announces */
        bigger = calloc(1, len + 8);
        assert_non_null(bigger);
        memcpy(bigger, buf, len);
        assert_decode_fails(bigger, len + 8, -EBADMSG, "trailing bytes after payload");

        /* payload_len larger than what is there */
        put64(buf + 16, len - VMSTATE_HEADER_SIZE + 8);
        fix_crcs(buf);
        assert_decode_fails(buf, len, -EBADMSG, "truncated payload");

        put64(buf + 16, UINT64_MAX);
        put32(buf + 28, crc32c(buf, 28));
        assert_decode_fails(buf, len, -EBADMSG, "truncated payload");

        /* a payload whose last 8 bytes are not a whole section header */
        memcpy(bigger, buf, 16);
        put64(bigger + 16, len + 8 - VMSTATE_HEADER_SIZE);
        fix_crcs(bigger);
        assert_decode_fails(bigger, len + 8, -EBADMSG, "truncated section header");

        free(bigger);
        free(buf);
        free(s);
}

static void test_section_past_end(void **state) {
        struct tbuild b = {};
        size_t len;
        uint8_t *buf;

        /* the last section claims 8 more bytes than the file has */
        tb_default(&b);
        buf = tb_serialize(&b, &len);
        put32(buf + len - 16 - ALIGN_UP((size_t) b.secs[b.n - 1].len, (size_t) 8) + 8,
              b.secs[b.n - 1].len + 8);
        fix_crcs(buf);
        assert_decode_fails(buf, len, -EBADMSG, "section runs past end of file");
        free(buf);

        /* the first section claims 4 GiB */
        buf = tb_serialize(&b, &len);
        put32(buf + 32 + 8, UINT32_MAX);
        fix_crcs(buf);
        assert_decode_fails(buf, len, -EBADMSG, "section runs past end of file");
        free(buf);

        tb_free(&b);
}

static void test_wrong_section_size(void **state) {
        char msg[64];

        for (uint32_t t = VMSTATE_SEC_MEMORY; t < _VMSTATE_SEC_MAX; t++) {
                struct tbuild b = {};
                size_t pos;

                if (t == VMSTATE_SEC_CPUID || t == VMSTATE_SEC_MSRS || t == VMSTATE_SEC_DEVICE)
                        continue;

                snprintf(msg, sizeof(msg), "section %s has wrong size", section_names[t]);

                tb_default(&b);
                pos = tb_find(&b, t, 0);
                tb_resize(&b, pos, b.secs[pos].len - MIN(b.secs[pos].len / 2, 8u));
                assert_tb_fails(&b, -EBADMSG, msg);
                tb_resize(&b, pos, b.secs[pos].len + 16);
                assert_tb_fails(&b, -EBADMSG, msg);
                tb_resize(&b, pos, 0);
                assert_tb_fails(&b, -EBADMSG, msg);
                tb_free(&b);
        }
}

static void test_wrong_counted_size(void **state) {
        struct tbuild b = {};
        size_t pos;

        /* count says 5 entries, data holds 4 */
        tb_default(&b);
        pos = tb_find(&b, VMSTATE_SEC_CPUID, 0);
        tb_resize(&b, pos, b.secs[pos].len - sizeof(struct kvm_cpuid_entry2));
        assert_tb_fails(&b, -EBADMSG, "section CPUID has wrong size");
        tb_resize(&b, pos, 4); /* not even the count */
        assert_tb_fails(&b, -EBADMSG, "section CPUID has wrong size");
        tb_free(&b);

        tb_default(&b);
        pos = tb_find(&b, VMSTATE_SEC_MSRS, 0);
        tb_resize(&b, pos, b.secs[pos].len + sizeof(struct kvm_msr_entry));
        assert_tb_fails(&b, -EBADMSG, "section MSRS has wrong size");
        tb_free(&b);

        /* a device section shorter than its kind/pad words */
        tb_default(&b);
        pos = tb_find(&b, VMSTATE_SEC_DEVICE, 0);
        tb_resize(&b, pos, 4);
        assert_tb_fails(&b, -EBADMSG, "section DEVICE has wrong size");
        tb_free(&b);
}

static void test_duplicate_section(void **state) {
        struct tbuild b = {};
        size_t pos;

        tb_default(&b);
        pos = tb_find(&b, VMSTATE_SEC_REGS, 0);
        tb_insert_copy(&b, pos + 1, pos);
        assert_tb_fails(&b, -EBADMSG, "duplicate section REGS");
        tb_free(&b);

        tb_default(&b);
        tb_insert_copy(&b, b.n, 0);
        assert_tb_fails(&b, -EBADMSG, "duplicate section MEMORY");
        tb_free(&b);

        tb_default(&b);
        pos = tb_find(&b, VMSTATE_SEC_IOAPIC, 0);
        tb_insert_copy(&b, pos + 1, pos);
        assert_tb_fails(&b, -EBADMSG, "duplicate section IOAPIC");
        tb_free(&b);

        tb_default(&b);
        pos = tb_find(&b, VMSTATE_SEC_DEVICE, 1);
        tb_insert_copy(&b, pos + 1, pos);
        assert_tb_fails(&b, -EBADMSG, "duplicate section DEVICE");
        tb_free(&b);
}

static void test_missing_section(void **state) {
        struct tbuild b = {};
        char msg[64];

        for (uint32_t t = VMSTATE_SEC_MEMORY; t < _VMSTATE_SEC_MAX; t++) {
                if (t == VMSTATE_SEC_DEVICE)
                        continue;
                snprintf(msg, sizeof(msg), "missing section %s", section_names[t]);
                tb_default(&b);
                tb_remove(&b, tb_find(&b, t, 0));
                assert_tb_fails(&b, -EBADMSG, msg);
                tb_free(&b);
        }

        /* no sections at all */
        assert_tb_fails(&b, -EBADMSG, "missing section MEMORY");

        /* only MEMORY: the vCPU is still mandatory */
        tb_default(&b);
        while (b.n > 1)
                tb_remove(&b, b.n - 1);
        assert_tb_fails(&b, -EBADMSG, "missing section CPUID");
        tb_free(&b);

        /* devices are optional */
        tb_default(&b);
        while (b.secs[b.n - 1].type == VMSTATE_SEC_DEVICE)
                tb_remove(&b, b.n - 1);
        assert_tb_ok(&b);
        tb_free(&b);
}

static void test_out_of_order(void **state) {
        struct tbuild b = {};

        /* SREGS before REGS */
        tb_default(&b);
        tb_move(&b, tb_find(&b, VMSTATE_SEC_SREGS, 0), tb_find(&b, VMSTATE_SEC_REGS, 0));
        assert_tb_fails(&b, -EBADMSG, "sections out of order");
        tb_free(&b);

        /* MEMORY not first */
        tb_default(&b);
        tb_move(&b, 0, 1);
        assert_tb_fails(&b, -EBADMSG, "sections out of order");
        tb_free(&b);

        /* EVENTS before MSRS */
        tb_default(&b);
        tb_move(&b, tb_find(&b, VMSTATE_SEC_MSRS, 0), tb_find(&b, VMSTATE_SEC_EVENTS, 0));
        assert_tb_fails(&b, -EBADMSG, "sections out of order");
        tb_free(&b);

        /* a VM-wide section before the vCPU sections */
        tb_default(&b);
        tb_move(&b, tb_find(&b, VMSTATE_SEC_PIT, 0), 1);
        assert_tb_fails(&b, -EBADMSG, "sections out of order");
        tb_free(&b);

        /* a device before the VM-wide sections */
        tb_default(&b);
        tb_move(&b, tb_find(&b, VMSTATE_SEC_DEVICE, 0), tb_find(&b, VMSTATE_SEC_PIT, 0));
        assert_tb_fails(&b, -EBADMSG, "sections out of order");
        tb_free(&b);

        /* device slots descending */
        tb_default(&b);
        tb_move(&b, tb_find(&b, VMSTATE_SEC_DEVICE, 1), tb_find(&b, VMSTATE_SEC_DEVICE, 0));
        assert_tb_fails(&b, -EBADMSG, NULL);
        tb_free(&b);
}

static void test_unknown_section_type(void **state) {
        static const uint32_t types[] = { 0, _VMSTATE_SEC_MAX, 0x100, UINT32_MAX };
        struct tbuild b = {};

        for (size_t i = 0; i < ELEMENTSOF(types); i++) {
                tb_default(&b);
                tb_insert_copy(&b, 1, 0); /* a 32-byte section ... */
                b.secs[1].type = types[i]; /* ... of an unknown type */
                assert_tb_fails(&b, -EBADMSG, "unknown section type");
                tb_free(&b);
        }
}

static void test_oversized_device_blob(void **state) {
        struct tbuild b = {};
        size_t pos;

        tb_default(&b);
        pos = tb_find(&b, VMSTATE_SEC_DEVICE, 0);
        tb_resize(&b, pos, 8 + VMSTATE_DEV_BLOB_MAX);
        assert_tb_ok(&b); /* exactly the maximum is fine */
        tb_resize(&b, pos, 8 + VMSTATE_DEV_BLOB_MAX + 1);
        assert_tb_fails(&b, -EBADMSG, "device blob too large");
        tb_resize(&b, pos, 8 + 64 * 1024);
        assert_tb_fails(&b, -EBADMSG, "device blob too large");
        tb_free(&b);
}

static void test_count_over_max(void **state) {
        struct tbuild b = {};
        uint8_t *d;
        size_t pos;

        /* CPUID: count and length agree, but the count is over the maximum */
        tb_default(&b);
        pos = tb_find(&b, VMSTATE_SEC_CPUID, 0);
        d = tb_resize(&b, pos, 8 + (VMSTATE_MAX_CPUID + 1) * sizeof(struct kvm_cpuid_entry2));
        put32(d, VMSTATE_MAX_CPUID + 1);
        assert_tb_fails(&b, -EBADMSG, "section CPUID entry count over maximum");
        /* a huge count with a small section */
        put32(d, UINT32_MAX);
        assert_tb_fails(&b, -EBADMSG, "section CPUID entry count over maximum");
        tb_free(&b);

        tb_default(&b);
        pos = tb_find(&b, VMSTATE_SEC_MSRS, 0);
        d = tb_resize(&b, pos, 8 + (VMSTATE_MAX_MSRS + 1) * sizeof(struct kvm_msr_entry));
        put32(d, VMSTATE_MAX_MSRS + 1);
        assert_tb_fails(&b, -EBADMSG, "section MSRS entry count over maximum");
        tb_free(&b);

        /* more devices than slots: index 8 */
        tb_default(&b);
        pos = tb_find(&b, VMSTATE_SEC_DEVICE, 2);
        b.secs[pos].index = VMSTATE_MAX_DEVS;
        assert_tb_fails(&b, -EBADMSG, "device index out of range");
        tb_free(&b);

        /* more vCPUs than supported */
        tb_default(&b);
        pos = tb_find(&b, VMSTATE_SEC_EVENTS, 0);
        tb_insert_copy(&b, pos + 1, tb_find(&b, VMSTATE_SEC_CPUID, 0));
        b.secs[pos + 1].index = VMSTATE_MAX_VCPUS;
        assert_tb_fails(&b, -EBADMSG, "vCPU index out of range");
        tb_free(&b);
}

static void test_reserved_fields(void **state) {
        struct tbuild b = {};
        size_t pos;

        /* section header reserved */
        tb_default(&b);
        b.secs[tb_find(&b, VMSTATE_SEC_LAPIC, 0)].reserved = 1;
        assert_tb_fails(&b, -EBADMSG, "non-zero reserved field in section header");
        tb_free(&b);

        /* padding after a section whose length is not a multiple of 8 */
        tb_default(&b);
        pos = tb_find(&b, VMSTATE_SEC_DEVICE, 0);
        assert_true(b.secs[pos].len % 8 != 0);
        b.secs[pos].pad_byte = 0x01;
        assert_tb_fails(&b, -EBADMSG, "non-zero section padding");
        tb_free(&b);

        /* pad word after a count or device kind */
        tb_default(&b);
        b.secs[tb_find(&b, VMSTATE_SEC_CPUID, 0)].data[4] = 1;
        assert_tb_fails(&b, -EBADMSG, "non-zero padding in section");
        tb_free(&b);
        tb_default(&b);
        b.secs[tb_find(&b, VMSTATE_SEC_DEVICE, 2)].data[7] = 0x80;
        assert_tb_fails(&b, -EBADMSG, "non-zero padding in section");
        tb_free(&b);

        /* MEMORY.reserved */
        tb_default(&b);
        put64(b.secs[0].data + offsetof(struct vmstate_memory, reserved), 1);
        assert_tb_fails(&b, -EBADMSG, "non-zero reserved field in MEMORY");
        tb_free(&b);

        /* VM-wide section with a non-zero index */
        tb_default(&b);
        b.secs[tb_find(&b, VMSTATE_SEC_CLOCK, 0)].index = 1;
        assert_tb_fails(&b, -EBADMSG, "VM-wide section with non-zero index");
        tb_free(&b);
}

static void test_memory_size(void **state) {
        static const uint64_t bad[] = { 0, 4096, 2 * MiB + 4096, 3 * MiB, UINT64_MAX };
        static const uint64_t good[] = { 2 * MiB, 4 * MiB, 3072 * MiB };
        struct tbuild b = {};

        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                tb_default(&b);
                put64(b.secs[0].data + offsetof(struct vmstate_memory, mem_size), bad[i]);
                assert_tb_fails(&b, -EBADMSG, "memory size is not a non-zero multiple of 2 MiB");
                tb_free(&b);
        }
        for (size_t i = 0; i < ELEMENTSOF(good); i++) {
                tb_default(&b);
                put64(b.secs[0].data + offsetof(struct vmstate_memory, mem_size), good[i]);
                assert_tb_ok(&b);
                tb_free(&b);
        }
}

static void test_device_checks(void **state) {
        struct tbuild b = {};

        /* unknown device kind */
        tb_default(&b);
        put32(b.secs[tb_find(&b, VMSTATE_SEC_DEVICE, 0)].data, 0);
        assert_tb_fails(&b, -EBADMSG, "unknown device kind");
        tb_free(&b);
        tb_default(&b);
        put32(b.secs[tb_find(&b, VMSTATE_SEC_DEVICE, 1)].data, 99);
        assert_tb_fails(&b, -EBADMSG, "unknown device kind");
        tb_free(&b);

        /* slots 0, 2: a gap */
        tb_default(&b);
        tb_remove(&b, tb_find(&b, VMSTATE_SEC_DEVICE, 1));
        assert_tb_fails(&b, -EBADMSG, "device slots not contiguous");
        tb_free(&b);

        /* the irqchips carry their chip ids */
        tb_default(&b);
        put32(b.secs[tb_find(&b, VMSTATE_SEC_PIC_SLAVE, 0)].data, KVM_IRQCHIP_IOAPIC);
        assert_tb_fails(&b, -EBADMSG, "section PIC_SLAVE has wrong chip id");
        tb_free(&b);
}

static void test_decode_untouched_and_null_error(void **state) {
        struct vmstate *s = default_state(), *out = malloc(sizeof(*out));
        uint8_t *buf;
        size_t len;

        assert_non_null(out);
        assert_int_equal(vmstate_encode(s, (void **) &buf, &len), 0);
        buf[0] = 'X';

        /* ret_error may be NULL */
        memset(out, 0x5a, sizeof(*out));
        assert_int_equal(vmstate_decode(buf, len, out, NULL), -EBADMSG);
        for (size_t i = 0; i < sizeof(*out); i++)
                assert_int_equal(((uint8_t *) out)[i], 0x5a);

        free(buf);
        free(out);
        free(s);
}

static void test_encode_refuses_invalid(void **state) {
        void *sentinel = (void *) 0x1, *buf = sentinel;
        size_t len = 4242;
        struct vmstate *s;

#define REFUSE(mutation)                                                \
        do {                                                            \
                s = default_state();                                    \
                mutation;                                               \
                assert_int_equal(vmstate_encode(s, &buf, &len), -EINVAL); \
                assert_ptr_equal(buf, sentinel);                        \
                assert_int_equal(len, 4242);                            \
                free(s);                                                \
        } while (0)

        REFUSE(s->n_vcpus = 0);
        REFUSE(s->n_vcpus = VMSTATE_MAX_VCPUS + 1);
        REFUSE(s->vcpus[0].n_cpuid = VMSTATE_MAX_CPUID + 1);
        REFUSE(s->vcpus[0].n_msrs = VMSTATE_MAX_MSRS + 1);
        REFUSE(s->n_devs = VMSTATE_MAX_DEVS + 1);
        REFUSE(s->devs[0].len = VMSTATE_DEV_BLOB_MAX + 1);
        REFUSE(s->devs[1].kind = 0);
        REFUSE(s->memory.mem_size = 0);
        REFUSE(s->memory.mem_size = 3 * MiB);
        REFUSE(s->memory.reserved = 1);
        REFUSE(s->ioapic.chip_id = 0);
#undef REFUSE
}

static char tmpdir[] = "/tmp/test-vmstate.XXXXXX";

static int setup_tmpdir(void **state) {
        return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_tmpdir(void **state) {
        char path[256];

        snprintf(path, sizeof(path), "%s/vmstate", tmpdir);
        (void) unlink(path);
        snprintf(path, sizeof(path), "%s/big", tmpdir);
        (void) unlink(path);
        return rmdir(tmpdir) < 0 ? -1 : 0;
}

static void test_file_roundtrip(void **state) {
        struct vmstate *s = default_state(), *out = calloc(1, sizeof(*out));
        const char *error = NULL;
        char path[256];
        struct stat st;

        assert_non_null(out);
        snprintf(path, sizeof(path), "%s/vmstate", tmpdir);

        assert_int_equal(vmstate_write_file(path, s), 0);
        assert_int_equal(stat(path, &st), 0);
        assert_true(S_ISREG(st.st_mode));
        assert_int_equal(vmstate_read_file(path, out, &error), 0);
        assert_true(memcmp(out, s, sizeof(*s)) == 0);

        /* rewriting truncates: a smaller state must read back exactly */
        free(s);
        s = make_state(0, 0, 0, 0);
        assert_int_equal(vmstate_write_file(path, s), 0);
        assert_int_equal(vmstate_read_file(path, out, &error), 0);
        assert_true(memcmp(out, s, sizeof(*s)) == 0);

        /* writing an invalid state fails */
        s->n_vcpus = 0;
        assert_int_equal(vmstate_write_file(path, s), -EINVAL);

        free(s);
        free(out);
}

static void test_file_errors(void **state) {
        struct vmstate *s = default_state(), *out = malloc(sizeof(*out)), *sentinel = malloc(sizeof(*out));
        const char *error = NULL;
        char path[256];

        assert_non_null(out);
        assert_non_null(sentinel);
        memset(sentinel, 0xa5, sizeof(*sentinel));
        memcpy(out, sentinel, sizeof(*out));

        snprintf(path, sizeof(path), "%s/does-not-exist", tmpdir);
        assert_int_equal(vmstate_read_file(path, out, &error), -ENOENT);
        assert_non_null(error);
        assert_int_equal(vmstate_read_file(tmpdir, out, &error), -EISDIR);
        assert_true(memcmp(out, sentinel, sizeof(*out)) == 0);

        snprintf(path, sizeof(path), "%s/no-such-dir/vmstate", tmpdir);
        assert_int_equal(vmstate_write_file(path, s), -ENOENT);

        free(s);
        free(out);
        free(sentinel);
}

static void test_file_too_large(void **state) {
        struct vmstate *out = malloc(sizeof(*out)), *sentinel = malloc(sizeof(*out));
        struct vmstate *s = default_state();
        const char *error = NULL;
        uint8_t *big;
        void *buf;
        size_t len;
        char path[256];
        int fd;

        assert_non_null(out);
        assert_non_null(sentinel);
        memset(sentinel, 0xa5, sizeof(*sentinel));
        memcpy(out, sentinel, sizeof(*out));

        /* a valid vmstate followed by enough bytes to go over the limit */
        assert_int_equal(vmstate_encode(s, &buf, &len), 0);
        big = calloc(1, VMSTATE_MAX_SIZE + 1);
        assert_non_null(big);
        memcpy(big, buf, len);

        assert_decode_fails(big, VMSTATE_MAX_SIZE + 1, -EMSGSIZE, NULL);
        assert_decode_fails(big, SIZE_MAX, -EMSGSIZE, NULL);
        assert_decode_fails(big, VMSTATE_MAX_SIZE, -EBADMSG, "trailing bytes after payload");

        snprintf(path, sizeof(path), "%s/big", tmpdir);
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, big, VMSTATE_MAX_SIZE + 1), (ssize_t) VMSTATE_MAX_SIZE + 1);
        assert_int_equal(close(fd), 0);
        assert_int_equal(vmstate_read_file(path, out, &error), -EMSGSIZE);
        assert_non_null(error);
        assert_true(memcmp(out, sentinel, sizeof(*out)) == 0);

        /* at the limit it is read, and refused for its content */
        assert_int_equal(truncate(path, VMSTATE_MAX_SIZE), 0);
        assert_int_equal(vmstate_read_file(path, out, &error), -EBADMSG);
        assert_string_equal(error, "trailing bytes after payload");
        assert_true(memcmp(out, sentinel, sizeof(*out)) == 0);

        free(big);
        free(buf);
        free(s);
        free(out);
        free(sentinel);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_crc32c),
                cmocka_unit_test(test_roundtrip),
                cmocka_unit_test(test_roundtrip_minimal),
                cmocka_unit_test(test_roundtrip_maximal),
                cmocka_unit_test(test_roundtrip_smp),
                cmocka_unit_test(test_version1),
                cmocka_unit_test(test_truncated),
                cmocka_unit_test(test_header_byte_flips),
                cmocka_unit_test(test_payload_byte_flips),
                cmocka_unit_test(test_wrong_version),
                cmocka_unit_test(test_nonzero_flags),
                cmocka_unit_test(test_payload_len_mismatch),
                cmocka_unit_test(test_section_past_end),
                cmocka_unit_test(test_wrong_section_size),
                cmocka_unit_test(test_wrong_counted_size),
                cmocka_unit_test(test_duplicate_section),
                cmocka_unit_test(test_missing_section),
                cmocka_unit_test(test_out_of_order),
                cmocka_unit_test(test_unknown_section_type),
                cmocka_unit_test(test_oversized_device_blob),
                cmocka_unit_test(test_count_over_max),
                cmocka_unit_test(test_reserved_fields),
                cmocka_unit_test(test_memory_size),
                cmocka_unit_test(test_device_checks),
                cmocka_unit_test(test_decode_untouched_and_null_error),
                cmocka_unit_test(test_encode_refuses_invalid),
                cmocka_unit_test(test_file_roundtrip),
                cmocka_unit_test(test_file_errors),
                cmocka_unit_test(test_file_too_large),
        };

        return cmocka_run_group_tests(tests, setup_tmpdir, teardown_tmpdir);
}
