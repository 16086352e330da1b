/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* What registry-config.c hands registry.c: one configured registry. */

#include <stdbool.h>
#include <stddef.h>

#include "registry.h"

#define OCI_REGISTRIES_MAX 256U
#define OCI_CONFIG_MAX (1024U * 1024U)
#define OCI_CREDENTIALS_MAX 4096U

struct oci_registry_entry {
        char *host;
        bool insecure_http;
        char *credentials_file;
        char *ca_file;
};

struct oci_registry_config {
        char *path;
        struct oci_registry_entry *entries;
        size_t n_entries;
};

const struct oci_registry_entry *oci_registry_config_find(const oci_registry_config *c, const char *host);

/* "user:password" from path: one line, a trailing newline dropped. The buffer
 * is wiped and freed by oci_credentials_free(). */
int oci_credentials_read(const char *path, char **ret, char **ret_error);
void oci_credentials_free(char *s);
