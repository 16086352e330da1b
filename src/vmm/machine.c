/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <fcntl.h>
#include <limits.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>

#include "agent-proto.h"
#include "bootinfo.h"
#include "i8042.h"
#include "kvm.h"
#include "machine.h"
#include "serial.h"
#include "virtio-blk.h"
#include "virtio-console.h"
#include "virtio-mmio.h"
#include "virtio-net.h"
#include "acpi.h"
#include "x86.h"

#define CPUID_MAX_ENTRIES VMSTATE_MAX_CPUID

static int machine_new_common(int kvm_fd, const struct machine_config *cfg, struct vmm **ret) {
        struct vmm *vmm = NULL;
        int r;

        r = vmm_new(kvm_fd, &vmm);
        if (r < 0)
                return r;
        if (cfg->id)
                snprintf(vmm->id, sizeof(vmm->id), "%s", cfg->id);
        if (cfg->stats)
                vmm->stats = cfg->stats;
        r = vmm_create_vm(vmm);
        if (r < 0) {
                machine_free(vmm);
                return r;
        }
        *ret = vmm;
        return 0;
}

/* The NIC (net_mac not NULL) with cfg->net's backend, if any. */
static int machine_add_net(struct vmm *vmm, const uint8_t *net_mac, const struct machine_config *cfg) {
        int fd, r;

        r = virtio_net_new(vmm, MACHINE_NET_MMIO_BASE, MACHINE_GSI_NET, net_mac, &vmm->net);
        if (r < 0)
                return log_debug_errno(r, "Failed to create virtio-net: %m");
        if (!cfg->net)
                return 0;
        fd = fcntl(cfg->net->tap_fd, F_DUPFD_CLOEXEC, 3);
        if (fd < 0)
                return log_debug_errno(errno, "Failed to duplicate the tap fd: %m");
        r = virtio_net_set_backend(vmm->net, fd);
        if (r < 0) {
                safe_close(fd);
                return log_debug_errno(r, "Failed to attach the tap to virtio-net: %m");
        }
        return 0;
}

/* Volume i: a virtio-blk of mode on a duplicate of fd, with the copy-on-write
 * layers of a frozen copy (n_layers of layer_fds and map_fds, which stay the
 * caller's but for the layers taken) under its overlay. */
static int machine_add_volume(struct vmm *vmm, unsigned i, int fd, const struct snapshot_volume *meta,
                              const int *layer_fds, const int *map_fds, unsigned n_layers, const char *overlay_dir) {
        _cleanup_close_ int dup_fd = -EBADF;
        int r;

        if (i >= VMM_VOLUMES_MAX)
                return -E2BIG;
        if (fd < 0)
                return log_debug_errno(ENXIO, "Volume %s has no file to attach (an rw volume needs --volume-fd)",
                                       meta->guest_path);
        if (!vmm->volume_meta) {
                vmm->volume_meta = calloc(VMM_VOLUMES_MAX, sizeof(*vmm->volume_meta));
                if (!vmm->volume_meta)
                        return -ENOMEM;
        }
        dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (dup_fd < 0)
                return -errno;
        r = virtio_blk_new_mode(vmm, MACHINE_VOLUME_MMIO_BASE(i), MACHINE_GSI_VOLUME(i), dup_fd, overlay_dir,
                                snapshot_volume_blk_mode(meta), &vmm->volumes[i]);
        if (r < 0)
                return log_debug_errno(r, "Failed to create the virtio-blk of volume %s: %m", meta->guest_path);
        TAKE_FD(dup_fd);
        vmm->volume_meta[i] = *meta;
        vmm->n_volumes = i + 1;
        for (unsigned k = 0; k < n_layers; k++) {
                int lfd = fcntl(layer_fds[k], F_DUPFD_CLOEXEC, 3);

                if (lfd < 0)
                        return -errno;
                r = virtio_blk_push_layer(vmm->volumes[i], lfd, map_fds[k]);
                if (r < 0) {
                        safe_close(lfd);
                        return r;
                }
        }
        return 0;
}

static int machine_add_devices(struct vmm *vmm, int disk_fd, const struct machine_config *cfg, const uint8_t *net_mac) {
        int r;

        r = serial_new(vmm, FORKD_SERIAL_PORT, cfg->console_log, &vmm->serial);
        if (r < 0)
                return log_debug_errno(r, "Failed to create the serial port: %m");
        r = i8042_init(vmm);
        if (r < 0)
                return log_debug_errno(r, "Failed to create the i8042: %m");
        r = virtio_blk_new(vmm, FORKD_VIRTIO_MMIO_BASE, MACHINE_GSI_BLK, disk_fd, cfg->overlay_dir, &vmm->blk);
        if (r < 0)
                return log_debug_errno(r, "Failed to create virtio-blk: %m");
        r = virtio_console_new(vmm, FORKD_VIRTIO_MMIO_BASE + FORKD_VIRTIO_MMIO_SIZE, MACHINE_GSI_CONSOLE,
                               &vmm->console);
        if (r < 0)
                return log_debug_errno(r, "Failed to create virtio-console: %m");
        if (cfg->agent_fd >= 0) {
                r = virtio_console_set_host_fd(vmm->console, cfg->agent_fd);
                if (r < 0)
                        return log_debug_errno(r, "Failed to attach the agent channel: %m");
        }
        if (net_mac)
                return machine_add_net(vmm, net_mac, cfg);
        return 0;
}

static int machine_boot_volumes(struct vmm *vmm, const struct machine_config *cfg) {
        for (unsigned i = 0; i < cfg->n_volumes; i++) {
                int r = machine_add_volume(vmm, i, cfg->volumes[i].fd, cfg->volumes[i].meta, NULL, NULL, 0,
                                           cfg->overlay_dir);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Last step of boot and restore: take the generation and queue the identity
 * event, so the guest re-identifies before it answers anything. Consumes vmm. */
static int machine_finish(struct vmm *vmm, uint64_t generation, struct vmm **ret) {
        int r;

        vmm->generation = generation;
        r = machine_send_identity(vmm);
        if (r < 0) {
                machine_free(vmm);
                return r;
        }
        *ret = vmm;
        return 0;
}

/* Where Debian puts a kernel's initramfs: beside it, vmlinuz[-V] -> initrd.img[-V].
 * Used when no --initrd was given and that file exists; the snapshot API takes a
 * kernel and a root disk only, and Debian's kernels need their virtio modules. */
static const char *linux_default_initrd(const char *kernel, char *buf, size_t size) {
        const char *base = strrchr(kernel, '/');
        size_t dir_len = base ? (size_t) (base - kernel) + 1 : 0;
        const char *name = kernel + dir_len, *suffix;
        int n;

        if (strncmp(name, "vmlinu", 6) != 0 || (name[6] != 'z' && name[6] != 'x'))
                return NULL;
        suffix = name + 7;
        if (*suffix != 0 && *suffix != '-')
                return NULL;
        n = snprintf(buf, size, "%.*sinitrd.img%s", (int) dir_len, kernel, suffix);
        if (n < 0 || (size_t) n >= size || access(buf, R_OK) < 0)
                return NULL;
        return buf;
}

int machine_boot(int kvm_fd, const char *kernel, const char *disk, uint64_t mem_size, const struct machine_config *cfg,
                 struct vmm **ret) {
        struct forkd_bootinfo_dev devs[3 + VMM_VOLUMES_MAX] = {
                { .virtio_id = FORKD_VIRTIO_ID_BLK, .gsi = MACHINE_GSI_BLK,
                  .mmio_base = FORKD_VIRTIO_MMIO_BASE, .mmio_size = FORKD_VIRTIO_MMIO_SIZE },
                { .virtio_id = FORKD_VIRTIO_ID_CONSOLE, .gsi = MACHINE_GSI_CONSOLE,
                  .mmio_base = FORKD_VIRTIO_MMIO_BASE + FORKD_VIRTIO_MMIO_SIZE, .mmio_size = FORKD_VIRTIO_MMIO_SIZE },
                { .virtio_id = FORKD_VIRTIO_ID_NET, .gsi = MACHINE_GSI_NET,
                  .mmio_base = MACHINE_NET_MMIO_BASE, .mmio_size = FORKD_VIRTIO_MMIO_SIZE },
        };
        /* Without a NIC the guest sees exactly the two devices it always did. */
        unsigned n_devs = cfg->net ? 3 : 2;
        struct vmm *vmm = NULL;
        _cleanup_close_ int elf_fd = -EBADF, disk_fd = -EBADF;
        uint8_t *mem;
        int r;

        if (mem_size < VMM_MEM_MIN || mem_size > VMM_MEM_MAX || mem_size % (2u << 20))
                return log_debug_errno(EINVAL, "Guest memory must be 16..3072 MiB in 2 MiB steps");
        if (cfg->n_volumes > VMM_VOLUMES_MAX)
                return log_debug_errno(E2BIG, "At most %u volumes", VMM_VOLUMES_MAX);
        if (cfg->vcpus > VMM_VCPUS_MAX)
                return log_debug_errno(EINVAL, "At most %u vCPUs", VMM_VCPUS_MAX);
        if (cfg->net && !virtio_net_mac_is_valid(cfg->net->mac))
                return log_debug_errno(EINVAL, "The NIC's MAC must be unicast and not all zeros");

        elf_fd = open(kernel, O_RDONLY | O_CLOEXEC);
        if (elf_fd < 0)
                return log_debug_errno(errno, "Failed to open guest image %s: %m", kernel);
        disk_fd = open(disk, O_RDONLY | O_CLOEXEC);
        if (disk_fd < 0)
                return log_debug_errno(errno, "Failed to open disk image %s: %m", disk);

        r = machine_new_common(kvm_fd, cfg, &vmm);
        if (r < 0)
                return r;

        vmm->mem_fd = memfd_create("forkd-guest-ram", MFD_CLOEXEC);
        if (vmm->mem_fd < 0) {
                r = -errno;
                goto fail;
        }
        if (ftruncate(vmm->mem_fd, mem_size) < 0) {
                r = -errno;
                goto fail;
        }
        mem = mmap(NULL, mem_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, vmm->mem_fd, 0);
        if (mem == MAP_FAILED) {
                r = -errno;
                goto fail;
        }
        r = vmm_set_memory(vmm, mem, mem_size);
        if (r < 0) {
                munmap(mem, mem_size);
                goto fail;
        }
        vmm->mem_owned = true;

        r = vmm_create_vcpus(vmm, cfg->vcpus ?: 1);
        if (r < 0)
                goto fail;

        vmm->cpuid = calloc(1, sizeof(struct kvm_cpuid2) + CPUID_MAX_ENTRIES * sizeof(struct kvm_cpuid_entry2));
        if (!vmm->cpuid) {
                r = -ENOMEM;
                goto fail;
        }
        r = vmm_setup_cpuid(vmm, vmm->cpuid, CPUID_MAX_ENTRIES);
        if (r < 0)
                goto fail;

        r = machine_add_devices(vmm, disk_fd, cfg, cfg->net ? cfg->net->mac : NULL);
        if (vmm->blk)
                TAKE_FD(disk_fd); /* owned by virtio-blk now */
        if (r >= 0)
                r = machine_boot_volumes(vmm, cfg);
        if (r < 0)
                goto fail;

        if (x86_is_bzimage(elf_fd)) {
                struct acpi_dev adevs[ELEMENTSOF(devs)] = {};
                _cleanup_close_ int initrd_fd = -EBADF;
                unsigned n_adevs = n_devs;

                for (unsigned i = 0; i < n_devs; i++)
                        adevs[i] = (struct acpi_dev) { .mmio_base = devs[i].mmio_base,
                                                       .mmio_size = (uint32_t) devs[i].mmio_size,
                                                       .gsi = devs[i].gsi };
                /* The volumes follow in their order: the guest names them vdb, vdc, ... */
                for (unsigned i = 0; i < vmm->n_volumes; i++)
                        adevs[n_adevs++] = (struct acpi_dev) { .mmio_base = MACHINE_VOLUME_MMIO_BASE(i),
                                                               .mmio_size = (uint32_t) FORKD_VIRTIO_MMIO_SIZE,
                                                               .gsi = MACHINE_GSI_VOLUME(i), .shared = true };
                char initrd_buf[PATH_MAX];
                const char *initrd = cfg->initrd ?: linux_default_initrd(kernel, initrd_buf, sizeof(initrd_buf));

                if (initrd) {
                        initrd_fd = open(initrd, O_RDONLY | O_CLOEXEC);
                        if (initrd_fd < 0) {
                                r = log_debug_errno(errno, "Failed to open initrd %s: %m", initrd);
                                goto fail;
                        }
                }
                snprintf(vmm->guest_kind, sizeof(vmm->guest_kind), "linux");
                r = x86_linux_setup(vmm, elf_fd, initrd_fd, cfg->cmdline ?: MACHINE_LINUX_CMDLINE, adevs, n_adevs);
        } else {
                /* The test guest is told of the root disk, the console and the NIC only. */
                snprintf(vmm->guest_kind, sizeof(vmm->guest_kind), "test");
                r = x86_boot_setup(vmm, elf_fd, devs, n_devs, NULL);
        }
        if (r < 0)
                goto fail;

        return machine_finish(vmm, 0, ret);
fail:
        machine_free(vmm);
        return r;
}

int machine_state_net(const struct vmstate *s, uint8_t *ret_mac) {
        uint8_t mac[VIRTIO_NET_MAC_LEN];

        for (uint32_t i = 0; i < s->n_devs && i < VMSTATE_MAX_DEVS; i++) {
                if (s->devs[i].kind != VMSTATE_DEV_VIRTIO_NET)
                        continue;
                if (virtio_net_state_mac(s->devs[i].blob, s->devs[i].len, mac) < 0)
                        return -EBADMSG;
                if (ret_mac)
                        memcpy(ret_mac, mac, sizeof mac);
                return 1;
        }
        return 0;
}

static int restore_devices(struct vmm *vmm, const struct vmstate *s) {
        bool have_serial = false, have_blk = false, have_console = false, have_net = false;
        unsigned n_volumes = 0;
        int r;

        for (uint32_t i = 0; i < s->n_devs; i++) {
                const struct vmstate_dev *d = &s->devs[i];

                switch (d->kind) {
                case VMSTATE_DEV_SERIAL:
                        r = have_serial ? -EBADMSG : serial_restore(vmm->serial, d->blob, d->len);
                        have_serial = true;
                        break;
                case VMSTATE_DEV_VIRTIO_BLK:
                        /* the root disk first, then the volumes in their order */
                        if (!have_blk)
                                r = virtio_mmio_restore(vmm, vmm->blk, d->blob, d->len);
                        else if (n_volumes < vmm->n_volumes)
                                r = virtio_mmio_restore(vmm, vmm->volumes[n_volumes++], d->blob, d->len);
                        else
                                r = -EBADMSG;
                        have_blk = true;
                        break;
                case VMSTATE_DEV_VIRTIO_CONSOLE:
                        r = have_console ? -EBADMSG : virtio_mmio_restore(vmm, vmm->console, d->blob, d->len);
                        have_console = true;
                        break;
                case VMSTATE_DEV_VIRTIO_NET:
                        r = have_net || !vmm->net ? -EBADMSG : virtio_mmio_restore(vmm, vmm->net, d->blob, d->len);
                        have_net = true;
                        break;
                default:
                        r = -EBADMSG;
                }
                if (r < 0)
                        return log_debug_errno(r, "Device %u (kind %u) state is invalid", i, d->kind);
        }
        if (!have_serial || !have_blk || !have_console || (vmm->net && !have_net) || n_volumes != vmm->n_volumes)
                return log_debug_errno(EBADMSG, "Snapshot lacks the state of a device");
        return 0;
}

int machine_restore(int kvm_fd, const struct snapshot *snap, uint8_t *mem, const struct machine_config *cfg,
                    struct vmm **ret) {
        const struct vmstate *s = snap->state;
        uint8_t net_mac[VIRTIO_NET_MAC_LEN];
        struct vmm *vmm = NULL;
        int disk_fd, has_net, r;

        /* Fail closed: a guest that had a network gets one, or does not run. */
        has_net = machine_state_net(s, net_mac);
        if (has_net < 0)
                return log_debug_errno(has_net, "The snapshot's NIC state is invalid");
        if (has_net && !cfg->net)
                return log_debug_errno(ENONET, "The snapshot has a NIC, but no tap was given for it");
        if (!has_net && cfg->net)
                return log_debug_errno(ENODEV, "A tap was given, but the snapshot has no NIC");

        r = machine_new_common(kvm_fd, cfg, &vmm);
        if (r < 0)
                return r;

        r = vmm_set_memory(vmm, mem, s->memory.mem_size);
        if (r < 0)
                goto fail;
        r = vmm_create_vcpus(vmm, s->n_vcpus);
        if (r < 0)
                goto fail;

        /* Every vCPU, the BSP's and the APs' MP state included, before the VM-wide state. */
        for (unsigned i = 0; i < s->n_vcpus; i++) {
                r = x86_vcpu_restore(vmm, i, &s->vcpus[i]);
                if (r < 0)
                        goto fail;
        }
        r = x86_vm_restore(vmm, s);
        if (r < 0)
                goto fail;

        disk_fd = fcntl(snap->disk_fd, F_DUPFD_CLOEXEC, 3);
        if (disk_fd < 0) {
                r = -errno;
                goto fail;
        }
        r = machine_add_devices(vmm, disk_fd, cfg, has_net ? net_mac : NULL);
        if (r < 0) {
                if (!vmm->blk)
                        safe_close(disk_fd);
                goto fail;
        }
        for (unsigned i = 0; i < snap->n_layers; i++) {
                int fd = fcntl(snap->layer_fds[i], F_DUPFD_CLOEXEC, 3);

                if (fd < 0) {
                        r = -errno;
                        goto fail;
                }
                r = virtio_blk_push_layer(vmm->blk, fd, snap->layer_map_fds[i]);
                if (r < 0) {
                        safe_close(fd);
                        goto fail;
                }
        }
        for (unsigned i = 0; i < snap->meta.n_volumes; i++) {
                const struct snapshot_volume_disk *d = &snap->volumes[i];

                r = machine_add_volume(vmm, i, d->fd, &snap->meta.volumes[i], d->layer_fds, d->map_fds, d->n_layers,
                                       cfg->overlay_dir);
                if (r < 0)
                        goto fail;
        }
        r = restore_devices(vmm, s);
        if (r < 0)
                goto fail;

        /* Tell a kvmclock-aware guest that it was paused; harmless otherwise. */
        for (unsigned i = 0; i < vmm->n_vcpus; i++)
                (void) ioctl(vmm->vcpus[i].fd, KVM_KVMCLOCK_CTRL, 0);

        /* The vCPU's CPUID travels with every generation of snapshots. */
        vmm->cpuid = calloc(1, sizeof(struct kvm_cpuid2) + CPUID_MAX_ENTRIES * sizeof(struct kvm_cpuid_entry2));
        if (!vmm->cpuid) {
                r = -ENOMEM;
                goto fail;
        }
        snprintf(vmm->guest_kind, sizeof(vmm->guest_kind), "%s", snap->meta.guest);
        vmm->cpuid->nent = s->vcpus[0].n_cpuid;
        memcpy(vmm->cpuid->entries, s->vcpus[0].cpuid, s->vcpus[0].n_cpuid * sizeof(s->vcpus[0].cpuid[0]));

        return machine_finish(vmm, s->memory.generation + 1, ret);
fail:
        machine_free(vmm);
        return r;
}

int machine_send_identity(struct vmm *vmm) {
        uint8_t seed[32];
        char seed_hex[65], json[512];
        uint8_t frame[FKA_HDR_SIZE + sizeof(json)];
        struct timespec ts;
        int n;

        if (getrandom(seed, sizeof(seed), 0) != sizeof(seed))
                return -EIO;
        for (unsigned i = 0; i < sizeof(seed); i++)
                snprintf(seed_hex + 2 * i, 3, "%02x", seed[i]);
        clock_gettime(CLOCK_REALTIME, &ts);

        n = snprintf(json, sizeof(json),
                     "{\"op\":\"identity\",\"id\":\"%s\",\"generation\":%llu,\"seed\":\"%s\",\"wall_ns\":%lld}",
                     vmm->id, (unsigned long long) vmm->generation, seed_hex,
                     (long long) ts.tv_sec * 1000000000LL + ts.tv_nsec);
        if (n < 0 || (size_t) n >= sizeof(json))
                return -ENOBUFS;

        fka_encode_header(frame, FKA_EVENT, 0, (uint32_t) n);
        memcpy(frame + FKA_HDR_SIZE, json, n);
        return virtio_console_inject(vmm, vmm->console, frame, FKA_HDR_SIZE + n);
}

struct vmm *machine_free(struct vmm *vmm) {
        if (!vmm)
                return NULL;
        serial_free(vmm->serial);
        virtio_mmio_free(vmm->blk);
        virtio_mmio_free(vmm->console);
        virtio_mmio_free(vmm->net);
        for (unsigned i = 0; i < vmm->n_volumes; i++)
                virtio_mmio_free(vmm->volumes[i]);
        free(vmm->volume_meta);
        free(vmm->cpuid);
        if (!vmm->mem_owned) {
                /* borrowed mapping (restore): vmm_free must not unmap it */
                vmm->mem = NULL;
        }
        return vmm_free(vmm);
}
