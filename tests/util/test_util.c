/* Tests of core/util: checked sizes, errors, the thread pool. */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/util/checked.h"
#include "core/util/error.h"
#include "core/util/threadpool.h"

static void test_checked_overflow(void **state) {
    (void)state;
    uint64_t r = 0;
    assert_int_equal(tsr_mul_u64(1ull << 32, 1ull << 31, &r), 0);
    assert_true(r == (1ull << 63));
    assert_int_equal(tsr_mul_u64(1ull << 32, 1ull << 32, &r), -1);
    assert_int_equal(tsr_add_u64(UINT64_MAX, 1, &r), -1);
    assert_int_equal(tsr_muladd_u64(3, 5, 7, &r), 0);
    assert_true(r == 22);
    int64_t dims[3] = {1 << 21, 1 << 21, 1 << 21};
    assert_int_equal(tsr_dims_product(dims, 3, &r), 0);
    int64_t big[3] = {1ll << 40, 1ll << 40, 2};
    assert_int_equal(tsr_dims_product(big, 3, &r), -1);
    int64_t neg[2] = {4, -1};
    assert_int_equal(tsr_dims_product(neg, 2, &r), -1);
    assert_true(tsr_range_in(10, 5, 15));
    assert_false(tsr_range_in(10, 6, 15));
    assert_false(tsr_range_in(UINT64_MAX, 2, UINT64_MAX));
}

static void test_error_format(void **state) {
    (void)state;
    tsr_error e;
    char buf[2048];
    tsr_error_clear(&e);
    assert_int_equal(e.code, TSR_OK);
    assert_int_equal(tsr_error_set_at(&e, TSR_ERR_FORMAT, "a.yaml", 3, 7, "bad key '%s'", "x"),
                     TSR_ERR_FORMAT);
    assert_string_equal(tsr_error_format(&e, buf, sizeof buf), "a.yaml:3:7: error: bad key 'x'");
    tsr_error_prefix(&e, "loading %s", "engine");
    assert_string_equal(e.msg, "loading engine: bad key 'x'");
    assert_int_equal(tsr_error_set(NULL, TSR_ERR_NOMEM, "ignored"), TSR_ERR_NOMEM);
}

typedef struct sum_arg {
    int64_t *out;
    int seen[8];
} sum_arg;

static void fill_squares(void *p, int64_t i0, int64_t i1, int tid) {
    sum_arg *a = p;
    a->seen[tid] = 1;
    for (int64_t i = i0; i < i1; i++) a->out[i] = i * i;
}

static void test_threadpool_covers_range(void **state) {
    (void)state;
    for (int nt = 1; nt <= 4; nt++) {
        tsr_threadpool *tp = tsr_threadpool_new(nt);
        assert_non_null(tp);
        for (int64_t n = 0; n < 50; n += 7) {
            int64_t out[64];
            memset(out, 0xff, sizeof out);
            sum_arg a = {out, {0}};
            tsr_threadpool_run(tp, n, fill_squares, &a);
            for (int64_t i = 0; i < n; i++) assert_true(out[i] == i * i);
            assert_true(out[n] == -1); /* nothing past the end */
        }
        tsr_threadpool_free(tp);
    }
}

typedef struct count_arg {
    _Atomic int64_t items;
    int64_t calls;
} count_arg;

static void count_items(void *p, int64_t i0, int64_t i1, int tid) {
    count_arg *a = p;
    (void)tid;
    atomic_fetch_add(&a->items, i1 - i0);
}

/* Many short jobs back to back (the workers poll between them) and jobs after
 * pauses long enough that they sleep: every item of every job runs once, and
 * each run returns only after its job is done. */
static void test_threadpool_spin_and_sleep(void **state) {
    (void)state;
    for (int nt = 2; nt <= 3; nt++) {
        tsr_threadpool *tp = tsr_threadpool_new(nt);
        assert_non_null(tp);
        count_arg a = {0, 0};
        int64_t expect = 0;
        for (int job = 0; job < 5000; job++) {
            int64_t n = 2 + job % 5;
            tsr_threadpool_run(tp, n, count_items, &a);
            expect += n;
            assert_true(atomic_load(&a.items) == expect);
            if (job % 1000 == 0) {
                struct timespec ts = {0, 5 * 1000 * 1000}; /* 5 ms: past the polling, workers sleep */
                nanosleep(&ts, NULL);
            }
        }
        tsr_threadpool_free(tp);
    }
}

/* A chunk's runs and the thread that ran it, for test_threadpool_stalled_worker. */
typedef struct chunk_arg {
    _Atomic int runs[4];
    pthread_t by[4];
} chunk_arg;

static void note_chunk(void *p, int64_t i0, int64_t i1, int tid) {
    chunk_arg *a = p;
    (void)i0, (void)i1;
    atomic_fetch_add(&a->runs[tid], 1);
    a->by[tid] = pthread_self();
}

static atomic_int stall_release, stalled;

static void stall(int sig) { /* holds the thread it runs on until released */
    (void)sig;
    atomic_fetch_add(&stalled, 1);
    while (!atomic_load(&stall_release)) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    atomic_fetch_sub(&stalled, 1);
}

/* Every thread of the process but this one held in stall (the pool's
 * workers: the test starts no others); returns how many. */
static int stall_other_threads(void) {
    struct sigaction sa = {0};
    sa.sa_handler = stall;
    assert_int_equal(sigaction(SIGUSR1, &sa, NULL), 0);
    atomic_store(&stall_release, 0);
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    const pid_t self = (pid_t)syscall(SYS_gettid);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const pid_t t = (pid_t)atoi(e->d_name);
        if (t <= 0 || t == self) continue;
        assert_int_equal(syscall(SYS_tgkill, getpid(), t, SIGUSR1), 0);
        n++;
    }
    closedir(d);
    while (atomic_load(&stalled) < n) sched_yield();
    return n;
}

/* A worker that does not run (held here by a signal handler; a scheduler
 * that put it on the caller's CPU did much the same): each job still
 * completes, the caller running that worker's chunk itself, once; after
 * the worker is released, every chunk of every job still runs exactly
 * once. (A pool whose caller waits for each worker hangs here: alarm.) */
static void test_threadpool_stalled_worker(void **state) {
    (void)state;
    for (int nt = 2; nt <= 4; nt++) {
        tsr_threadpool *tp = tsr_threadpool_new(nt);
        assert_non_null(tp);
        tsr_threadpool_run(tp, 64, count_items, &(count_arg){0, 0});
        struct timespec idle = {0, 20 * 1000 * 1000}; /* past the polling: each worker waits on the */
        nanosleep(&idle, NULL);                        /* condition variable, its mutex not held */
        assert_int_equal(stall_other_threads(), nt - 1);
        alarm(30);
        for (int job = 0; job < 100; job++) {
            chunk_arg a = {0};
            tsr_threadpool_run(tp, 64, note_chunk, &a);
            for (int t = 0; t < nt; t++) {
                assert_int_equal(atomic_load(&a.runs[t]), 1);
                assert_true(pthread_equal(a.by[t], pthread_self()));
            }
        }
        atomic_store(&stall_release, 1);
        while (atomic_load(&stalled) > 0) sched_yield();
        for (int job = 0; job < 2000; job++) {
            chunk_arg a = {0};
            tsr_threadpool_run(tp, 64, note_chunk, &a);
            for (int t = 0; t < nt; t++) assert_int_equal(atomic_load(&a.runs[t]), 1);
        }
        alarm(0);
        tsr_threadpool_free(tp);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checked_overflow),
        cmocka_unit_test(test_error_format),
        cmocka_unit_test(test_threadpool_covers_range),
        cmocka_unit_test(test_threadpool_spin_and_sleep),
        cmocka_unit_test(test_threadpool_stalled_worker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
