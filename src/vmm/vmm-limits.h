/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * disk_rate and net_rate in a running VMM.
 *
 * Every disk of the VM (the root disk and the volumes) draws on one limiter,
 * disk_rate's; the NIC has one limiter per direction, each with net_rate's
 * figures (tx: frames from the guest, rx: frames to it). A device whose
 * request finds no tokens leaves it in its queue (virtq_unpop) and stops
 * processing that queue; vmm_limits_defer() then arms a timer for when the
 * tokens will be there. The timer raises SIGIO at the vCPU thread (a timerfd
 * cannot: it has no fasync, so it could not interrupt KVM_RUN), and the run
 * loop's vmm_limits_service() kicks the waiting queues again once it is due.
 * The time requests waited is added to the stats page's *_throttled_usec.
 *
 * vmm->limits is NULL until a limit is set; everything here then costs a
 * NULL check.
 */

#include <stdbool.h>
#include <stdint.h>

#include <json-c/json.h>

#include "fork-options.h"
#include "vmm.h"

/* Set the limits (NULL: leave that one as it is; a rate with nothing set
 * removes it). Refills the buckets and re-runs queues that waited. */
int vmm_limits_set(struct vmm *vmm, const struct rate_limit *disk, const struct rate_limit *net);
/* The keys "disk_rate" and "net_rate" of a request (a spawn's, or a
 * set_limits op's), each absent, null or a rate (rate_limit_from_json()):
 * checks both, fills the ones given (*ret_has_*), changes nothing. */
int vmm_limits_parse_json(struct json_object *req, struct rate_limit *ret_disk, bool *ret_has_disk,
                          struct rate_limit *ret_net, bool *ret_has_net, char err[static FORK_OPTION_ERROR_MAX]);
/* set_limits: parse, then vmm_limits_set(); the reply gets the limits as they
 * then stand. */
int vmm_limits_set_json(struct vmm *vmm, struct json_object *req, struct json_object *reply,
                        char err[static FORK_OPTION_ERROR_MAX]);

/* The limits as they stand (zero: none). */
void vmm_limits_get(struct vmm *vmm, struct rate_limit *ret_disk, struct rate_limit *ret_net);

/* For virtio-blk: true if a request of bytes may run now (the tokens are
 * taken); false if it must wait (the timer is armed). */
bool vmm_limits_disk_take(struct vmm *vmm, uint64_t bytes);
/* For virtio-net's tx: the same for one frame of bytes. */
bool vmm_limits_net_tx_take(struct vmm *vmm, uint64_t bytes);
/* For virtio-net's rx: true if a frame may be received now (nothing taken);
 * then vmm_limits_net_rx_charge() with its size once one was. */
bool vmm_limits_net_rx_take(struct vmm *vmm);
void vmm_limits_net_rx_charge(struct vmm *vmm, uint64_t bytes);
/* Whether rx waits for tokens (then the tap need not be polled). */
bool vmm_limits_net_rx_waiting(struct vmm *vmm);

/* From the run loop, between runs: re-run the queues whose wait is over. */
void vmm_limits_service(struct vmm *vmm);

void vmm_limits_free(struct vmm *vmm);
