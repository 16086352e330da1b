/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* forkd-oci build: an OCI image into an ext4 root file system for a forkd guest.
 * forkd runs it as a separate process: it parses hostile archives. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#include "oci.h"
#include "registry.h"

typedef struct Args {
        int image_fd;
        const char *ref, *registry_config; /* --ref: pulled from a registry instead */
        const char *agent;
        const char *out;
        const char *cache;
        bool start_cmd;
        uint64_t max_bytes;
} Args;

static void usage(FILE *f) {
        fprintf(f,
                "Usage: forkd-oci build --image-fd N --agent PATH --out ROOTFS [--cache DIR] [--start-cmd]\n"
                "                       [--max-bytes BYTES]\n"
                "       forkd-oci build --ref REF --registry-config FILE --agent PATH --out ROOTFS [...]\n"
                "\n"
                "Unpacks the OCI image on fd N (an OCI image layout directory, an oci-archive or a\n"
                "docker-archive tar), or REF (host[:port]/repo:tag or @sha256:...) pulled from a\n"
                "registry FILE configures, into an ext4 file ROOTFS with forkd's agent in /.forkd.\n"
                "Exit status: 0 done, 2 the image was refused, 1 any other failure.\n");
}

static int parse_u64(const char *s, uint64_t *ret) {
        char *end;
        unsigned long long v;

        errno = 0;
        v = strtoull(s, &end, 10);
        if (errno || end == s || *end || s[0] == '-')
                return -EINVAL;
        *ret = v;
        return 0;
}

static int parse_args(int argc, char **argv, Args *a) {
        static const struct option options[] = {
                { "image-fd", required_argument, NULL, 'i' },
                { "ref", required_argument, NULL, 'r' },
                { "registry-config", required_argument, NULL, 'R' },
                { "agent", required_argument, NULL, 'a' },
                { "out", required_argument, NULL, 'o' },
                { "cache", required_argument, NULL, 'c' },
                { "start-cmd", no_argument, NULL, 's' },
                { "max-bytes", required_argument, NULL, 'm' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        uint64_t v;
        int c;

        *a = (Args) { .image_fd = -1, .max_bytes = OCI_MAX_BYTES_DEFAULT };
        if (argc < 2 || strcmp(argv[1], "build") != 0) {
                if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
                        usage(stdout);
                        exit(0);
                }
                return -EINVAL;
        }
        optind = 2;
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
                switch (c) {
                case 'i':
                        if (parse_u64(optarg, &v) < 0 || v > INT32_MAX)
                                return -EINVAL;
                        a->image_fd = (int) v;
                        break;
                case 'r':
                        a->ref = optarg;
                        break;
                case 'R':
                        a->registry_config = optarg;
                        break;
                case 'a':
                        a->agent = optarg;
                        break;
                case 'o':
                        a->out = optarg;
                        break;
                case 'c':
                        a->cache = optarg;
                        break;
                case 's':
                        a->start_cmd = true;
                        break;
                case 'm':
                        if (parse_u64(optarg, &a->max_bytes) < 0 || a->max_bytes == 0)
                                return -EINVAL;
                        break;
                case 'h':
                        usage(stdout);
                        exit(0);
                default:
                        return -EINVAL;
                }
        if (optind != argc || (a->image_fd < 0) == !a->ref || (a->ref && !a->registry_config) || !a->agent ||
            !a->out || !a->out[0])
                return -EINVAL;
        return 0;
}

/* ---- the layer cache: DIR/<chain id hex>/{tree,done}, made under a dot name and renamed ---- */

static bool cache_entry_is_valid(int cache, const char *hex, const char *chain_id) {
        _cleanup_close_ int dir = openat(cache, hex, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        _cleanup_close_ int done = -EBADF;
        char buf[OCI_DIGEST_LEN + 2] = {};
        struct stat st;
        ssize_t n;

        if (dir < 0)
                return false;
        done = openat(dir, "done", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (done < 0)
                return false;
        n = read(done, buf, sizeof(buf) - 1);
        if (n != OCI_DIGEST_LEN + 1 || buf[OCI_DIGEST_LEN] != '\n' || strncmp(buf, chain_id, OCI_DIGEST_LEN) != 0)
                return false;
        return fstatat(dir, "tree", &st, AT_SYMLINK_NOFOLLOW) >= 0 && S_ISDIR(st.st_mode);
}

static int cache_store(int cache, int work, const char *chain_id) {
        _cleanup_free_ char *stage = NULL;
        _cleanup_close_ int sfd = -EBADF, done = -EBADF;
        const char *hex = chain_id + 7;
        char line[OCI_DIGEST_LEN + 2];
        int r;

        if (cache_entry_is_valid(cache, hex, chain_id))
                return 0;
        if (asprintf(&stage, ".stage-%.16s-%d", hex, (int) getpid()) < 0)
                return -ENOMEM;
        (void) oci_rm_rf_at(cache, stage);
        if (mkdirat(cache, stage, 0755) < 0)
                return -errno;
        sfd = openat(cache, stage, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sfd < 0) {
                r = -errno;
                goto fail;
        }
        r = oci_tree_link_copy(work, sfd, "tree");
        if (r < 0)
                goto fail;
        done = openat(sfd, "done", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        snprintf(line, sizeof(line), "%s\n", chain_id);
        if (done < 0 || write(done, line, strlen(line)) != (ssize_t) strlen(line) || fsync(done) < 0) {
                r = -errno;
                goto fail;
        }
        /* A corrupt entry (no valid "done") is replaced; a valid one someone else made stays. */
        if (!cache_entry_is_valid(cache, hex, chain_id))
                (void) oci_rm_rf_at(cache, hex);
        if (renameat(cache, stage, cache, hex) >= 0)
                return 0;
        r = errno == EEXIST || errno == ENOTEMPTY ? 0 : -errno;
fail:
        (void) oci_rm_rf_at(cache, stage);
        return r;
}

/* The longest prefix of layers whose tree is cached: its length. */
static size_t cache_lookup(int cache, const OciImage *img) {
        for (size_t k = img->n_layers; k > 0; k--)
                if (cache_entry_is_valid(cache, img->layers[k - 1].chain_id + 7, img->layers[k - 1].chain_id))
                        return k;
        return 0;
}

/* ---- build ---- */

typedef struct Build {
        int base;               /* where the work directory lives: the cache, or next to ROOTFS */
        char *base_path;
        char *work_name;
        int work;
        int cache;
        char *tmp_out;
        char pulled[OCI_DIGEST_SIZE];  /* the image manifest of a first pull: a second pulls it by digest */
        OciImage img;
} Build;

static void build_done(Build *b) {
        oci_image_done(&b->img);
        if (b->work_name && b->base >= 0)
                (void) oci_rm_rf_at(b->base, b->work_name);
        if (b->tmp_out)
                (void) unlink(b->tmp_out);
        safe_close(b->work);
        safe_close(b->cache);
        safe_close(b->base);
        free(b->base_path);
        free(b->work_name);
        free(b->tmp_out);
}

static int print_result(const Build *b, size_t cached, uint64_t tree_bytes, uint64_t rootfs_bytes, uint64_t fetched,
                        bool rootfs_cached) {
        json_object *o = json_object_new_object(), *layers = json_object_new_array();
        int r = 0;

        if (!o || !layers) {
                json_object_put(o);
                json_object_put(layers);
                return -ENOMEM;
        }
        for (size_t i = 0; i < b->img.n_layers; i++)
                json_object_array_add(layers, b->img.layers[i].digest[0] ?
                                                      json_object_new_string(b->img.layers[i].digest) : NULL);
        json_object_object_add(o, "config", oci_config_to_json(&b->img.config));
        json_object_object_add(o, "layers", layers);
        json_object_object_add(o, "cached_layers", json_object_new_int64((int64_t) cached));
        json_object_object_add(o, "tree_bytes", json_object_new_int64((int64_t) tree_bytes));
        json_object_object_add(o, "rootfs_bytes", json_object_new_int64((int64_t) rootfs_bytes));
        json_object_object_add(o, "fetched_bytes", json_object_new_int64((int64_t) fetched));
        json_object_object_add(o, "rootfs_cached", json_object_new_boolean(rootfs_cached));
        if (printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)) < 0 ||
            fflush(stdout) != 0)
                r = oci_fail(-EIO, "Cannot write the result: %m");
        json_object_put(o);
        return r;
}

static int setup_dirs(Build *b, const Args *a) {
        _cleanup_free_ char *out_copy = strdup(a->out);
        char name[] = ".forkd-oci-XXXXXX";

        if (!out_copy)
                return -ENOMEM;
        b->base_path = strdup(a->cache ?: dirname(out_copy));
        if (!b->base_path)
                return -ENOMEM;
        if (a->cache && mkdir(a->cache, 0755) < 0 && errno != EEXIST)
                return oci_fail(-errno, "Cannot make the cache directory %s: %m", a->cache);
        b->base = open(b->base_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (b->base < 0)
                return oci_fail(-errno, "Cannot open %s: %m", b->base_path);
        if (a->cache)
                b->cache = fcntl(b->base, F_DUPFD_CLOEXEC, 3);
        /* A private name: mkdtemp()'s, relative to the directory we hold open. */
        for (int tries = 0;; tries++) {
                char *x = strrchr(name, '-') + 1;

                for (int i = 0; i < 6; i++)
                        x[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[(unsigned) rand() % 36];
                if (mkdirat(b->base, name, 0700) >= 0)
                        break;
                if (errno != EEXIST || tries > 100)
                        return oci_fail(-errno, "Cannot make a work directory in %s: %m", b->base_path);
        }
        b->work_name = strdup(name);
        if (!b->work_name)
                return -ENOMEM;
        b->work = openat(b->base, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (b->work < 0 || mkdirat(b->work, "archive", 0700) < 0)
                return oci_fail(-errno, "Cannot open the work directory: %m");
        return 0;
}

/* REF pulled into the work directory as an OCI image layout ("pulled"), opened as
 * the image. What the caller got wrong (the reference, a registry forkd does not
 * know, an image the registry does not have) is refused; the rest fails. */
/* The image of --ref into WORK/pulled, less its first skip_layers layers (SIZE_MAX:
 * the manifest and config only); *ret_fetched grows by what the registry sent, and
 * *ret_fd, when it is not open yet, becomes the layout's directory. */
static int pull(const Args *a, Build *b, const char *work_path, size_t skip_layers, uint64_t *ret_fetched,
                int *ret_fd) {
        _cleanup_(oci_registry_config_freep) oci_registry_config *config = NULL;
        _cleanup_(oci_registry_freep) oci_registry *reg = NULL;
        _cleanup_(oci_ref_freep) oci_ref *ref = NULL;
        _cleanup_free_ char *why = NULL, *dir = NULL;
        oci_layout_stats st = {};
        int r, fd;

        r = oci_ref_parse(a->ref, &ref, &why);
        if (r < 0)
                return oci_refuse("%s: %s", a->ref, why ?: strerror(-r));
        r = oci_registry_config_load(a->registry_config, &config, &why);
        if (r < 0)
                return oci_fail(r, "The registry configuration %s: %s", a->registry_config, why ?: strerror(-r));
        r = oci_registry_new(config, ref->host, &reg, &why);
        if (r < 0)
                return oci_refuse("%s", why ?: strerror(-r));
        if (b->pulled[0]) {
                /* the same manifest as the first pull, even if the tag has moved since */
                free(ref->digest);
                ref->digest = strdup(b->pulled);
                if (!ref->digest)
                        return -ENOMEM;
        }
        if (asprintf(&dir, "%s/pulled", work_path) < 0)
                return -ENOMEM;
        r = oci_registry_pull_layout(reg, ref, dir, skip_layers, &st);
        if (r == -ENOENT || r == -EACCES || r == -EBADMSG)
                return oci_refuse("%s: %s", a->ref, oci_registry_error(reg) ?: strerror(-r));
        if (r < 0)
                return oci_fail(r, "%s: %s", a->ref, oci_registry_error(reg) ?: strerror(-r));
        *ret_fetched += st.fetched_bytes;
        memcpy(b->pulled, st.digest, sizeof(b->pulled));
        if (*ret_fd >= 0)
                return 0;
        fd = openat(b->work, "pulled", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return oci_fail(-errno, "Cannot open the pulled image: %m");
        *ret_fd = fd;
        return 0;
}

/* The finished root file system is cached too, as DIR/rootfs-<key>.ext4, key =
 * SHA-256 of the image's top chain ID, the agent's bytes and the guest's config:
 * the same image again is a hard link, not an unpack and a mke2fs. Nothing ever
 * writes a root disk in place (forkd-vmm's guests write to overlays), so the link
 * is as good as a copy. */
static int rootfs_key(const Build *b, const char *agent, char ret[OCI_DIGEST_LEN + 1]) {
        _cleanup_(oci_hash_freep) oci_hash *h = oci_hash_new();
        _cleanup_close_ int fd = open(agent, O_RDONLY | O_CLOEXEC);
        json_object *cfg = oci_config_to_json(&b->img.config);
        const char *top = b->img.n_layers > 0 ? b->img.layers[b->img.n_layers - 1].chain_id : "";
        const char *c;
        char buf[65536];
        ssize_t n;

        if (!h || !cfg || fd < 0) {
                json_object_put(cfg);
                return -ENOMEM;
        }
        oci_hash_update(h, "forkd-oci rootfs 1\n", strlen("forkd-oci rootfs 1\n"));
        oci_hash_update(h, top, strlen(top) + 1);
        c = json_object_to_json_string_ext(cfg, JSON_C_TO_STRING_PLAIN);
        oci_hash_update(h, c, strlen(c) + 1);
        json_object_put(cfg);
        while ((n = read(fd, buf, sizeof(buf))) > 0)
                oci_hash_update(h, buf, (size_t) n);
        if (n < 0)
                return -errno;
        oci_hash_final(h, ret);
        return 0;
}

/* 1 with ROOTFS in place from the cache, 0 when it holds none. */
static int rootfs_from_cache(const Build *b, const char *name, const Args *a) {
        struct stat st;

        if (fstatat(b->cache, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
                return 0;
        if (linkat(b->cache, name, AT_FDCWD, b->tmp_out, 0) < 0)
                return 0; /* another file system, say: build it */
        if (rename(b->tmp_out, a->out) < 0)
                return oci_fail(-errno, "Cannot put the file system at %s: %m", a->out);
        return 1;
}

static void rootfs_to_cache(const Build *b, const char *name) {
        _cleanup_free_ char *stage = NULL;

        if (asprintf(&stage, ".stage-%s-%d", name, (int) getpid()) < 0)
                return;
        (void) unlinkat(b->cache, stage, 0);
        if (linkat(AT_FDCWD, b->tmp_out, b->cache, stage, 0) < 0)
                return;
        if (renameat(b->cache, stage, b->cache, name) < 0)
                (void) unlinkat(b->cache, stage, 0);
}

/* A layer applied to the work directory's tree: stored in the cache, if any. */
static int layer_applied(size_t i, void *userdata) {
        Build *b = userdata;
        int r;

        if (b->cache < 0)
                return 0;
        r = cache_store(b->cache, b->work, b->img.layers[i].chain_id);
        return r < 0 ? oci_fail(r, "Cannot store layer %s in the cache: %s", b->img.layers[i].name, strerror(-r)) : 0;
}

static int build(const Args *a) {
        _cleanup_(build_done) Build b = { .base = -EBADF, .work = -EBADF, .cache = -EBADF };
        _cleanup_close_ int archive = -EBADF, tree = -EBADF, pulled = -EBADF;
        _cleanup_free_ char *work_path = NULL, *tree_path = NULL;
        OciBudget budget = { .files = a->max_bytes, .stream = a->max_bytes };
        uint64_t tree_bytes = 0, fetched = 0;
        char key[OCI_DIGEST_LEN + 1], rootfs_name[OCI_DIGEST_LEN + 32];
        size_t cached = 0;
        struct stat st;
        int r;

        if (a->image_fd >= 0 && fcntl(a->image_fd, F_SETFD, FD_CLOEXEC) < 0)
                return oci_fail(-errno, "--image-fd %d: %m", a->image_fd);
        srand((unsigned) getpid() ^ (unsigned) time(NULL));
        r = setup_dirs(&b, a);
        if (r < 0)
                return r;
        if (asprintf(&work_path, "%s/%s", b.base_path, b.work_name) < 0 ||
            asprintf(&tree_path, "%s/tree", work_path) < 0 ||
            asprintf(&b.tmp_out, "%s.tmp-%s", a->out, b.work_name + strlen(".forkd-oci-")) < 0)
                return -ENOMEM;
        archive = openat(b.work, "archive", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (archive < 0)
                return oci_fail(-errno, "Cannot open the work directory: %m");

        /* By reference: the manifest and config first. The layers only if they are
         * to be unpacked, and only those the cache lacks. */
        if (a->ref) {
                r = pull(a, &b, work_path, SIZE_MAX, &fetched, &pulled);
                if (r < 0)
                        return r;
        }
        r = oci_image_load(a->ref ? pulled : a->image_fd, archive, a->max_bytes, &b.img);
        if (r < 0)
                return r;
        b.img.config.start_cmd = a->start_cmd;

        if (b.cache >= 0) {
                r = rootfs_key(&b, a->agent, key);
                if (r < 0)
                        return oci_fail(r, "Cannot read the agent %s: %s", a->agent, strerror(-r));
                snprintf(rootfs_name, sizeof(rootfs_name), "rootfs-%s.ext4", key + 7);
                r = rootfs_from_cache(&b, rootfs_name, a);
                if (r < 0)
                        return r;
                if (r > 0) {
                        free(b.tmp_out);
                        b.tmp_out = NULL;
                        if (stat(a->out, &st) < 0)
                                return oci_fail(-errno, "Cannot stat %s: %m", a->out);
                        return print_result(&b, b.img.n_layers, 0, (uint64_t) st.st_size, fetched, true);
                }
                cached = cache_lookup(b.cache, &b.img);
        }
        if (a->ref && cached < b.img.n_layers) {
                r = pull(a, &b, work_path, cached, &fetched, &pulled);
                if (r < 0)
                        return r;
        }
        if (cached > 0) {
                _cleanup_close_ int entry = openat(b.cache, b.img.layers[cached - 1].chain_id + 7,
                                                   O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (entry < 0)
                        return oci_fail(-errno, "Cannot open the layer cache: %m");
                r = oci_tree_link_copy(entry, b.work, "tree");
                if (r < 0)
                        return oci_fail(r, "Cannot copy the cached tree: %s", strerror(-r));
        } else if (mkdirat(b.work, "tree", 0755) < 0)
                return oci_fail(-errno, "Cannot make the tree: %m");
        tree = openat(b.work, "tree", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (tree < 0)
                return oci_fail(-errno, "Cannot open the tree: %m");
        if (fchmod(tree, 0755) < 0)
                return oci_fail(-errno, "Cannot set the tree's mode: %m");

        /* Only the layers the cache lacks are read, each once, checked as it is
         * read: the root disk and the cached layers were built from checked ones. */
        r = oci_image_apply_layers(&b.img, cached, tree, &budget, layer_applied, &b);
        if (r < 0)
                return r;

        r = oci_tree_install_guest(tree, a->agent, &b.img.config);
        if (r < 0)
                return r;
        r = oci_tree_bytes(tree, &tree_bytes);
        if (r < 0)
                return oci_fail(r, "Cannot measure the tree: %s", strerror(-r));
        r = oci_mkfs(tree_path, work_path, b.tmp_out, tree_bytes);
        if (r < 0)
                return r;
        if (b.cache >= 0)
                rootfs_to_cache(&b, rootfs_name);
        if (stat(b.tmp_out, &st) < 0 || rename(b.tmp_out, a->out) < 0)
                return oci_fail(-errno, "Cannot put the file system at %s: %m", a->out);
        free(b.tmp_out);
        b.tmp_out = NULL;
        return print_result(&b, cached, tree_bytes, (uint64_t) st.st_size, fetched, false);
}

static void on_signal(int sig) {
        oci_interrupted = sig;
}

int main(int argc, char **argv) {
        struct sigaction sa = { .sa_handler = on_signal }; /* no SA_RESTART: waitpid() returns */
        Args a;
        int r;

        r = parse_args(argc, argv, &a);
        if (r < 0) {
                usage(stderr);
                return 1;
        }
        umask(0022);
        sigemptyset(&sa.sa_mask);
        (void) sigaction(SIGTERM, &sa, NULL);
        (void) sigaction(SIGINT, &sa, NULL);
        (void) sigaction(SIGHUP, &sa, NULL);
        r = build(&a);
        if (r < 0) {
                const char *m = oci_error_message();

                fprintf(stderr, "%s\n", m[0] ? m : strerror(-r));
                return r == -EBADMSG ? 2 : 1;
        }
        return 0;
}
