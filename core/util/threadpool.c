#include "threadpool.h"

#include <pthread.h>
#include <stdlib.h>

struct tsr_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
    uint64_t generation;   /* bumped for each job */
    int pending;           /* workers still running the current job */
    int stop;
    tsr_work_fn fn;
    void *arg;
    int64_t n;
};

static __thread int tls_in_pool;

static void chunk_of(int64_t n, int nt, int tid, int64_t *i0, int64_t *i1) {
    int64_t base = n / nt, rem = n % nt;
    *i0 = tid * base + (tid < rem ? tid : rem);
    *i1 = *i0 + base + (tid < rem ? 1 : 0);
}

typedef struct worker_arg {
    tsr_threadpool *tp;
    int tid;
} worker_arg;

static void *worker_main(void *p) {
    worker_arg wa = *(worker_arg *)p;
    free(p);
    tsr_threadpool *tp = wa.tp;
    uint64_t seen = 0;
    tls_in_pool = 1;
    pthread_mutex_lock(&tp->mu);
    for (;;) {
        while (!tp->stop && tp->generation == seen) pthread_cond_wait(&tp->work_cv, &tp->mu);
        if (tp->stop) break;
        seen = tp->generation;
        tsr_work_fn fn = tp->fn;
        void *arg = tp->arg;
        int64_t n = tp->n;
        pthread_mutex_unlock(&tp->mu);
        int64_t i0, i1;
        chunk_of(n, tp->n_threads, wa.tid, &i0, &i1);
        if (i1 > i0) fn(arg, i0, i1, wa.tid);
        pthread_mutex_lock(&tp->mu);
        if (--tp->pending == 0) pthread_cond_signal(&tp->done_cv);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

tsr_threadpool *tsr_threadpool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    tsr_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp->n_threads = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->work_cv, NULL);
    pthread_cond_init(&tp->done_cv, NULL);
    if (n_threads > 1) {
        tp->threads = calloc((size_t)n_threads - 1, sizeof *tp->threads);
        if (!tp->threads) {
            tsr_threadpool_free(tp);
            return NULL;
        }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (wa) {
                wa->tp = tp;
                wa->tid = i;
            }
            if (!wa || pthread_create(&tp->threads[i - 1], NULL, worker_main, wa) != 0) {
                free(wa);
                tp->n_threads = i; /* only i - 1 workers exist */
                tsr_threadpool_free(tp);
                return NULL;
            }
        }
    }
    return tp;
}

void tsr_threadpool_free(tsr_threadpool *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    tp->stop = 1;
    pthread_cond_broadcast(&tp->work_cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n_threads && tp->threads; i++) pthread_join(tp->threads[i - 1], NULL);
    free(tp->threads);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->work_cv);
    pthread_cond_destroy(&tp->done_cv);
    free(tp);
}

int tsr_threadpool_size(const tsr_threadpool *tp) { return tp ? tp->n_threads : 1; }

void tsr_threadpool_run(tsr_threadpool *tp, int64_t n, tsr_work_fn fn, void *arg) {
    if (n <= 0) return;
    if (!tp || tp->n_threads == 1 || tls_in_pool || n == 1) {
        fn(arg, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&tp->mu);
    tp->fn = fn;
    tp->arg = arg;
    tp->n = n;
    tp->pending = tp->n_threads - 1;
    tp->generation++;
    pthread_cond_broadcast(&tp->work_cv);
    pthread_mutex_unlock(&tp->mu);

    int64_t i0, i1;
    tls_in_pool = 1;
    chunk_of(n, tp->n_threads, 0, &i0, &i1);
    if (i1 > i0) fn(arg, i0, i1, 0);
    tls_in_pool = 0;

    pthread_mutex_lock(&tp->mu);
    while (tp->pending > 0) pthread_cond_wait(&tp->done_cv, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
}
