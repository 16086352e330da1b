/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd-test-guest: hostile modes, for the tests that check that a guest
 * cannot hurt its VMM, forkd or the other sandboxes (tests/daemon/
 * test-hostile.py). The host turns one on with the run_code statement
 * `hostile MODE` (so also with exec of ["sh", "-c", "hostile MODE"]); the
 * reply to that request goes out normally, then the guest turns hostile for
 * good. The mode lives in guest RAM, so a snapshot or branch of a hostile
 * sandbox is hostile too. A disk whose first block starts with
 * "forkd-test-guest hostile=MODE\n" makes the guest hostile from boot, before
 * it answers anything (main.c).
 *
 *   virtio         malformed descriptor chains on every queue of every virtio
 *                  device, each device reset and attacked again, forever
 *   flood-console  the serial console (COM1), as fast as the vCPU can, forever
 *   flood-agent    agent event frames on the virtio console, forever
 *   oversized      one frame header announcing 4 GiB - 1, then bytes forever
 *   garbage        every later request answered with a garbage frame
 *   silent         never answers again (halted, waking for interrupts only)
 *   spin           never answers again (a busy loop in ring 3)
 */
#include "guest.h"

static const char *const mode_names[] = {
        [HOSTILE_VIRTIO] = "virtio",
        [HOSTILE_FLOOD_CONSOLE] = "flood-console",
        [HOSTILE_FLOOD_AGENT] = "flood-agent",
        [HOSTILE_OVERSIZED] = "oversized",
        [HOSTILE_GARBAGE] = "garbage",
        [HOSTILE_SILENT] = "silent",
        [HOSTILE_SPIN] = "spin",
};

static u32 hostile_mode, hostile_pending, garbage_count;

int hostile_parse(const u8 *s, u32 n)
{
        for (u32 m = 1; m < sizeof(mode_names) / sizeof(mode_names[0]); m++) {
                u32 l = (u32)strlen(mode_names[m]);

                if (l == n && memcmp(s, mode_names[m], n) == 0) {
                        hostile_pending = m;
                        return 0;
                }
        }
        return -1;
}

static void put_u64(u8 *p, u64 v, u32 n)
{
        for (u32 k = 0; k < n; k++)
                p[k] = (u8)(v >> (8 * k));
}

/* a raw frame: header fields as given, payload copied from p */
static void raw_frame(u32 magic, u16 type, u32 id, u32 len, const void *p, u32 plen)
{
        u8 *h = tx_begin() - AGENT_HDR_SIZE;

        put_u64(h, magic, 4);
        put_u64(h + 4, type, 2);
        h[6] = h[7] = 0;
        put_u64(h + 8, id, 4);
        put_u64(h + 12, len, 4);
        memcpy(h + AGENT_HDR_SIZE, p, plen);
        /* tx_commit() rewrites a well-formed header: post by hand */
        tx_commit_raw(AGENT_HDR_SIZE + plen);
}

int hostile_answer(u32 id)
{
        static const u8 junk[] = "\xff\xfe{\"pong\":tr\x00ue,,}]]]\x80\x81 not JSON";
        u8 noise[64];

        if (hostile_mode != HOSTILE_GARBAGE)
                return 0;
        switch (garbage_count++ % 4) {
        case 0: /* the right id, a payload that is not JSON */
                raw_frame(AGENT_MAGIC, AGENT_T_RESPONSE, id, sizeof(junk) - 1, junk, sizeof(junk) - 1);
                break;
        case 1: /* an error frame whose payload is not JSON either */
                raw_frame(AGENT_MAGIC, AGENT_T_ERROR, id, 5, "\x00\x01\x02\x03\x04", 5);
                break;
        case 2: /* an id nobody asked for */
                raw_frame(AGENT_MAGIC, AGENT_T_RESPONSE, id ^ 0x5a5a0000u, 2, "{}", 2);
                break;
        default: /* bytes without a magic */
                for (u32 k = 0; k < sizeof(noise); k++)
                        noise[k] = (u8)(hot.prng = hot.prng * 6364136223846793005ull + 1442695040888963407ull) ^ 0xa5;
                raw_frame(0xdeadbeefu, 0x7777, id, 0xffffffffu, noise, sizeof(noise));
                break;
        }
        return 1;
}

static __attribute__((noreturn)) void flood_console(void)
{
        for (;;)
                serial_puts("forkd-test-guest: hostile flood-console: the quick brown fox jumps over the lazy dog\n");
}

static __attribute__((noreturn)) void flood_agent(void)
{
        for (u64 n = 0;; n++) {
                struct out o = { .buf = tx_begin(), .cap = TXBUF_SIZE - AGENT_HDR_SIZE };

                out_s(&o, "{\"event\":\"hostile-flood\",\"n\":");
                out_u64(&o, n);
                out_s(&o, ",\"pad\":\"");
                while (o.len < 900)
                        out_s(&o, "xxxxxxxxxxxxxxxx");
                out_s(&o, "\"}");
                tx_commit(AGENT_T_EVENT, 0, o.len);
        }
}

static const u8 zeros[TXBUF_SIZE - AGENT_HDR_SIZE];

static __attribute__((noreturn)) void oversized(void)
{
        raw_frame(AGENT_MAGIC, AGENT_T_EVENT, 0, 0xffffffffu, zeros, 0);
        for (;;)
                raw_frame(0, 0, 0, 0, zeros, sizeof(zeros));
}

static __attribute__((noreturn)) void virtio_forever(void)
{
        for (u64 round = 0;; round++) {
                u32 broken = virtio_hostile_round(blk_data);

                if ((round & (round - 1)) == 0) { /* rounds 0, 1, 2, 4, 8, ...: the log stays short */
                        serial_puts("forkd-test-guest: hostile virtio round ");
                        serial_put_hex(round);
                        serial_puts(", queues broken ");
                        serial_put_hex(broken);
                        serial_puts("\n");
                }
        }
}

void hostile_start(void)
{
        u32 m = hostile_pending;

        if (!m)
                return;
        hostile_pending = 0;
        hostile_mode = m;
        tx_flush(); /* the reply to `hostile MODE` leaves first */
        serial_puts("forkd-test-guest: hostile mode ");
        serial_puts(mode_names[m]);
        serial_puts("\n");
        switch (m) {
        case HOSTILE_VIRTIO:
                virtio_forever();
        case HOSTILE_FLOOD_CONSOLE:
                flood_console();
        case HOSTILE_FLOOD_AGENT:
                flood_agent();
        case HOSTILE_OVERSIZED:
                oversized();
        case HOSTILE_SILENT:
                for (;;) {
                        irq_service(); /* acknowledge, or WAIT would return at once */
                        sys_wait();
                }
        case HOSTILE_SPIN:
                for (;;)
                        barrier();
        default:
                return; /* garbage: the agent loop goes on, hostile_answer() answers */
        }
}
