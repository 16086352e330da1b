/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>

#include "macro.h"
#include "worker.h"

#define WORKER_THREADS_MAX 64

struct job {
        worker_fn_t fn;
        worker_done_t done;
        void *userdata;
        int r;
        struct job *next;
};

struct WorkerPool {
        pthread_mutex_t lock;
        pthread_cond_t cond;
        struct job *queue, *queue_tail; /* waiting for a thread */
        struct job *finished;           /* waiting for the event loop */
        unsigned pending;               /* loop thread only */
        bool quit;
        pthread_t threads[WORKER_THREADS_MAX];
        unsigned n_threads;
        int efd;
        sd_event_source *source;
};

static void *worker_main(void *arg) {
        WorkerPool *p = arg;

        pthread_mutex_lock(&p->lock);
        for (;;) {
                struct job *j;

                while (!p->queue && !p->quit)
                        pthread_cond_wait(&p->cond, &p->lock);
                if (p->quit)
                        break;
                j = p->queue;
                p->queue = j->next;
                if (!p->queue)
                        p->queue_tail = NULL;
                pthread_mutex_unlock(&p->lock);

                j->r = j->fn(j->userdata);

                pthread_mutex_lock(&p->lock);
                j->next = p->finished;
                p->finished = j;
                (void) eventfd_write(p->efd, 1);
        }
        pthread_mutex_unlock(&p->lock);
        return NULL;
}

static int on_finished(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        WorkerPool *p = userdata;
        struct job *list, *rev = NULL;
        eventfd_t v;

        (void) eventfd_read(p->efd, &v);
        pthread_mutex_lock(&p->lock);
        list = TAKE_PTR(p->finished);
        pthread_mutex_unlock(&p->lock);

        /* Oldest first. */
        while (list) {
                struct job *n = list->next;
                list->next = rev;
                rev = list;
                list = n;
        }
        while (rev) {
                struct job *j = rev;
                rev = j->next;
                p->pending--;
                j->done(j->r, j->userdata);
                free(j);
        }
        return 0;
}

int worker_pool_new(sd_event *e, unsigned n_threads, WorkerPool **ret) {
        WorkerPool *p;
        sigset_t all, old;
        int r;

        if (n_threads == 0 || n_threads > WORKER_THREADS_MAX)
                return -EINVAL;
        p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;
        pthread_mutex_init(&p->lock, NULL);
        pthread_cond_init(&p->cond, NULL);
        p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (p->efd < 0) {
                r = -errno;
                goto fail;
        }
        r = sd_event_add_io(e, &p->source, p->efd, EPOLLIN, on_finished, p);
        if (r < 0)
                goto fail;
        (void) sd_event_source_set_description(p->source, "worker-finished");

        /* Workers take no signals: those are for the event loop. */
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        for (; p->n_threads < n_threads; p->n_threads++) {
                r = -pthread_create(&p->threads[p->n_threads], NULL, worker_main, p);
                if (r < 0)
                        break;
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (r < 0)
                goto fail;
        *ret = p;
        return 0;
fail:
        worker_pool_free(p);
        return r;
}

WorkerPool *worker_pool_free(WorkerPool *p) {
        if (!p)
                return NULL;
        pthread_mutex_lock(&p->lock);
        p->quit = true;
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
        for (unsigned i = 0; i < p->n_threads; i++)
                pthread_join(p->threads[i], NULL);
        for (struct job *j = p->queue, *n; j; j = n) {
                n = j->next;
                free(j);
        }
        for (struct job *j = p->finished, *n; j; j = n) {
                n = j->next;
                free(j);
        }
        sd_event_source_disable_unref(p->source);
        safe_close(p->efd);
        pthread_cond_destroy(&p->cond);
        pthread_mutex_destroy(&p->lock);
        free(p);
        return NULL;
}

int worker_pool_submit(WorkerPool *p, worker_fn_t fn, worker_done_t done, void *userdata) {
        struct job *j = calloc(1, sizeof(*j));

        if (!j)
                return -ENOMEM;
        *j = (struct job) { .fn = fn, .done = done, .userdata = userdata };
        pthread_mutex_lock(&p->lock);
        if (p->queue_tail)
                p->queue_tail->next = j;
        else
                p->queue = j;
        p->queue_tail = j;
        pthread_cond_signal(&p->cond);
        pthread_mutex_unlock(&p->lock);
        p->pending++;
        return 0;
}

unsigned worker_pool_pending(const WorkerPool *p) {
        return p ? p->pending : 0;
}
