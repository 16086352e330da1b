/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * virtio-mmio transport, version 2. See virtio-mmio.h.
 */

#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bootinfo.h"
#include "virtio-mmio.h"

struct virtio_mmio {
        struct mmio_dev mmio;            /* registered with the vmm; mmio.priv = this */
        struct vmm *vmm;
        uint32_t gsi;
        const struct virtio_dev_ops *ops;
        void *priv;

        uint64_t device_features;
        uint64_t driver_features;
        uint32_t device_features_sel;
        uint32_t driver_features_sel;
        uint32_t queue_sel;
        uint32_t status;
        uint32_t isr;
        uint32_t config_generation;

        uint8_t config[VIRTIO_MMIO_CONFIG_MAX];
        uint32_t config_len;

        unsigned n_queues;
        uint32_t queue_max;
        struct virtq vq[VIRTIO_MMIO_MAX_QUEUES];
};

#define VERSION_1 (1ull << VIRTIO_F_VERSION_1_BIT)

/* ---- accessors -------------------------------------------------------------- */

void *virtio_mmio_priv(struct virtio_mmio *dev) {
        return dev->priv;
}

int virtio_mmio_set_config(struct virtio_mmio *dev, const void *config, uint32_t len) {
        if (!dev || (!config && len > 0) || len > dev->config_len)
                return -EINVAL;
        if (len > 0)
                memcpy(dev->config, config, len);
        return 0;
}

struct vmm *virtio_mmio_vmm(struct virtio_mmio *dev) {
        return dev->vmm;
}

struct virtq *virtio_mmio_queue(struct virtio_mmio *dev, unsigned q) {
        return q < dev->n_queues ? &dev->vq[q] : NULL;
}

uint32_t virtio_mmio_status(const struct virtio_mmio *dev) {
        return dev->status;
}

uint32_t virtio_mmio_device_id(const struct virtio_mmio *dev) {
        return dev->ops->device_id;
}

struct mmio_dev *virtio_mmio_bus_dev(struct virtio_mmio *dev) {
        return &dev->mmio;
}

uint32_t virtio_mmio_gsi(const struct virtio_mmio *dev) {
        return dev->gsi;
}

bool virtio_mmio_active(const struct virtio_mmio *dev) {
        const uint32_t need = VIRTIO_STATUS_DRIVER_OK | VIRTIO_STATUS_FEATURES_OK;
        const uint32_t bad = VIRTIO_STATUS_DEVICE_NEEDS_RESET | VIRTIO_STATUS_FAILED;

        return (dev->status & need) == need && !(dev->status & bad);
}

/* ---- interrupts ------------------------------------------------------------- */

static void raise_irq(struct vmm *vmm, struct virtio_mmio *dev, uint32_t bit) {
        dev->isr |= bit;
        /* Edge-triggered: pulse for every event; a lost pulse would hang the
         * driver, an extra one only costs it a look at InterruptStatus. A
         * failure (no irqchip, as in unit tests) leaves ISR set for polling. */
        (void) vmm_irq_pulse(vmm, dev->gsi);
}

void virtio_mmio_signal_used(struct vmm *vmm, struct virtio_mmio *dev, unsigned q) {
        if (q >= dev->n_queues)
                return;
        if (virtq_should_interrupt(vmm, &dev->vq[q]))
                raise_irq(vmm, dev, VIRTIO_MMIO_INT_VRING);
}

void virtio_mmio_set_needs_reset(struct vmm *vmm, struct virtio_mmio *dev) {
        if (dev->status & VIRTIO_STATUS_DEVICE_NEEDS_RESET)
                return;
        dev->status |= VIRTIO_STATUS_DEVICE_NEEDS_RESET;
        /* Only a driver that got past FEATURES_OK listens for it; still harmless. */
        raise_irq(vmm, dev, VIRTIO_MMIO_INT_CONFIG);
}

/* ---- reset ------------------------------------------------------------------ */

static void device_reset(struct virtio_mmio *dev) {
        if (dev->ops->reset)
                dev->ops->reset(dev);
        dev->driver_features = 0;
        dev->device_features_sel = 0;
        dev->driver_features_sel = 0;
        dev->queue_sel = 0;
        dev->status = 0;
        dev->isr = 0;
        for (unsigned i = 0; i < dev->n_queues; i++)
                virtq_reset(&dev->vq[i], dev->queue_max);
}

/* ---- registers -------------------------------------------------------------- */

static struct virtq *selected_queue(struct virtio_mmio *dev) {
        return dev->queue_sel < dev->n_queues ? &dev->vq[dev->queue_sel] : NULL;
}

static uint32_t reg_read(struct virtio_mmio *dev, uint64_t off) {
        struct virtq *vq = selected_queue(dev);

        switch (off) {
        case VIRTIO_MMIO_MAGIC_VALUE:
                return VIRTIO_MMIO_MAGIC;
        case VIRTIO_MMIO_VERSION:
                return VIRTIO_MMIO_VERSION_MODERN;
        case VIRTIO_MMIO_DEVICE_ID:
                return dev->ops->device_id;
        case VIRTIO_MMIO_VENDOR_ID:
                return VIRTIO_MMIO_VENDOR;
        case VIRTIO_MMIO_DEVICE_FEATURES:
                if (dev->device_features_sel > 1)
                        return 0;
                return (uint32_t) (dev->device_features >> (32 * dev->device_features_sel));
        case VIRTIO_MMIO_QUEUE_NUM_MAX:
                return vq ? vq->num_max : 0;
        case VIRTIO_MMIO_QUEUE_READY:
                return vq ? vq->ready : 0;
        case VIRTIO_MMIO_INTERRUPT_STATUS:
                return dev->isr;
        case VIRTIO_MMIO_STATUS:
                return dev->status;
        case VIRTIO_MMIO_SHM_LEN_LOW:
        case VIRTIO_MMIO_SHM_LEN_HIGH:
        case VIRTIO_MMIO_SHM_BASE_LOW:
        case VIRTIO_MMIO_SHM_BASE_HIGH:
                return UINT32_MAX; /* no shared memory regions */
        case VIRTIO_MMIO_CONFIG_GENERATION:
                return dev->config_generation;
        default:
                return 0; /* write-only or unknown */
        }
}

static void set_lo(uint64_t *v, uint32_t lo) {
        *v = (*v & 0xffffffff00000000ull) | lo;
}

static void set_hi(uint64_t *v, uint32_t hi) {
        *v = (*v & 0xffffffffull) | ((uint64_t) hi << 32);
}

static bool features_acceptable(const struct virtio_mmio *dev) {
        return (dev->driver_features & ~dev->device_features) == 0 && (dev->driver_features & VERSION_1);
}

static void write_status(struct vmm *vmm, struct virtio_mmio *dev, uint32_t val) {
        uint32_t old = dev->status, new;

        if (val == 0) {
                device_reset(dev);
                return;
        }

        new = val & 0xffu;
        if ((new & VIRTIO_STATUS_FEATURES_OK) && !(old & VIRTIO_STATUS_FEATURES_OK) && !features_acceptable(dev))
                new &= ~VIRTIO_STATUS_FEATURES_OK; /* the driver reads it back and gives up */
        /* NEEDS_RESET is the device's, cleared only by a reset */
        new = (new & ~VIRTIO_STATUS_DEVICE_NEEDS_RESET) | (old & VIRTIO_STATUS_DEVICE_NEEDS_RESET);
        dev->status = new;

        if (!(old & VIRTIO_STATUS_DRIVER_OK) && virtio_mmio_active(dev) && dev->ops->notify)
                dev->ops->notify(vmm, dev, VIRTIO_MMIO_KICK_ALL);
}

void virtio_mmio_kick(struct vmm *vmm, struct virtio_mmio *dev) {
        if (dev && virtio_mmio_active(dev) && dev->ops->notify)
                dev->ops->notify(vmm, dev, VIRTIO_MMIO_KICK_ALL);
}

static void write_queue_ready(struct vmm *vmm, struct virtio_mmio *dev, struct virtq *vq, uint32_t val) {
        if (val == 0) {
                vq->ready = false;
                return;
        }
        if (vq->ready)
                return;
        if (virtq_check_layout(vmm, vq) < 0) {
                virtio_mmio_set_needs_reset(vmm, dev);
                return;
        }
        vq->ready = true;
        vq->broken = false;
        vq->inflight = 0;
}

static void reg_write(struct vmm *vmm, struct virtio_mmio *dev, uint64_t off, uint32_t val) {
        struct virtq *vq = selected_queue(dev);
        bool queue_writable = vq && !vq->ready;

        switch (off) {
        case VIRTIO_MMIO_DEVICE_FEATURES_SEL:
                dev->device_features_sel = val;
                break;
        case VIRTIO_MMIO_DRIVER_FEATURES:
                if (dev->status & VIRTIO_STATUS_FEATURES_OK)
                        break; /* frozen */
                if (dev->driver_features_sel == 0)
                        set_lo(&dev->driver_features, val);
                else if (dev->driver_features_sel == 1)
                        set_hi(&dev->driver_features, val);
                break;
        case VIRTIO_MMIO_DRIVER_FEATURES_SEL:
                dev->driver_features_sel = val;
                break;
        case VIRTIO_MMIO_QUEUE_SEL:
                dev->queue_sel = val;
                break;
        case VIRTIO_MMIO_QUEUE_NUM:
                if (queue_writable)
                        vq->num = val; /* validated at QueueReady */
                break;
        case VIRTIO_MMIO_QUEUE_READY:
                if (vq)
                        write_queue_ready(vmm, dev, vq, val);
                break;
        case VIRTIO_MMIO_QUEUE_NOTIFY:
                if (val < dev->n_queues && dev->vq[val].ready && virtio_mmio_active(dev) && dev->ops->notify)
                        dev->ops->notify(vmm, dev, val);
                break;
        case VIRTIO_MMIO_INTERRUPT_ACK:
                dev->isr &= ~val;
                break;
        case VIRTIO_MMIO_STATUS:
                write_status(vmm, dev, val);
                break;
        case VIRTIO_MMIO_QUEUE_DESC_LOW:
                if (queue_writable)
                        set_lo(&vq->desc_gpa, val);
                break;
        case VIRTIO_MMIO_QUEUE_DESC_HIGH:
                if (queue_writable)
                        set_hi(&vq->desc_gpa, val);
                break;
        case VIRTIO_MMIO_QUEUE_DRIVER_LOW:
                if (queue_writable)
                        set_lo(&vq->avail_gpa, val);
                break;
        case VIRTIO_MMIO_QUEUE_DRIVER_HIGH:
                if (queue_writable)
                        set_hi(&vq->avail_gpa, val);
                break;
        case VIRTIO_MMIO_QUEUE_DEVICE_LOW:
                if (queue_writable)
                        set_lo(&vq->used_gpa, val);
                break;
        case VIRTIO_MMIO_QUEUE_DEVICE_HIGH:
                if (queue_writable)
                        set_hi(&vq->used_gpa, val);
                break;
        default:
                break; /* read-only or unknown: ignored */
        }
}

static bool config_access_ok(const struct virtio_mmio *dev, uint64_t off, uint32_t len) {
        if (len != 1 && len != 2 && len != 4 && len != 8)
                return false;
        return off < dev->config_len && len <= dev->config_len - off;
}

static void mmio_read(struct vmm *vmm, struct mmio_dev *mdev, uint64_t off, void *data, uint32_t len) {
        struct virtio_mmio *dev = mdev->priv;
        uint32_t v;

        memset(data, 0, len);
        if (off >= VIRTIO_MMIO_CONFIG) {
                off -= VIRTIO_MMIO_CONFIG;
                if (config_access_ok(dev, off, len))
                        memcpy(data, dev->config + off, len);
                return;
        }
        if (len != 4 || off % 4)
                return;
        v = htole32(reg_read(dev, off));
        memcpy(data, &v, 4);
}

static void mmio_write(struct vmm *vmm, struct mmio_dev *mdev, uint64_t off, const void *data, uint32_t len) {
        struct virtio_mmio *dev = mdev->priv;
        uint32_t v;

        if (off >= VIRTIO_MMIO_CONFIG)
                return; /* config space is read-only for our devices */
        if (len != 4 || off % 4)
                return;
        memcpy(&v, data, 4);
        reg_write(vmm, dev, off, le32toh(v));
}

/* ---- life cycle ------------------------------------------------------------- */

int virtio_mmio_new(struct vmm *vmm, uint64_t base, uint32_t gsi, const struct virtio_dev_ops *ops,
                    uint64_t features, unsigned n_queues, uint32_t queue_max,
                    const void *config, uint32_t config_len, void *priv, struct virtio_mmio **ret) {
        struct virtio_mmio *dev;
        int r;

        if (!vmm || !ops || !ret || n_queues == 0 || n_queues > VIRTIO_MMIO_MAX_QUEUES ||
            config_len > VIRTIO_MMIO_CONFIG_MAX || (config_len > 0 && !config) ||
            queue_max == 0 || queue_max > VIRTQ_MAX_SIZE || (queue_max & (queue_max - 1)))
                return -EINVAL;

        dev = calloc(1, sizeof *dev);
        if (!dev)
                return -ENOMEM;

        *dev = (struct virtio_mmio) {
                .mmio = {
                        .base = base,
                        .size = FORKD_VIRTIO_MMIO_SIZE,
                        .priv = dev,
                        .read = mmio_read,
                        .write = mmio_write,
                },
                .vmm = vmm,
                .gsi = gsi,
                .ops = ops,
                .priv = priv,
                .device_features = features | VERSION_1,
                .config_len = config_len,
                .n_queues = n_queues,
                .queue_max = queue_max,
        };
        if (config_len > 0)
                memcpy(dev->config, config, config_len);
        for (unsigned i = 0; i < n_queues; i++)
                virtq_reset(&dev->vq[i], queue_max);

        r = vmm_register_mmio(vmm, &dev->mmio);
        if (r < 0) {
                free(dev);
                return r;
        }

        *ret = dev;
        return 0;
}

void virtio_mmio_free(struct virtio_mmio *dev) {
        if (!dev)
                return;
        if (dev->ops->free)
                dev->ops->free(dev->priv);
        free(dev);
}

/* ---- save / restore --------------------------------------------------------- */

static void put16(uint8_t *p, uint16_t v) {
        v = htole16(v);
        memcpy(p, &v, 2);
}

static void put32(uint8_t *p, uint32_t v) {
        v = htole32(v);
        memcpy(p, &v, 4);
}

static void put64(uint8_t *p, uint64_t v) {
        v = htole64(v);
        memcpy(p, &v, 8);
}

static uint16_t get16(const uint8_t *p) {
        uint16_t v;
        memcpy(&v, p, 2);
        return le16toh(v);
}

static uint32_t get32(const uint8_t *p) {
        uint32_t v;
        memcpy(&v, p, 4);
        return le32toh(v);
}

static uint64_t get64(const uint8_t *p) {
        uint64_t v;
        memcpy(&v, p, 8);
        return le64toh(v);
}

#define QF_READY  1u
#define QF_BROKEN 2u

int virtio_mmio_save(struct virtio_mmio *dev, void *buf, size_t cap, size_t *ret_len) {
        uint8_t tmp[VIRTIO_MMIO_STATE_MAX] = {};
        size_t qlen = (size_t) dev->n_queues * VIRTIO_MMIO_STATE_QUEUE_SIZE, dev_len = 0, total;
        uint8_t *p;
        int r;

        if (!buf || !ret_len)
                return -EINVAL;

        p = tmp + VIRTIO_MMIO_STATE_HDR_SIZE + qlen;
        if (dev->ops->save) {
                r = dev->ops->save(dev, p, VIRTIO_MMIO_STATE_DEV_MAX, &dev_len);
                if (r < 0)
                        return r;
                if (dev_len > VIRTIO_MMIO_STATE_DEV_MAX)
                        return -ENOBUFS;
        }
        total = VIRTIO_MMIO_STATE_HDR_SIZE + qlen + dev_len;
        if (total > cap)
                return -ENOBUFS;

        put32(tmp + 0, VIRTIO_MMIO_STATE_MAGIC);
        put16(tmp + 4, VIRTIO_MMIO_STATE_VERSION);
        put16(tmp + 6, (uint16_t) dev->n_queues);
        put32(tmp + 8, dev->ops->device_id);
        put32(tmp + 12, dev->status);
        put32(tmp + 16, dev->isr);
        put32(tmp + 20, dev->device_features_sel);
        put32(tmp + 24, dev->driver_features_sel);
        put32(tmp + 28, dev->queue_sel);
        put64(tmp + 32, dev->driver_features);
        put32(tmp + 40, dev->config_generation);
        put32(tmp + 44, (uint32_t) dev_len);

        p = tmp + VIRTIO_MMIO_STATE_HDR_SIZE;
        for (unsigned i = 0; i < dev->n_queues; i++, p += VIRTIO_MMIO_STATE_QUEUE_SIZE) {
                const struct virtq *vq = &dev->vq[i];

                put32(p + 0, vq->num);
                /* in-flight chains are saved as not yet popped */
                put16(p + 4, (uint16_t) (vq->last_avail_idx - vq->inflight));
                put16(p + 6, vq->used_idx);
                put64(p + 8, vq->desc_gpa);
                put64(p + 16, vq->avail_gpa);
                put64(p + 24, vq->used_gpa);
                put32(p + 32, (vq->ready ? QF_READY : 0) | (vq->broken ? QF_BROKEN : 0));
                put32(p + 36, 0);
        }

        memcpy(buf, tmp, total);
        *ret_len = total;
        return 0;
}

int virtio_mmio_restore(struct vmm *vmm, struct virtio_mmio *dev, const void *buf, size_t len) {
        const uint32_t known_status = VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_DRIVER_OK |
                                      VIRTIO_STATUS_FEATURES_OK | VIRTIO_STATUS_DEVICE_NEEDS_RESET |
                                      VIRTIO_STATUS_FAILED;
        struct virtq vq[VIRTIO_MMIO_MAX_QUEUES];
        const uint8_t *b = buf, *p;
        uint32_t status, isr, dev_len;
        uint64_t driver_features;
        size_t qlen;

        if (!vmm || !dev || !buf)
                return -EINVAL;
        if (len < VIRTIO_MMIO_STATE_HDR_SIZE)
                return -EBADMSG;
        if (get32(b + 0) != VIRTIO_MMIO_STATE_MAGIC || get16(b + 4) != VIRTIO_MMIO_STATE_VERSION ||
            get16(b + 6) != dev->n_queues || get32(b + 8) != dev->ops->device_id)
                return -EBADMSG;

        qlen = (size_t) dev->n_queues * VIRTIO_MMIO_STATE_QUEUE_SIZE;
        dev_len = get32(b + 44);
        if (dev_len > VIRTIO_MMIO_STATE_DEV_MAX || len != VIRTIO_MMIO_STATE_HDR_SIZE + qlen + dev_len)
                return -EBADMSG;

        status = get32(b + 12);
        isr = get32(b + 16);
        driver_features = get64(b + 32);
        if (status & ~known_status)
                return -EBADMSG;
        if (isr & ~(VIRTIO_MMIO_INT_VRING | VIRTIO_MMIO_INT_CONFIG))
                return -EBADMSG;
        if ((status & VIRTIO_STATUS_FEATURES_OK) && ((driver_features & ~dev->device_features) || !(driver_features & VERSION_1)))
                return -EBADMSG;

        p = b + VIRTIO_MMIO_STATE_HDR_SIZE;
        for (unsigned i = 0; i < dev->n_queues; i++, p += VIRTIO_MMIO_STATE_QUEUE_SIZE) {
                uint32_t flags = get32(p + 32);

                virtq_reset(&vq[i], dev->queue_max);
                vq[i].num = get32(p + 0);
                vq[i].last_avail_idx = get16(p + 4);
                vq[i].used_idx = get16(p + 6);
                vq[i].desc_gpa = get64(p + 8);
                vq[i].avail_gpa = get64(p + 16);
                vq[i].used_gpa = get64(p + 24);
                vq[i].ready = flags & QF_READY;
                vq[i].broken = flags & QF_BROKEN;

                if ((flags & ~(QF_READY | QF_BROKEN)) || get32(p + 36) != 0)
                        return -EBADMSG;
                if (!virtq_num_valid(&vq[i], vq[i].num))
                        return -EBADMSG;
                if (vq[i].ready && virtq_check_layout(vmm, &vq[i]) < 0)
                        return -EBADMSG;
                /* the device never has more than num chains outstanding */
                if ((uint16_t) (vq[i].last_avail_idx - vq[i].used_idx) > vq[i].num)
                        return -EBADMSG;
        }

        if (dev->ops->restore_check && dev->ops->restore_check(dev, p, dev_len) < 0)
                return -EBADMSG;
        if (!dev->ops->restore_check && dev_len != 0)
                return -EBADMSG;

        /* everything valid: apply */
        if (dev->ops->reset)
                dev->ops->reset(dev); /* drop chains that point into the old RAM */
        dev->vmm = vmm;
        dev->status = status;
        dev->isr = isr;
        dev->device_features_sel = get32(b + 20);
        dev->driver_features_sel = get32(b + 24);
        dev->queue_sel = get32(b + 28);
        dev->driver_features = driver_features;
        dev->config_generation = get32(b + 40);
        memcpy(dev->vq, vq, sizeof vq[0] * dev->n_queues);
        if (dev->ops->restore_apply)
                dev->ops->restore_apply(dev, p, dev_len);
        return 0;
}

int virtio_mmio_state_dev_part(const void *buf, size_t len, uint32_t device_id, const uint8_t **ret_part,
                               size_t *ret_part_len) {
        const uint8_t *b = buf;
        uint32_t n_queues, dev_len;
        size_t qlen;

        if (!buf || !ret_part || !ret_part_len)
                return -EINVAL;
        if (len < VIRTIO_MMIO_STATE_HDR_SIZE)
                return -EBADMSG;
        if (get32(b + 0) != VIRTIO_MMIO_STATE_MAGIC || get16(b + 4) != VIRTIO_MMIO_STATE_VERSION ||
            get32(b + 8) != device_id)
                return -EBADMSG;
        n_queues = get16(b + 6);
        dev_len = get32(b + 44);
        if (n_queues == 0 || n_queues > VIRTIO_MMIO_MAX_QUEUES || dev_len > VIRTIO_MMIO_STATE_DEV_MAX)
                return -EBADMSG;
        qlen = (size_t) n_queues * VIRTIO_MMIO_STATE_QUEUE_SIZE;
        if (len != VIRTIO_MMIO_STATE_HDR_SIZE + qlen + dev_len)
                return -EBADMSG;
        *ret_part = b + VIRTIO_MMIO_STATE_HDR_SIZE + qlen;
        *ret_part_len = dev_len;
        return 0;
}
