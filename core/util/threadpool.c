#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "clock.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ volatile("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* How a thread waits for the next job (a worker) or for the workers to
 * finish (the caller) before it sleeps on a condition variable: first it
 * polls with a pause for TSR_POOL_SPIN_US microseconds, then
 * TSR_POOL_YIELDS polls that each give the CPU to any other runnable thread
 * (tens of microseconds when the machine is idle, nothing wasted when it is
 * oversubscribed). Decode calls the pool a few hundred times per token with
 * microseconds between calls, and a few tens of microseconds where one
 * thread alone runs a short attention; waking a sleeping thread costs tens
 * of microseconds (more in a VM), so threads that wait briefly stay ready.
 * The spin is timed, not counted: a pause takes ~140 cycles on recent Intel
 * cores and a few on others, so the 256 pauses spun before lasted ~10 us on
 * a Xeon VM, shorter than such an attention (the o projection after it then
 * took 67 instead of 45 us: BENCHMARKS.md, fourteenth session). */
#ifndef TSR_POOL_SPIN_US
#define TSR_POOL_SPIN_US 50
#endif
#ifndef TSR_POOL_YIELDS
#define TSR_POOL_YIELDS 64
#endif

/* A wait's polls: 1 while poll number i (from 0) should go on (pause, then
 * yield); t0 holds the time of the first poll. */
typedef struct poller {
    double t0;
    int yields;
} poller;

static int poll_again(poller *p, int i) {
    if (p->yields == 0) {
        if (i == 0) p->t0 = tsr_now_seconds();
        if ((i & 15) != 15 || tsr_now_seconds() - p->t0 < TSR_POOL_SPIN_US * 1e-6) {
            cpu_relax();
            return 1;
        }
    }
    if (p->yields++ < TSR_POOL_YIELDS) {
        sched_yield();
        return 1;
    }
    return 0;
}

/* Every field read across threads is atomic (sequentially consistent where
 * a sleeper must not miss a wake: generation/sleepers, pending/main_waits). */
struct tsr_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
    atomic_uint_fast64_t generation; /* bumped for each job */
    atomic_uint_fast64_t *claimed;   /* [n_threads]: the last generation whose chunk t was claimed */
    atomic_int pending;              /* chunks of the current job not yet done, but chunk 0 */
    atomic_int sleepers;             /* workers in (or entering) work_cv */
    atomic_int main_waits;           /* the caller is in (or entering) done_cv */
    atomic_int stop;
    tsr_work_fn fn;                  /* the job: written before generation is bumped */
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

/* The next generation after seen, or seen when told to stop. */
static uint64_t wait_job(tsr_threadpool *tp, uint64_t seen) {
    poller pl = {0, 0};
    for (int i = 0;; i++) {
        uint64_t g = atomic_load(&tp->generation);
        if (g != seen || atomic_load(&tp->stop)) return g;
        if (!poll_again(&pl, i)) break;
    }
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add(&tp->sleepers, 1);
    uint64_t g;
    while ((g = atomic_load(&tp->generation)) == seen && !atomic_load(&tp->stop))
        pthread_cond_wait(&tp->work_cv, &tp->mu);
    atomic_fetch_sub(&tp->sleepers, 1);
    pthread_mutex_unlock(&tp->mu);
    return g;
}

/* 1 if this call claims chunk t of job g (once per job: by worker t or by
 * the caller, whichever comes first). */
static int claim(tsr_threadpool *tp, int t, uint64_t g) {
    uint_fast64_t c = atomic_load(&tp->claimed[t]);
    while (c < g)
        if (atomic_compare_exchange_weak(&tp->claimed[t], &c, g)) return 1;
    return 0;
}

/* Chunk t of the current job (whoever claimed it then counts it done in pending). */
static void run_chunk(tsr_threadpool *tp, int t) {
    int64_t i0, i1;
    chunk_of(tp->n, tp->n_threads, t, &i0, &i1);
    if (i1 > i0) tp->fn(tp->arg, i0, i1, t);
}

static void *worker_main(void *p) {
    worker_arg wa = *(worker_arg *)p;
    free(p);
    tsr_threadpool *tp = wa.tp;
    uint64_t seen = 0;
    tls_in_pool = 1;
    for (;;) {
        uint64_t g = wait_job(tp, seen);
        if (atomic_load(&tp->stop)) break;
        seen = g;
        if (!claim(tp, wa.tid, g)) continue; /* the caller ran it: this thread came late */
        run_chunk(tp, wa.tid);
        if (atomic_fetch_sub(&tp->pending, 1) == 1 && atomic_load(&tp->main_waits)) {
            pthread_mutex_lock(&tp->mu);
            pthread_cond_signal(&tp->done_cv);
            pthread_mutex_unlock(&tp->mu);
        }
    }
    return NULL;
}

tsr_threadpool *tsr_threadpool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    tsr_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp->n_threads = n_threads;
    tp->claimed = calloc((size_t)n_threads, sizeof *tp->claimed);
    if (!tp->claimed) {
        free(tp);
        return NULL;
    }
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
    atomic_store(&tp->stop, 1);
    pthread_cond_broadcast(&tp->work_cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n_threads && tp->threads; i++) pthread_join(tp->threads[i - 1], NULL);
    free(tp->threads);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->work_cv);
    pthread_cond_destroy(&tp->done_cv);
    free(tp->claimed);
    free(tp);
}

int tsr_threadpool_size(const tsr_threadpool *tp) { return tp ? tp->n_threads : 1; }

void tsr_threadpool_run(tsr_threadpool *tp, int64_t n, tsr_work_fn fn, void *arg) {
    if (n <= 0) return;
    if (!tp || tp->n_threads == 1 || tls_in_pool || n == 1) {
        fn(arg, 0, n, 0);
        return;
    }
    tp->fn = fn;
    tp->arg = arg;
    tp->n = n;
    atomic_store(&tp->pending, tp->n_threads - 1);
    const uint64_t g = atomic_fetch_add(&tp->generation, 1) + 1;
    if (atomic_load(&tp->sleepers) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->work_cv);
        pthread_mutex_unlock(&tp->mu);
    }

    tls_in_pool = 1;
    run_chunk(tp, 0);
    /* Any chunk whose worker has not started it yet runs here: the caller
     * never waits for a thread that is not running. Where the scheduler had
     * put a worker on the caller's CPU, each call waited for the two to take
     * turns (spin, then yield): ~100 us a call on this project's 2-vCPU VM,
     * stories260K's one-row passes 2.16 ms on two threads against 0.024 ms
     * on one (BENCHMARKS.md, CPU, twenty-third session). */
    for (int t = 1; t < tp->n_threads; t++)
        if (claim(tp, t, g)) {
            run_chunk(tp, t);
            atomic_fetch_sub(&tp->pending, 1);
        }
    tls_in_pool = 0;

    poller pl = {0, 0};
    for (int i = 0; atomic_load(&tp->pending) > 0 && poll_again(&pl, i); i++) continue;
    if (atomic_load(&tp->pending) > 0) {
        pthread_mutex_lock(&tp->mu);
        atomic_store(&tp->main_waits, 1);
        while (atomic_load(&tp->pending) > 0) pthread_cond_wait(&tp->done_cv, &tp->mu);
        atomic_store(&tp->main_waits, 0);
        pthread_mutex_unlock(&tp->mu);
    }
}
