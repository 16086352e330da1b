/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * forkd-test-guest: the agent (docs/agent-protocol.md), in ring 3.
 * Frame reassembly with resynchronisation, the request ops, the identity
 * event, and the idle loop.
 */
#include "guest.h"

#define AGENT_NAME "forkd-test-guest"

/* ---- replies ---- */

void agent_reply_error(u32 id, const char *msg)
{
        struct out o = { .buf = tx_begin(), .cap = TXBUF_SIZE - AGENT_HDR_SIZE };

        out_s(&o, "{\"error\":\"");
        out_s(&o, msg);
        out_s(&o, "\"}");
        tx_commit(AGENT_T_ERROR, id, o.len);
}

/* {"error": msg, "errno": ename}: a refusal that an errno says (docs/agent-protocol.md) */
void agent_reply_error_errno(u32 id, const char *msg, const char *ename)
{
        struct out o = { .buf = tx_begin(), .cap = TXBUF_SIZE - AGENT_HDR_SIZE };

        out_s(&o, "{\"error\":\"");
        out_s(&o, msg);
        out_s(&o, "\",\"errno\":\"");
        out_s(&o, ename);
        out_s(&o, "\"}");
        tx_commit(AGENT_T_ERROR, id, o.len);
}

void agent_reply(u32 id, struct out *o)
{
        if (o->overflow) {
                agent_reply_error(id, "reply too large");
                return;
        }
        tx_commit(AGENT_T_RESPONSE, id, o->len);
}

struct out agent_reply_begin(void)
{
        struct out o = { .buf = tx_begin(), .cap = TXBUF_SIZE - AGENT_HDR_SIZE };

        return o;
}

/* ---- identity ---- */

static u64 splitmix64(u64 *state)
{
        u64 z = (*state += 0x9e3779b97f4a7c15ull);

        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
}

static int hexval(u8 c)
{
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
                return c - 'A' + 10;
        return -1;
}

u64 wall_ns_now(void)
{
        u64 delta, khz = boot.tsc_khz;

        if (!hot.have_identity)
                return 0;
        if (!khz)
                return hot.wall_ns_at_event;
        delta = rdtsc() - hot.tsc_at_event;
        /* delta * 1e6 / khz without 128-bit arithmetic */
        return hot.wall_ns_at_event + (delta / khz) * 1000000ull + (delta % khz) * 1000000ull / khz;
}

static void handle_identity_event(const u8 *p, u32 n)
{
        struct jfield f[5] = {
                { .key = "op" }, { .key = "id" }, { .key = "generation" }, { .key = "seed" },
                { .key = "wall_ns" },
        };
        u64 gen, wall;
        u8 seed[32];

        if (json_fields(p, n, f, 5) < 0 || !json_str_eq(p, &f[0], "identity") ||
            (f[1].type != J_STR && f[1].type != J_NUM) || f[1].len > ID_MAX ||
            json_u64(p, &f[2], &gen) < 0 || json_u64(p, &f[4], &wall) < 0 ||
            f[3].type != J_STR || f[3].len != 64 + 2) {
                serial_puts("forkd-test-guest: malformed identity event ignored\n");
                return;
        }
        for (u32 k = 0; k < 32; k++) {
                int hi = hexval(p[f[3].off + 1 + 2 * k]), lo = hexval(p[f[3].off + 2 + 2 * k]);

                if (hi < 0 || lo < 0) {
                        serial_puts("forkd-test-guest: identity event with a bad seed ignored\n");
                        return;
                }
                seed[k] = (u8)(hi << 4 | lo);
        }
        hot.tsc_at_event = rdtsc();
        hot.wall_ns_at_event = wall;
        hot.generation = gen;
        memcpy(hot.seed, seed, 32);
        memcpy(hot.id_raw, p + f[1].off, f[1].len);
        hot.id_len = f[1].len;
        hot.prng = fnv1a(FNV_BASIS, seed, 32);
        (void)splitmix64(&hot.prng);
        hot.have_identity = 1;
        /* a restore: a new channel, whose host asked none of the reads waiting */
        if (hot.procs_live)
                procs_channel_reset();
}

/* ---- ops ---- */

static int scratch_range(const u8 *p, struct jfield *f, u64 *off, u64 *pages)
{
        if (json_u64(p, &f[0], off) < 0 || json_u64(p, &f[1], pages) < 0)
                return -1;
        if (*off > boot.scratch_pages || *pages > boot.scratch_pages - *off)
                return -2;
        return 0;
}

static u64 scratch_checksum(u64 off, u64 pages)
{
        return fnv1a(FNV_BASIS, (const void *)(SCRATCH_BASE + off * PAGE_SIZE), pages * PAGE_SIZE);
}

static void reply_pages(u32 id, u64 pages, u64 sum)
{
        struct out o = agent_reply_begin();

        out_s(&o, "{\"pages\":");
        out_u64(&o, pages);
        out_s(&o, ",\"checksum\":\"");
        out_hex64(&o, sum);
        out_s(&o, "\"}");
        agent_reply(id, &o);
}

static void op_mem(u32 id, const u8 *p, u32 n, int write)
{
        struct jfield f[3] = { { .key = "offset_pages" }, { .key = "pages" }, { .key = "pattern" } };
        u64 off, pages, pattern = 0;
        int r;

        (void)json_fields(p, n, f, 3); /* already validated by the caller */
        r = scratch_range(p, f, &off, &pages);
        if (r == 0 && write && (json_u64(p, &f[2], &pattern) < 0 || pattern > 0xffffffffull))
                r = -1;
        if (r == -1) {
                agent_reply_error(id, "bad arguments");
                return;
        }
        if (r == -2) {
                agent_reply_error(id, "range outside the scratch area");
                return;
        }
        if (write) {
                volatile u32 *w = (volatile u32 *)(SCRATCH_BASE + off * PAGE_SIZE);
                u64 words = pages * (PAGE_SIZE / 4);

                for (u64 k = 0; k < words; k++)
                        w[k] = (u32)pattern;
        }
        reply_pages(id, pages, scratch_checksum(off, pages));
}

static void reply_block(u32 id, u64 block, int with_first)
{
        struct out o = agent_reply_begin();
        u32 first;

        memcpy(&first, blk_data, 4);
        out_s(&o, "{\"block\":");
        out_u64(&o, block);
        out_s(&o, ",\"checksum\":\"");
        out_hex64(&o, fnv1a(FNV_BASIS, blk_data, sizeof(blk_data)));
        out_s(&o, "\"");
        if (with_first) {
                out_s(&o, ",\"first\":");
                out_u64(&o, first);
        }
        out_s(&o, "}");
        agent_reply(id, &o);
}

static void op_disk(u32 id, const u8 *p, u32 n, int write)
{
        struct jfield f[2] = { { .key = "block" }, { .key = "pattern" } };
        u64 block, pattern = 0;

        (void)json_fields(p, n, f, 2);
        if (json_u64(p, &f[0], &block) < 0 ||
            (write && (json_u64(p, &f[1], &pattern) < 0 || pattern > 0xffffffffull))) {
                agent_reply_error(id, "bad arguments");
                return;
        }
        if (!boot.have_blk) {
                agent_reply_error(id, "no disk");
                return;
        }
        if (block >= boot.blk_blocks) {
                agent_reply_error(id, "block beyond the end of the disk");
                return;
        }
        if (write) {
                u32 *w = (u32 *)blk_data;

                for (u32 k = 0; k < sizeof(blk_data) / 4; k++)
                        w[k] = (u32)pattern;
                if (blk_rw(1, block, blk_data) < 0) {
                        agent_reply_error(id, "disk write failed");
                        return;
                }
                memset(blk_data, 0, sizeof(blk_data));
        }
        if (blk_rw(0, block, blk_data) < 0) {
                agent_reply_error(id, "disk read failed");
                return;
        }
        reply_block(id, block, !write);
}

static void op_identity(u32 id)
{
        struct out o = agent_reply_begin();

        out_s(&o, "{\"id\":");
        if (hot.have_identity)
                out_raw(&o, hot.id_raw, hot.id_len);
        else
                out_s(&o, "null");
        out_s(&o, ",\"generation\":");
        out_u64(&o, hot.generation);
        out_s(&o, ",\"seed\":\"");
        out_hexbytes(&o, hot.seed, 32);
        out_s(&o, "\",\"wall_ns\":");
        out_u64(&o, wall_ns_now());
        out_s(&o, "}");
        agent_reply(id, &o);
}

static void handle_request(u32 id, const u8 *p, u32 n)
{
        struct jfield op = { .key = "op" };

        /*
         * A request that came in the same receive pass as `hostile MODE` (the
         * host can send the next one as soon as the reply has left, before
         * the idle loop calls hostile_start()) meets the guest hostile too.
         */
        hostile_start();
        if (hostile_answer(id))
                return;
        if (json_fields(p, n, &op, 1) < 0) {
                agent_reply_error(id, "payload is not a JSON object");
                return;
        }
        if (op.type != J_STR) {
                agent_reply_error(id, "missing or non-string op");
                return;
        }
        if (json_str_eq(p, &op, "ping")) {
                struct out o = agent_reply_begin();

                out_s(&o, "{\"pong\":true,\"pid\":1,\"numpy_version\":null,\"agent\":\"" AGENT_NAME "\"}");
                agent_reply(id, &o);
        } else if (json_str_eq(p, &op, "identity")) {
                op_identity(id);
        } else if (json_str_eq(p, &op, "cpus")) {
                struct out o = agent_reply_begin();

                smp_out(&o);
                agent_reply(id, &o);
        } else if (json_str_eq(p, &op, "mem_write")) {
                op_mem(id, p, n, 1);
        } else if (json_str_eq(p, &op, "mem_checksum")) {
                op_mem(id, p, n, 0);
        } else if (json_str_eq(p, &op, "disk_write")) {
                op_disk(id, p, n, 1);
        } else if (json_str_eq(p, &op, "disk_read")) {
                op_disk(id, p, n, 0);
        } else if (json_str_eq(p, &op, "shutdown")) {
                struct out o = agent_reply_begin();

                out_s(&o, "{\"ok\":true}");
                agent_reply(id, &o);
                tx_flush();
                sys_poweroff();
        } else if (json_str_eq(p, &op, "run_code")) {
                op_run_code(id, p, n);
        } else if (json_str_eq(p, &op, "hash_files")) {
                op_hash_files(id, p, n);
        } else if (json_str_eq(p, &op, "write_file")) {
                op_write_file(id, p, n);
        } else if (json_str_eq(p, &op, "read_file")) {
                op_read_file(id, p, n);
        } else if (json_str_eq(p, &op, "exec")) {
                op_exec(id, p, n);
        } else if (json_str_eq(p, &op, "eval")) {
                agent_reply_error(id, "not supported by the test guest");
        } else if (procs_op(id, p, n, &op)) {
                /* answered, or waiting (a proc_read's long poll) */
        } else {
                agent_reply_error(id, "unknown op");
        }
}

static void dispatch(void)
{
        struct rx_stream *r = &hot.rx;

        if (r->type == AGENT_T_REQUEST)
                handle_request(r->id, hot.payload, r->want);
        else if (r->type == AGENT_T_EVENT)
                handle_identity_event(hot.payload, r->want);
        /* responses and errors from the host are not expected: dropped */
}

/* ---- frame reassembly ---- */

static u32 le32(const u8 *p)
{
        return (u32)p[0] | (u32)p[1] << 8 | (u32)p[2] << 16 | (u32)p[3] << 24;
}

/*
 * The header in r->hdr is bad (wrong magic, flags or type): answer one error
 * with id 0 and look for the next magic, first in the header bytes after the
 * bad magic, then in the stream.
 */
static void header_bad(struct rx_stream *r)
{
        u32 w = 0;

        agent_reply_error(0, "bad frame header");
        for (u32 k = 1; k < r->hdr_len; k++) {
                w = (w >> 8) | (u32)r->hdr[k] << 24;
                if (k >= 4 && w == AGENT_MAGIC) {
                        u32 start = k - 3;

                        memmove(r->hdr, r->hdr + start, r->hdr_len - start);
                        r->hdr_len -= start;
                        r->mode = RX_HDR;
                        return;
                }
        }
        /* keep the trailing (up to 3) bytes in the window; zero bytes never match */
        r->window = w;
        r->hdr_len = 0;
        r->mode = RX_RESYNC;
}

/* r->hdr holds at least 4 bytes: check what can be checked so far */
static void header_step(struct rx_stream *r)
{
        u16 type, flags;
        u32 len;

        while (r->mode == RX_HDR && r->hdr_len >= 4) {
                if (le32(r->hdr) != AGENT_MAGIC) {
                        header_bad(r);
                        continue;
                }
                if (r->hdr_len < AGENT_HDR_SIZE)
                        return;
                type = (u16)(r->hdr[4] | r->hdr[5] << 8);
                flags = (u16)(r->hdr[6] | r->hdr[7] << 8);
                if (flags != 0 || type < AGENT_T_REQUEST || type > AGENT_T_EVENT) {
                        header_bad(r);
                        continue;
                }
                r->type = type;
                r->id = le32(r->hdr + 8);
                len = le32(r->hdr + 12);
                r->hdr_len = 0;
                r->want = len;
                r->got = 0;
                if (len > PAYLOAD_MAX) {
                        agent_reply_error_errno(r->id, "payload too large", "EMSGSIZE");
                        r->mode = RX_DISCARD;
                } else if (len == 0) {
                        dispatch();
                } else {
                        r->mode = RX_PAYLOAD;
                }
        }
}

void agent_feed(const u8 *p, u32 n)
{
        struct rx_stream *r = &hot.rx;

        while (n) {
                u32 take;

                switch (r->mode) {
                case RX_RESYNC:
                        r->window = (r->window >> 8) | (u32)*p << 24;
                        p++;
                        n--;
                        if (r->window == AGENT_MAGIC) {
                                memcpy(r->hdr, &r->window, 4);
                                r->hdr_len = 4;
                                r->window = 0;
                                r->mode = RX_HDR;
                        }
                        break;
                case RX_HDR:
                        take = AGENT_HDR_SIZE - r->hdr_len;
                        if (take > n)
                                take = n;
                        /* before the magic is confirmed, take only up to 4 bytes */
                        if (r->hdr_len < 4 && take > 4 - r->hdr_len)
                                take = 4 - r->hdr_len;
                        memcpy(r->hdr + r->hdr_len, p, take);
                        r->hdr_len += take;
                        p += take;
                        n -= take;
                        header_step(r);
                        break;
                case RX_PAYLOAD:
                        take = r->want - r->got;
                        if (take > n)
                                take = n;
                        memcpy(hot.payload + r->got, p, take);
                        r->got += take;
                        p += take;
                        n -= take;
                        if (r->got == r->want) {
                                r->mode = RX_HDR;
                                dispatch();
                        }
                        break;
                case RX_DISCARD:
                        take = r->want - r->got;
                        if (take > n)
                                take = n;
                        r->got += take;
                        p += take;
                        n -= take;
                        if (r->got == r->want)
                                r->mode = RX_HDR;
                        break;
                default:
                        r->mode = RX_HDR;
                        r->hdr_len = 0;
                        break;
                }
        }
}

/* ---- idle loop ---- */

/* The BSP's LAPIC timer, one-shot, ns from now (KVM's APIC timer runs at 1 GHz,
 * divided by 1), or stopped for 0. Written only while processes need it. */
static void proc_timer(u64 ns)
{
        static u32 armed;

        if (ns == 0 && !armed)
                return;
        if (ns > 0xffffffffull)
                ns = 0xffffffffull; /* about 4 s: it is armed again then */
        mmio_write32(LAPIC_BASE + 0x3e0, 0xb);
        mmio_write32(LAPIC_BASE + 0x320, PROC_TIMER_VEC);
        mmio_write32(LAPIC_BASE + 0x380, (u32)ns);
        armed = ns != 0;
}

__attribute__((noreturn)) void agent_loop(void)
{
        for (;;) {
                u64 ns = 0;
                u32 n;

                irq_service();           /* clears pending before the scan */
                n = cons_rx_poll();
                hostile_start();         /* after `hostile MODE`: does not return (but for garbage) */
                if (hot.procs_live) {
                        ns = procs_step();
                        /* a deadline closer than a wakeup costs: turn again at once */
                        if (ns > 0 && ns < 20000)
                                n = 1;
                }
                proc_timer(n ? 0 : ns);
                if (n == 0)
                        sys_wait();      /* returns at once if an interrupt came since */
        }
}
