/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "macro.h"
#include "io-util.h"
#include "vmstate.h"

#define SECTION_HEADER_SIZE 16
#define COUNT_HEADER_SIZE 8 /* u32 count/kind, u32 pad in CPUID, MSRS, DEVICE */
#define MEM_ALIGN (UINT64_C(2) << 20)

_Static_assert(sizeof(VMSTATE_MAGIC) - 1 == 8, "magic is 8 bytes");
_Static_assert(sizeof(struct vmstate_memory) == 32, "vmstate_memory layout");
_Static_assert(sizeof(struct kvm_xsave) == 4096, "kvm_xsave is 4096 bytes");

/* Where a section sits in the restore order: MEMORY, then per vCPU, then
 * VM-wide, then devices. */
enum section_group {
        GROUP_MEMORY,
        GROUP_VCPU,
        GROUP_VM,
        GROUP_DEVICE,
};

struct section_info {
        const char *name;
        enum section_group group;
        size_t size;        /* exact data size; 0 for variable-sized sections */
        size_t entry_size;  /* CPUID, MSRS: size of one entry */
        uint32_t max_count; /* CPUID, MSRS: most entries allowed */
        const char *wrong_size, *missing, *duplicate, *count_over_max;
};

#define SEC(id, grp, sz, esz, maxc)                                     \
        [VMSTATE_SEC_##id] = {                                          \
                .name = #id,                                            \
                .group = grp,                                           \
                .size = sz,                                             \
                .entry_size = esz,                                      \
                .max_count = maxc,                                      \
                .wrong_size = "section " #id " has wrong size",         \
                .missing = "missing section " #id,                      \
                .duplicate = "duplicate section " #id,                  \
                .count_over_max = "section " #id " entry count over maximum", \
        }

static const struct section_info sections[_VMSTATE_SEC_MAX] = {
        SEC(MEMORY, GROUP_MEMORY, sizeof(struct vmstate_memory), 0, 0),
        SEC(CPUID, GROUP_VCPU, 0, sizeof(struct kvm_cpuid_entry2), VMSTATE_MAX_CPUID),
        SEC(MP_STATE, GROUP_VCPU, sizeof(struct kvm_mp_state), 0, 0),
        SEC(REGS, GROUP_VCPU, sizeof(struct kvm_regs), 0, 0),
        SEC(SREGS, GROUP_VCPU, sizeof(struct kvm_sregs), 0, 0),
        SEC(XSAVE, GROUP_VCPU, sizeof(struct kvm_xsave), 0, 0),
        SEC(XCRS, GROUP_VCPU, sizeof(struct kvm_xcrs), 0, 0),
        SEC(DEBUGREGS, GROUP_VCPU, sizeof(struct kvm_debugregs), 0, 0),
        SEC(LAPIC, GROUP_VCPU, sizeof(struct kvm_lapic_state), 0, 0),
        SEC(MSRS, GROUP_VCPU, 0, sizeof(struct kvm_msr_entry), VMSTATE_MAX_MSRS),
        SEC(EVENTS, GROUP_VCPU, sizeof(struct kvm_vcpu_events), 0, 0),
        SEC(PIT, GROUP_VM, sizeof(struct kvm_pit_state2), 0, 0),
        SEC(CLOCK, GROUP_VM, sizeof(struct kvm_clock_data), 0, 0),
        SEC(PIC_MASTER, GROUP_VM, sizeof(struct kvm_irqchip), 0, 0),
        SEC(PIC_SLAVE, GROUP_VM, sizeof(struct kvm_irqchip), 0, 0),
        SEC(IOAPIC, GROUP_VM, sizeof(struct kvm_irqchip), 0, 0),
        SEC(DEVICE, GROUP_DEVICE, 0, 0, 0),
};

static void set_error(const char **ret_error, const char *e) {
        if (ret_error)
                *ret_error = e;
}

static void put_le32(uint8_t *p, uint32_t v) {
        v = htole32(v);
        memcpy(p, &v, sizeof(v));
}

static void put_le64(uint8_t *p, uint64_t v) {
        v = htole64(v);
        memcpy(p, &v, sizeof(v));
}

static uint32_t get_le32(const uint8_t *p) {
        uint32_t v;
        memcpy(&v, p, sizeof(v));
        return le32toh(v);
}

static uint64_t get_le64(const uint8_t *p) {
        uint64_t v;
        memcpy(&v, p, sizeof(v));
        return le64toh(v);
}

static bool dev_kind_is_valid(uint32_t kind) {
        return kind >= VMSTATE_DEV_SERIAL && kind <= VMSTATE_DEV_VIRTIO_NET;
}

static bool mem_size_is_valid(uint64_t mem_size) {
        return mem_size > 0 && mem_size % MEM_ALIGN == 0;
}

/* ---- encoding ---- */

struct writer {
        uint8_t *buf;
        size_t len, allocated;
};

static int writer_reserve(struct writer *w, size_t n) {
        size_t want;
        uint8_t *p;

        if (n > VMSTATE_MAX_SIZE || w->len > VMSTATE_MAX_SIZE - n)
                return -EMSGSIZE;
        want = w->len + n;
        if (want <= w->allocated)
                return 0;

        want = MAX(want, MAX(w->allocated * 2, (size_t) 64 * 1024));
        want = MIN(want, (size_t) VMSTATE_MAX_SIZE);
        p = realloc(w->buf, want);
        if (!p)
                return -ENOMEM;
        w->buf = p;
        w->allocated = want;
        return 0;
}

/* Append a section whose data is head[0..head_len) followed by data[0..len). */
static int writer_section(struct writer *w, enum vmstate_section type, uint32_t index,
                          const void *head, size_t head_len, const void *data, size_t len) {
        size_t total = head_len + len, padded = ALIGN_UP(total, (size_t) 8);
        uint8_t *p;
        int r;

        if (total > UINT32_MAX)
                return -EMSGSIZE;

        r = writer_reserve(w, SECTION_HEADER_SIZE + padded);
        if (r < 0)
                return r;

        p = w->buf + w->len;
        put_le32(p, type);
        put_le32(p + 4, index);
        put_le32(p + 8, (uint32_t) total);
        put_le32(p + 12, 0);
        p += SECTION_HEADER_SIZE;
        if (head_len > 0)
                memcpy(p, head, head_len);
        if (len > 0)
                memcpy(p + head_len, data, len);
        memset(p + total, 0, padded - total);

        w->len += SECTION_HEADER_SIZE + padded;
        return 0;
}

static int writer_plain(struct writer *w, enum vmstate_section type, uint32_t index, const void *data) {
        return writer_section(w, type, index, NULL, 0, data, sections[type].size);
}

static int writer_counted(struct writer *w, enum vmstate_section type, uint32_t index,
                          uint32_t count, const void *data, size_t len) {
        uint8_t head[COUNT_HEADER_SIZE];

        put_le32(head, count);
        put_le32(head + 4, 0);
        return writer_section(w, type, index, head, sizeof(head), data, len);
}

static int vmstate_check(const struct vmstate *s) {
        if (!mem_size_is_valid(s->memory.mem_size) || s->memory.reserved != 0)
                return -EINVAL;
        if (s->n_vcpus < 1 || s->n_vcpus > VMSTATE_MAX_VCPUS)
                return -EINVAL;
        for (uint32_t i = 0; i < s->n_vcpus; i++)
                if (s->vcpus[i].n_cpuid > VMSTATE_MAX_CPUID || s->vcpus[i].n_msrs > VMSTATE_MAX_MSRS)
                        return -EINVAL;
        if (s->pic_master.chip_id != KVM_IRQCHIP_PIC_MASTER ||
            s->pic_slave.chip_id != KVM_IRQCHIP_PIC_SLAVE ||
            s->ioapic.chip_id != KVM_IRQCHIP_IOAPIC)
                return -EINVAL;
        if (s->n_devs > VMSTATE_MAX_DEVS)
                return -EINVAL;
        for (uint32_t i = 0; i < s->n_devs; i++)
                if (!dev_kind_is_valid(s->devs[i].kind) || s->devs[i].len > VMSTATE_DEV_BLOB_MAX)
                        return -EINVAL;
        return 0;
}

static int encode_payload(struct writer *w, const struct vmstate *s) {
        int r;

        r = writer_plain(w, VMSTATE_SEC_MEMORY, 0, &s->memory);
        if (r < 0)
                return r;

        for (uint32_t i = 0; i < s->n_vcpus; i++) {
                const struct vmstate_vcpu *v = &s->vcpus[i];

                if ((r = writer_counted(w, VMSTATE_SEC_CPUID, i, v->n_cpuid, v->cpuid,
                                        v->n_cpuid * sizeof(v->cpuid[0]))) < 0 ||
                    (r = writer_plain(w, VMSTATE_SEC_MP_STATE, i, &v->mp_state)) < 0 ||
                    (r = writer_plain(w, VMSTATE_SEC_REGS, i, &v->regs)) < 0 ||
                    (r = writer_plain(w, VMSTATE_SEC_SREGS, i, &v->sregs)) < 0 ||
                    (r = writer_plain(w, VMSTATE_SEC_XSAVE, i, &v->xsave)) < 0 ||
                    (r = writer_plain(w, VMSTATE_SEC_XCRS, i, &v->xcrs)) < 0 ||
                    (r = writer_plain(w, VMSTATE_SEC_DEBUGREGS, i, &v->debugregs)) < 0 ||
                    (r = writer_plain(w, VMSTATE_SEC_LAPIC, i, &v->lapic)) < 0 ||
                    (r = writer_counted(w, VMSTATE_SEC_MSRS, i, v->n_msrs, v->msrs,
                                        v->n_msrs * sizeof(v->msrs[0]))) < 0 ||
                    (r = writer_plain(w, VMSTATE_SEC_EVENTS, i, &v->events)) < 0)
                        return r;
        }

        if ((r = writer_plain(w, VMSTATE_SEC_PIT, 0, &s->pit)) < 0 ||
            (r = writer_plain(w, VMSTATE_SEC_CLOCK, 0, &s->clock)) < 0 ||
            (r = writer_plain(w, VMSTATE_SEC_PIC_MASTER, 0, &s->pic_master)) < 0 ||
            (r = writer_plain(w, VMSTATE_SEC_PIC_SLAVE, 0, &s->pic_slave)) < 0 ||
            (r = writer_plain(w, VMSTATE_SEC_IOAPIC, 0, &s->ioapic)) < 0)
                return r;

        for (uint32_t i = 0; i < s->n_devs; i++) {
                r = writer_counted(w, VMSTATE_SEC_DEVICE, i, s->devs[i].kind, s->devs[i].blob, s->devs[i].len);
                if (r < 0)
                        return r;
        }

        return 0;
}

int vmstate_encode(const struct vmstate *s, void **ret_buf, size_t *ret_len) {
        _cleanup_free_ uint8_t *buf = NULL;
        struct writer w = {};
        size_t len;
        int r;

        r = vmstate_check(s);
        if (r < 0)
                return r;

        r = writer_reserve(&w, VMSTATE_HEADER_SIZE);
        if (r >= 0) {
                w.len = VMSTATE_HEADER_SIZE;
                r = encode_payload(&w, s);
        }
        buf = w.buf; /* owned by the cleanup from here on */
        len = w.len;
        if (r < 0)
                return r;

        memcpy(buf, VMSTATE_MAGIC, 8);
        put_le32(buf + 8, VMSTATE_VERSION);
        put_le32(buf + 12, 0);
        put_le64(buf + 16, len - VMSTATE_HEADER_SIZE);
        put_le32(buf + 24, crc32c(buf + VMSTATE_HEADER_SIZE, len - VMSTATE_HEADER_SIZE));
        put_le32(buf + 28, crc32c(buf, 28));

        *ret_buf = TAKE_PTR(buf);
        *ret_len = len;
        return 0;
}

/* ---- decoding ---- */

/* Sort key of a section in the restore order; strictly increasing in a valid file. */
static uint64_t section_rank(enum vmstate_section type, uint32_t index) {
        return ((uint64_t) sections[type].group << 56) | ((uint64_t) index << 8) | (uint64_t) type;
}

struct decoder {
        struct vmstate *s;
        uint32_t version;
        bool seen_vcpu[VMSTATE_MAX_VCPUS][_VMSTATE_SEC_MAX];
        bool seen_vm[_VMSTATE_SEC_MAX];
        bool seen_dev[VMSTATE_MAX_DEVS];
        bool have_rank;
        uint64_t last_rank;
};

static int decode_section(struct decoder *d, enum vmstate_section type, uint32_t index,
                          const uint8_t *data, uint32_t len, const char **ret_error) {
        const struct section_info *info = &sections[type];
        struct vmstate *s = d->s;
        struct vmstate_vcpu *v = NULL;
        bool *seen;
        uint64_t rank;

#define FAIL(msg)                               \
        do {                                    \
                set_error(ret_error, msg);      \
                return -EBADMSG;                \
        } while (0)

        switch (info->group) {
        case GROUP_VCPU:
                if (index >= VMSTATE_MAX_VCPUS)
                        FAIL("vCPU index out of range");
                seen = &d->seen_vcpu[index][type];
                v = &s->vcpus[index];
                break;
        case GROUP_DEVICE:
                if (index >= VMSTATE_MAX_DEVS)
                        FAIL("device index out of range");
                seen = &d->seen_dev[index];
                break;
        default:
                if (index != 0)
                        FAIL("VM-wide section with non-zero index");
                seen = &d->seen_vm[type];
                break;
        }

        if (*seen)
                FAIL(info->duplicate);

        rank = section_rank(type, index);
        if (d->have_rank && rank <= d->last_rank)
                FAIL("sections out of order");

        if (info->size > 0) {
                if (len != info->size)
                        FAIL(info->wrong_size);
        } else {
                uint32_t count;

                if (len < COUNT_HEADER_SIZE)
                        FAIL(info->wrong_size);
                count = get_le32(data);
                if (get_le32(data + 4) != 0)
                        FAIL("non-zero padding in section");

                if (info->entry_size > 0) {
                        if (count > info->max_count)
                                FAIL(info->count_over_max);
                        if ((size_t) len != COUNT_HEADER_SIZE + (size_t) count * info->entry_size)
                                FAIL(info->wrong_size);
                }
        }

        switch (type) {
        case VMSTATE_SEC_MEMORY:
                memcpy(&s->memory, data, len);
                if (s->memory.reserved != 0)
                        FAIL("non-zero reserved field in MEMORY");
                if (!mem_size_is_valid(s->memory.mem_size))
                        FAIL("memory size is not a non-zero multiple of 2 MiB");
                break;
        case VMSTATE_SEC_CPUID:
                v->n_cpuid = get_le32(data);
                memcpy(v->cpuid, data + COUNT_HEADER_SIZE, len - COUNT_HEADER_SIZE);
                break;
        case VMSTATE_SEC_MP_STATE:
                memcpy(&v->mp_state, data, len);
                break;
        case VMSTATE_SEC_REGS:
                memcpy(&v->regs, data, len);
                break;
        case VMSTATE_SEC_SREGS:
                memcpy(&v->sregs, data, len);
                break;
        case VMSTATE_SEC_XSAVE:
                memcpy(&v->xsave, data, len);
                break;
        case VMSTATE_SEC_XCRS:
                memcpy(&v->xcrs, data, len);
                break;
        case VMSTATE_SEC_DEBUGREGS:
                memcpy(&v->debugregs, data, len);
                break;
        case VMSTATE_SEC_LAPIC:
                memcpy(&v->lapic, data, len);
                break;
        case VMSTATE_SEC_MSRS:
                v->n_msrs = get_le32(data);
                memcpy(v->msrs, data + COUNT_HEADER_SIZE, len - COUNT_HEADER_SIZE);
                break;
        case VMSTATE_SEC_EVENTS:
                memcpy(&v->events, data, len);
                break;
        case VMSTATE_SEC_PIT:
                memcpy(&s->pit, data, len);
                break;
        case VMSTATE_SEC_CLOCK:
                memcpy(&s->clock, data, len);
                break;
        case VMSTATE_SEC_PIC_MASTER:
                memcpy(&s->pic_master, data, len);
                if (s->pic_master.chip_id != KVM_IRQCHIP_PIC_MASTER)
                        FAIL("section PIC_MASTER has wrong chip id");
                break;
        case VMSTATE_SEC_PIC_SLAVE:
                memcpy(&s->pic_slave, data, len);
                if (s->pic_slave.chip_id != KVM_IRQCHIP_PIC_SLAVE)
                        FAIL("section PIC_SLAVE has wrong chip id");
                break;
        case VMSTATE_SEC_IOAPIC:
                memcpy(&s->ioapic, data, len);
                if (s->ioapic.chip_id != KVM_IRQCHIP_IOAPIC)
                        FAIL("section IOAPIC has wrong chip id");
                break;
        case VMSTATE_SEC_DEVICE: {
                uint32_t kind = get_le32(data), blob_len = len - COUNT_HEADER_SIZE;

                if (blob_len > VMSTATE_DEV_BLOB_MAX)
                        FAIL("device blob too large");
                if (!dev_kind_is_valid(kind))
                        FAIL("unknown device kind");
                if (index != s->n_devs)
                        FAIL("device slots not contiguous");
                s->devs[index].kind = kind;
                s->devs[index].len = blob_len;
                memcpy(s->devs[index].blob, data + COUNT_HEADER_SIZE, blob_len);
                s->n_devs++;
                break;
        }
        default:
                FAIL("unknown section type");
        }
#undef FAIL

        *seen = true;
        d->have_rank = true;
        d->last_rank = rank;
        return 0;
}

static int decode_check_complete(const struct decoder *d, const char **ret_error) {
        uint32_t n_vcpus = 0;

        if (!d->seen_vm[VMSTATE_SEC_MEMORY]) {
                set_error(ret_error, sections[VMSTATE_SEC_MEMORY].missing);
                return -EBADMSG;
        }

        /* vCPUs are numbered from 0 without gaps; at least one. */
        for (uint32_t i = 0; i < VMSTATE_MAX_VCPUS; i++)
                for (int t = 0; t < _VMSTATE_SEC_MAX; t++)
                        if (d->seen_vcpu[i][t])
                                n_vcpus = i + 1;
        n_vcpus = MAX(n_vcpus, 1u);
        if (d->version < 2 && n_vcpus > 1) {
                set_error(ret_error, "a version 1 vmstate has exactly one vCPU");
                return -EBADMSG;
        }

        for (uint32_t i = 0; i < n_vcpus; i++)
                for (int t = VMSTATE_SEC_MEMORY; t < _VMSTATE_SEC_MAX; t++)
                        if (sections[t].group == GROUP_VCPU && !d->seen_vcpu[i][t]) {
                                set_error(ret_error, sections[t].missing);
                                return -EBADMSG;
                        }

        for (int t = VMSTATE_SEC_MEMORY; t < _VMSTATE_SEC_MAX; t++)
                if (sections[t].group == GROUP_VM && !d->seen_vm[t]) {
                        set_error(ret_error, sections[t].missing);
                        return -EBADMSG;
                }

        d->s->n_vcpus = n_vcpus;
        return 0;
}

int vmstate_decode(const void *buf, size_t len, struct vmstate *ret, const char **ret_error) {
        _cleanup_free_ struct decoder *d = NULL;
        _cleanup_free_ struct vmstate *s = NULL;
        const uint8_t *h = buf, *payload;
        uint64_t payload_len;
        size_t off;
        int r;

        if (!buf && len > 0)
                return -EINVAL;

        if (len > VMSTATE_MAX_SIZE) {
                set_error(ret_error, "vmstate too large");
                return -EMSGSIZE;
        }
        if (len < VMSTATE_HEADER_SIZE) {
                set_error(ret_error, "truncated header");
                return -EBADMSG;
        }
        if (memcmp(h, VMSTATE_MAGIC, 8) != 0) {
                set_error(ret_error, "bad magic");
                return -EBADMSG;
        }
        if (get_le32(h + 28) != crc32c(h, 28)) {
                set_error(ret_error, "CRC mismatch in header");
                return -EBADMSG;
        }
        if (get_le32(h + 8) < VMSTATE_VERSION_MIN || get_le32(h + 8) > VMSTATE_VERSION) {
                set_error(ret_error, "unsupported vmstate version (expected 1 or 2)");
                return -EPROTONOSUPPORT;
        }
        if (get_le32(h + 12) != 0) {
                set_error(ret_error, "non-zero flags in header");
                return -EBADMSG;
        }

        payload_len = get_le64(h + 16);
        if (payload_len > len - VMSTATE_HEADER_SIZE) {
                set_error(ret_error, "truncated payload");
                return -EBADMSG;
        }
        if (payload_len < len - VMSTATE_HEADER_SIZE) {
                set_error(ret_error, "trailing bytes after payload");
                return -EBADMSG;
        }

        payload = h + VMSTATE_HEADER_SIZE;
        if (get_le32(h + 24) != crc32c(payload, payload_len)) {
                set_error(ret_error, "CRC mismatch in payload");
                return -EBADMSG;
        }

        d = calloc(1, sizeof(*d));
        s = calloc(1, sizeof(*s));
        if (!d || !s)
                return -ENOMEM;
        d->s = s;
        d->version = get_le32(h + 8);

        for (off = 0; off < payload_len;) {
                uint32_t type, index, slen;
                size_t padded;

                if (payload_len - off < SECTION_HEADER_SIZE) {
                        set_error(ret_error, "truncated section header");
                        return -EBADMSG;
                }

                type = get_le32(payload + off);
                index = get_le32(payload + off + 4);
                slen = get_le32(payload + off + 8);
                if (get_le32(payload + off + 12) != 0) {
                        set_error(ret_error, "non-zero reserved field in section header");
                        return -EBADMSG;
                }
                off += SECTION_HEADER_SIZE;

                padded = ALIGN_UP((size_t) slen, (size_t) 8);
                if (padded > payload_len - off) {
                        set_error(ret_error, "section runs past end of file");
                        return -EBADMSG;
                }
                for (size_t i = slen; i < padded; i++)
                        if (payload[off + i] != 0) {
                                set_error(ret_error, "non-zero section padding");
                                return -EBADMSG;
                        }

                if (type == 0 || type >= _VMSTATE_SEC_MAX) {
                        set_error(ret_error, "unknown section type");
                        return -EBADMSG;
                }

                r = decode_section(d, type, index, payload + off, slen, ret_error);
                if (r < 0)
                        return r;

                off += padded;
        }

        r = decode_check_complete(d, ret_error);
        if (r < 0)
                return r;

        memcpy(ret, s, sizeof(*s));
        return 0;
}

/* ---- files ---- */

int vmstate_write_file(const char *path, const struct vmstate *s) {
        _cleanup_free_ void *buf = NULL;
        _cleanup_close_ int fd = -EBADF;
        size_t len;
        int r;

        r = vmstate_encode(s, &buf, &len);
        if (r < 0)
                return r;

        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, 0600);
        if (fd < 0)
                return negative_errno();

        r = loop_write(fd, buf, len);
        if (r < 0)
                return r;

        if (fsync(fd) < 0)
                return negative_errno();

        return 0;
}

int vmstate_read_file(const char *path, struct vmstate *ret, const char **ret_error) {
        _cleanup_free_ uint8_t *buf = NULL;
        _cleanup_close_ int fd = -EBADF;
        struct stat st;
        size_t n = 0;

        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0) {
                set_error(ret_error, "cannot open vmstate file");
                return negative_errno();
        }
        if (fstat(fd, &st) < 0) {
                set_error(ret_error, "cannot stat vmstate file");
                return negative_errno();
        }
        if (!S_ISREG(st.st_mode)) {
                set_error(ret_error, "vmstate file is not a regular file");
                return S_ISDIR(st.st_mode) ? -EISDIR : -EBADFD;
        }

        buf = malloc(VMSTATE_MAX_SIZE + 1);
        if (!buf)
                return -ENOMEM;

        while (n < VMSTATE_MAX_SIZE + 1) {
                ssize_t k = read(fd, buf + n, VMSTATE_MAX_SIZE + 1 - n);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        set_error(ret_error, "cannot read vmstate file");
                        return negative_errno();
                }
                if (k == 0)
                        break;
                n += (size_t) k;
        }

        if (n > VMSTATE_MAX_SIZE) {
                set_error(ret_error, "vmstate too large");
                return -EMSGSIZE;
        }

        return vmstate_decode(buf, n, ret, ret_error);
}
