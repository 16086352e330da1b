/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* Snapshot links as OCI artifacts (src/shared/snapshot-artifact.c): the
 * manifest formatted and parsed back, what the parser refuses, and sparse
 * files through the blob encoding with their holes kept. */

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

#include "macro.h"
#include "snapshot-artifact.h"

#define H64(c) c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c
#define HA H64("a")
#define HB H64("b")
#define HC H64("c")

static void fill_link(struct artifact_link *l, struct artifact_layer *layers) {
        *l = (struct artifact_link) {};
        snprintf(l->tag, sizeof(l->tag), "child");
        snprintf(l->parent_tag, sizeof(l->parent_tag), "base");
        snprintf(l->parent_content_hash, sizeof(l->parent_content_hash), HA);
        snprintf(l->parent_digest, sizeof(l->parent_digest), "sha256:" HB);
        snprintf(l->config_digest, sizeof(l->config_digest), "sha256:" HC);
        l->config_size = 321;
        layers[0] = (struct artifact_layer) { .name = "memory.bin", .size = UINT64_C(1) << 30, .sha256 = HA,
                                              .digest = "sha256:" HB, .blob_size = 4096 + 48 };
        layers[1] = (struct artifact_layer) { .name = "vmstate.bin", .size = 1000, .sha256 = HB,
                                              .digest = "sha256:" HC, .blob_size = 1048 };
        l->layers = layers;
        l->n_layers = 2;
}

static int parse_str(const char *json, char **error) {
        struct artifact_link l = {};
        int r;

        free(*error);
        *error = NULL;
        r = artifact_manifest_parse(json, strlen(json), &l, error);
        if (r < 0)
                assert_non_null(*error);
        artifact_link_done(&l);
        return r;
}

static char *replace(const char *s, const char *from, const char *to) {
        const char *p = strstr(s, from);
        char *out;

        assert_non_null(p);
        assert_true(asprintf(&out, "%.*s%s%s", (int) (p - s), s, to, p + strlen(from)) > 0);
        return out;
}

static void test_manifest(void **state) {
        struct artifact_layer layers[2];
        struct artifact_link l, back = {};
        _cleanup_free_ char *json = NULL, *json2 = NULL, *error = NULL;
        char d1[ARTIFACT_DIGEST_SIZE], d2[ARTIFACT_DIGEST_SIZE];

        fill_link(&l, layers);
        assert_int_equal(artifact_manifest_format(&l, &json), 0);
        assert_non_null(strstr(json, "\"artifactType\":\"" ARTIFACT_TYPE "\""));
        assert_non_null(strstr(json, "\"org.forkd.parent\":\"sha256:" HB "\""));
        assert_int_equal(artifact_manifest_parse(json, strlen(json), &back, &error), 0);
        assert_string_equal(back.tag, "child");
        assert_string_equal(back.parent_tag, "base");
        assert_string_equal(back.parent_content_hash, HA);
        assert_string_equal(back.parent_digest, "sha256:" HB);
        assert_string_equal(back.config_digest, "sha256:" HC);
        assert_int_equal(back.config_size, 321);
        assert_int_equal(back.n_layers, 2);
        assert_string_equal(back.layers[0].name, "memory.bin");
        assert_true(back.layers[0].size == UINT64_C(1) << 30);
        assert_int_equal(back.layers[0].blob_size, 4096 + 48);
        assert_string_equal(back.layers[1].sha256, HB);
        assert_non_null(artifact_link_find_layer(&back, "vmstate.bin"));
        assert_null(artifact_link_find_layer(&back, "disk.img"));

        /* The same link, the same bytes: the digest is stable. */
        assert_int_equal(artifact_manifest_format(&back, &json2), 0);
        assert_string_equal(json, json2);
        artifact_digest_buffer(json, strlen(json), d1);
        artifact_digest_buffer(json2, strlen(json2), d2);
        assert_string_equal(d1, d2);
        artifact_link_done(&back);

        /* A root has no parent annotations. */
        free(json);
        l.parent_tag[0] = l.parent_content_hash[0] = l.parent_digest[0] = 0;
        assert_int_equal(artifact_manifest_format(&l, &json), 0);
        assert_null(strstr(json, "org.forkd.parent"));
        assert_int_equal(parse_str(json, &error), 0);

        /* Refused: other types, bad digests, names, sizes, duplicates, half a parent. */
        {
                const char *bad[][2] = {
                        { "\"artifactType\":\"" ARTIFACT_TYPE "\"", "\"artifactType\":\"application/x-other\"" },
                        { "\"schemaVersion\":2", "\"schemaVersion\":1" },
                        { "\"mediaType\":\"" ARTIFACT_CONFIG_MEDIA_TYPE "\"", "\"mediaType\":\"application/json\"" },
                        { "\"digest\":\"sha256:" HC "\"", "\"digest\":\"sha512:" HC "\"" },
                        { "\"size\":321", "\"size\":99999999" },
                        { "\"memory.bin\"", "\"..\"" },
                        { "\"memory.bin\"", "\"snapshot.json\"" },
                        { "\"memory.bin\"", "\"memory.bin.sha256\"" },
                        { "\"memory.bin\"", "\"vmstate.bin\"" },
                        { "\"1073741824\"", "\"-1\"" },
                        { "\"1073741824\"", "\"99999999999999999999\"" },
                        { "\"org.forkd.tag\":\"child\"", "\"org.forkd.tag\":\"../x\"" },
                        { "\"org.forkd.parent.tag\":\"base\",", "" },
                        { "\"" ARTIFACT_LAYER_MEDIA_TYPE "\"", "\"application/vnd.oci.image.layer.v1.tar\"" },
                };
                free(json);
                fill_link(&l, layers);
                assert_int_equal(artifact_manifest_format(&l, &json), 0);
                for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                        _cleanup_free_ char *b = replace(json, bad[i][0], bad[i][1]);

                        assert_int_equal(parse_str(b, &error), -EBADMSG);
                }
                assert_int_equal(parse_str("{", &error), -EBADMSG);
                assert_int_equal(parse_str("[]", &error), -EBADMSG);
        }
}

static int tmpfile_fd(void) {
        char path[] = "/tmp/test-snapshot-artifact-XXXXXX";
        int fd = mkstemp(path);

        assert_true(fd >= 0);
        unlink(path);
        return fd;
}

static void round_trip(const uint8_t *pattern, size_t plen, uint64_t size, const uint64_t *offsets, size_t n_offsets,
                       uint64_t *ret_blob_size) {
        _cleanup_close_ int in = tmpfile_fd(), blob = tmpfile_fd(), out = tmpfile_fd(), blob2 = tmpfile_fd();
        char digest[ARTIFACT_DIGEST_SIZE], digest2[ARTIFACT_DIGEST_SIZE], sha[SNAPSHOT_HASH_LEN + 1],
                sha2[SNAPSHOT_HASH_LEN + 1];
        _cleanup_free_ char *error = NULL;
        _cleanup_free_ uint8_t *a = malloc(size ?: 1), *b = malloc(size ?: 1);
        uint64_t blob_size = 0, blob_size2 = 0;
        struct stat st;

        assert_non_null(a);
        assert_non_null(b);
        memset(a, 0, size);
        assert_int_equal(ftruncate(in, (off_t) size), 0);
        for (size_t i = 0; i < n_offsets; i++) {
                assert_int_equal(pwrite(in, pattern, plen, (off_t) offsets[i]), (ssize_t) plen);
                memcpy(a + offsets[i], pattern, plen);
        }
        assert_int_equal(sparse_blob_encode(in, size, blob, NULL, digest, &blob_size, sha), 0);
        assert_int_equal(lseek(blob, 0, SEEK_CUR), (off_t) blob_size);
        assert_int_equal(sparse_blob_decode(blob, blob_size, out, size, sha, &error), 0);
        assert_int_equal(fstat(out, &st), 0);
        assert_int_equal(st.st_size, (off_t) size);
        assert_int_equal(pread(out, b, size, 0), (ssize_t) size);
        assert_memory_equal(a, b, size);

        /* The decoded file encodes to the same blob. */
        assert_int_equal(sparse_blob_encode(out, size, blob2, NULL, digest2, &blob_size2, sha2), 0);
        assert_string_equal(digest, digest2);
        assert_string_equal(sha, sha2);
        assert_int_equal(blob_size, blob_size2);
        /* With the content's hash known (a hash cache), the same blob, that hash returned. */
        {
                char digest3[ARTIFACT_DIGEST_SIZE], sha3[SNAPSHOT_HASH_LEN + 1];
                uint64_t blob_size3 = 0;

                assert_int_equal(sparse_blob_encode(out, size, -1, HA, digest3, &blob_size3, sha3), 0);
                assert_string_equal(digest, digest3);
                assert_string_equal(sha3, HA);
                assert_int_equal(blob_size, blob_size3);
        }

        /* A wrong hash, a wrong size, a flipped data byte, a cut blob: refused. */
        {
                _cleanup_close_ int o2 = tmpfile_fd();
                assert_int_equal(sparse_blob_decode(blob, blob_size, o2, size, HA, &error), -EBADMSG);
        }
        {
                _cleanup_close_ int o2 = tmpfile_fd();
                assert_int_equal(sparse_blob_decode(blob, blob_size, o2, size + 1, sha, &error), -EBADMSG);
        }
        {
                _cleanup_close_ int o2 = tmpfile_fd();
                assert_int_equal(sparse_blob_decode(blob, blob_size - 1, o2, size, sha, &error), -EBADMSG);
        }
        if (n_offsets > 0) {
                _cleanup_close_ int o2 = tmpfile_fd();
                uint8_t c;

                assert_int_equal(pread(blob, &c, 1, 32), 1);
                c ^= 0xff;
                assert_int_equal(pwrite(blob, &c, 1, 32), 1);
                assert_int_equal(sparse_blob_decode(blob, blob_size, o2, size, sha, &error), -EBADMSG);
                assert_non_null(error);
        }
        *ret_blob_size = blob_size;
}

static void test_sparse(void **state) {
        uint8_t page[4096], odd[10];
        uint64_t blob_size;

        memset(page, 0x5a, sizeof(page));
        memset(odd, 0x11, sizeof(odd));

        /* 64 MiB with three pages of data: the blob is the pages and a few headers. */
        {
                const uint64_t off[] = { 0, 5 * 4096, (UINT64_C(64) << 20) - 4096 };
                round_trip(page, sizeof(page), UINT64_C(64) << 20, off, ELEMENTSOF(off), &blob_size);
                assert_true(blob_size <= 3 * 4096 + 16 * 6);
        }
        /* Runs across a window boundary, an odd tail, a file of holes only, an empty file. */
        {
                const uint64_t off[] = { SPARSE_BLOB_WINDOW - 4096, SPARSE_BLOB_WINDOW, 3 * SPARSE_BLOB_WINDOW + 3 };
                round_trip(page, sizeof(page), 3 * SPARSE_BLOB_WINDOW + 4099 + 5, off, ELEMENTSOF(off), &blob_size);
        }
        {
                const uint64_t off[] = { 4095 };
                round_trip(odd, sizeof(odd), 4105, off, ELEMENTSOF(off), &blob_size);
        }
        round_trip(NULL, 0, UINT64_C(8) << 20, NULL, 0, &blob_size);
        assert_int_equal(blob_size, 32);
        round_trip(NULL, 0, 0, NULL, 0, &blob_size);
        assert_int_equal(blob_size, 32);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_manifest),
                cmocka_unit_test(test_sparse),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
