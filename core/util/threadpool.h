/*
 * threadpool.h - a fixed pool of worker threads for data-parallel loops.
 * The calling thread takes part as worker 0, so a pool of n threads starts
 * n - 1 workers. Nested calls from inside a work function run inline.
 */
#ifndef TSR_THREADPOOL_H
#define TSR_THREADPOOL_H

#include <stdint.h>

#include "../../slots/tsr_plugin.h"

typedef struct tsr_threadpool tsr_threadpool;

/* n_threads >= 1. Returns NULL on failure. */
tsr_threadpool *tsr_threadpool_new(int n_threads);
void tsr_threadpool_free(tsr_threadpool *tp);
int tsr_threadpool_size(const tsr_threadpool *tp);

/* Split [0, n) into one contiguous chunk per thread, run fn on each, wait.
 * Chunk t runs once, as worker t (fn's tid), on worker t's thread or, where
 * that has not started it by the time the caller is done with chunk 0, on
 * the caller's: the caller never waits for a thread that is not running.
 * tp may be NULL (runs inline as worker 0). */
void tsr_threadpool_run(tsr_threadpool *tp, int64_t n, tsr_work_fn fn, void *arg);

#endif /* TSR_THREADPOOL_H */
