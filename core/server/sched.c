/* sched.c - the FIFO queue and the engine thread (see sched.h). */
#include "sched.h"
#include "../util/clock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct tsr_srv_sched {
    tsr_srv_backend be;
    tsr_srv_metrics *m;
    int parallel, queue;
    pthread_mutex_t mu;
    pthread_cond_t work;
    tsr_srv_job *wait_head, *wait_tail;
    int n_wait;
    tsr_srv_job **run;
    int n_run;
    int n_admitting;            /* taken off the queue, being admitted (lock released) */
    int quit, accepting, fatal;
    uint64_t next_id;
    pthread_t thread;
};

static void deadline(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static void job_free(tsr_srv_job *j) {
    tsr_srv_request_clear(&j->rq);
    tsr_srv_buf_free(&j->text);
    json_decref(j->logprobs);
    pthread_cond_destroy(&j->cond);
    free(j);
}

/* Under the lock: drop one reference; returns the job if it must be freed. */
static tsr_srv_job *unref_locked(tsr_srv_job *j) {
    return --j->refs == 0 ? j : NULL;
}

void tsr_srv_job_release(tsr_srv_sched *s, tsr_srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&s->mu);
    tsr_srv_job *dead = unref_locked(j);
    pthread_mutex_unlock(&s->mu);
    if (dead) job_free(dead);
}

static void update_load_locked(tsr_srv_sched *s) {
    tsr_srv_metrics_load(s->m, s->n_wait, s->n_run);
}

/* Under the lock: the job ended (done, woken); a finish the caller left
 * unset is why's, but for TSR_SRV_FIN_ERROR (an error has none). The
 * engine's reference is dropped by the caller. */
static void finish_locked(tsr_srv_sched *s, tsr_srv_job *j, tsr_srv_finish_reason why) {
    j->state = TSR_SRV_JOB_DONE;
    if (!j->finish && why != TSR_SRV_FIN_ERROR) j->finish = why == TSR_SRV_FIN_LENGTH ? TSR_FINISH_LENGTH
                                : why == TSR_SRV_FIN_STOP ? TSR_FINISH_STOP
                                                          : TSR_FINISH_CANCELLED;
    pthread_cond_broadcast(&j->cond);
}

static void refresh_gauges(tsr_srv_sched *s) {
    uint64_t used = 0, cap = 0, hits = 0, misses = 0;
    if (s->be.kv_usage) s->be.kv_usage(s->be.ctx, &used, &cap);
    tsr_srv_metrics_kv(s->m, used, cap);
    int has = s->be.expert_stats && s->be.expert_stats(s->be.ctx, &hits, &misses) == 0;
    tsr_srv_metrics_experts(s->m, has, hits, misses);
}

/* Engine thread, without the lock: prompt, context check, start. */
static int admit(tsr_srv_sched *s, tsr_srv_job *j, tsr_srv_error *e) {
    const tsr_srv_request *rq = &j->rq;
    int32_t *ids = NULL;
    int n = 0;
    if (s->be.prompt(s->be.ctx, rq, &ids, &n, e)) {
        free(ids);
        return -1;
    }
    const char *pparam = rq->kind == TSR_SRV_CHAT ? "messages" : "prompt";
    if (n < 1) {
        free(ids);
        return tsr_srv_error_set(e, 400, pparam, "the prompt is empty after tokenization");
    }
    int ctx = s->be.n_ctx;
    int max = rq->max_tokens;
    if (max < 0) {
        if (n >= ctx) {
            free(ids);
            return tsr_srv_error_set(e, 400, pparam,
                                     "the prompt is %d tokens; the context holds %d tokens, "
                                     "leaving no room to generate",
                                     n, ctx);
        }
        max = rq->kind == TSR_SRV_CHAT ? ctx - n : (ctx - n < 16 ? ctx - n : 16);
    } else if ((int64_t)n + max > ctx) {
        free(ids);
        return tsr_srv_error_set(e, 400, "max_tokens",
                                 "the prompt (%d tokens) plus max_tokens (%d) is %lld tokens, "
                                 "beyond the context of %d tokens",
                                 n, max, (long long)n + max, ctx);
    }
    tsr_gen_params p;
    memset(&p, 0, sizeof p);
    p.sampling = rq->sampling;
    p.max_tokens = max;
    for (int i = 0; i < rq->n_stop && i < TSR_MAX_STOP; i++) p.stop[p.n_stop++] = rq->stop[i];
    p.logprobs = rq->logprobs;
    p.top_logprobs = rq->top_logprobs;
    tsr_error err;
    tsr_error_clear(&err);
    void *gen = NULL;
    int rc = s->be.start(s->be.ctx, ids, n, &p, &gen, &err);
    free(ids);
    if (rc != TSR_OK) {
        /* The context was checked above: a range error is the KV budget,
         * held by running requests; the caller retries when one ends. */
        if (rc == TSR_ERR_RANGE) {
            tsr_srv_error_set(e, 503, "", "the KV cache cannot hold this request: %s", err.msg);
            return 1;
        }
        if (rc == TSR_ERR_INVALID) return tsr_srv_error_set(e, 400, "", "%s", err.msg);
        return tsr_srv_error_set(e, rc == TSR_ERR_NOMEM ? 503 : 500, "",
                                 "could not start the generation: %s", err.msg);
    }
    j->gen = gen;
    j->n_prompt = n;
    return 0;
}

/* Engine thread, without the lock: log-probability entries of an event. */
static json_t *event_logprobs(tsr_srv_sched *s, const tsr_gen_event *ev) {
    json_t *a = json_array();
    if (!a) return NULL;
    for (int i = 0; i < ev->n_tokens; i++) {
        const tsr_token_info *ti = &ev->tokens[i];
        char buf[256], tb[TSR_MAX_TOP_LOGPROBS][256];
        const char *tp[TSR_MAX_TOP_LOGPROBS];
        size_t tl[TSR_MAX_TOP_LOGPROBS];
        size_t n = s->be.token_text(s->be.ctx, ti->id, buf, sizeof buf);
        int n_top = ti->n_top < 0 ? 0 : ti->n_top > TSR_MAX_TOP_LOGPROBS ? TSR_MAX_TOP_LOGPROBS
                                                                         : ti->n_top;
        for (int k = 0; k < n_top; k++) {
            tl[k] = s->be.token_text(s->be.ctx, ti->top_ids[k], tb[k], sizeof tb[k]);
            if (tl[k] > sizeof tb[k]) tl[k] = sizeof tb[k];
            tp[k] = tb[k];
        }
        if (n > sizeof buf) n = sizeof buf;
        json_array_append_new(a, tsr_srv_logprob_entry(buf, n, ti->logprob, n_top, tp, tl,
                                                       ti->top_logprobs));
    }
    return a;
}

static void end_generation(tsr_srv_sched *s, tsr_srv_job *j, tsr_srv_finish_reason why) {
    tsr_gen_stats st;
    memset(&st, 0, sizeof st);
    if (j->gen) {
        if (s->be.stats) s->be.stats(s->be.ctx, j->gen, &st);
        s->be.free_gen(s->be.ctx, j->gen);
        j->gen = NULL;
    }
    tsr_srv_metrics_finish(s->m, why, j->n_prompt, j->n_generated, st.draft_proposed,
                           st.draft_accepted, st.verify_passes);
}

/* Engine thread, with the lock: running job j (run slot i) ends, why for the
 * metrics: its generation freed without the lock, the job finished
 * (finish_locked), the slot emptied, the engine's reference dropped. */
static void retire_locked(tsr_srv_sched *s, int i, tsr_srv_job *j, tsr_srv_finish_reason why) {
    pthread_mutex_unlock(&s->mu);
    end_generation(s, j, why);
    pthread_mutex_lock(&s->mu);
    finish_locked(s, j, why);
    s->run[i] = NULL;
    if (unref_locked(j)) job_free(j);
}

static void *engine_main(void *arg) {
    tsr_srv_sched *s = arg;
    int kv_blocked = 0; /* the queue's head waits for KV held by running jobs */
    pthread_mutex_lock(&s->mu);
    for (;;) {
        /* Jobs cancelled while waiting leave the queue now. */
        for (tsr_srv_job **pp = &s->wait_head; *pp;) {
            tsr_srv_job *j = *pp;
            if (!j->cancelled && !s->quit) {
                pp = &j->next;
                continue;
            }
            *pp = j->next;
            if (s->wait_tail == j) s->wait_tail = NULL;
            s->n_wait--;
            j->next = NULL;
            finish_locked(s, j, TSR_SRV_FIN_CANCELLED);
            tsr_srv_metrics_finish(s->m, TSR_SRV_FIN_CANCELLED, 0, 0, 0, 0, 0);
            if (unref_locked(j)) job_free(j);
        }
        if (!s->wait_head) s->wait_tail = NULL;
        else {
            tsr_srv_job *t = s->wait_head;
            while (t->next) t = t->next;
            s->wait_tail = t;
        }
        /* Admit from the head of the queue (FIFO: a job waiting for KV
         * holds back those behind it). */
        while (s->n_run < s->parallel && s->wait_head && !s->quit && !kv_blocked) {
            tsr_srv_job *j = s->wait_head;
            s->wait_head = j->next;
            if (!s->wait_head) s->wait_tail = NULL;
            j->next = NULL;
            s->n_wait--;
            s->n_admitting++; /* still counted against the capacity while admit() runs unlocked */
            pthread_mutex_unlock(&s->mu);
            tsr_srv_error e;
            memset(&e, 0, sizeof e);
            int rc = admit(s, j, &e);
            pthread_mutex_lock(&s->mu);
            s->n_admitting--;
            if (rc == 1 && s->n_run > 0) { /* back to the head until a running job ends */
                j->next = s->wait_head;
                s->wait_head = j;
                if (!s->wait_tail) s->wait_tail = j;
                s->n_wait++;
                kv_blocked = 1;
                break;
            }
            if (rc == 0) {
                j->state = TSR_SRV_JOB_RUNNING;
                j->status = 200;
                j->t_last_token = tsr_now_seconds();
                s->run[s->n_run++] = j;
                pthread_cond_broadcast(&j->cond);
            } else {
                j->status = e.status;
                j->error = e;
                j->finish = TSR_FINISH_NONE;
                j->state = TSR_SRV_JOB_DONE;
                pthread_cond_broadcast(&j->cond);
                tsr_srv_metrics_finish(s->m, TSR_SRV_FIN_REJECTED, 0, 0, 0, 0, 0);
                if (unref_locked(j)) job_free(j);
            }
        }
        update_load_locked(s);
        if (s->n_run == 0) {
            pthread_mutex_unlock(&s->mu);
            refresh_gauges(s);
            pthread_mutex_lock(&s->mu);
            if (s->quit) break;
            if (!s->wait_head) pthread_cond_wait(&s->work, &s->mu);
            continue;
        }
        /* One step of each running job, in order. */
        int changed = 0;
        for (int i = 0; i < s->n_run; i++) {
            tsr_srv_job *j = s->run[i];
            if (j->cancelled || s->quit) {
                retire_locked(s, i, j, TSR_SRV_FIN_CANCELLED);
                changed = 1;
                continue;
            }
            pthread_mutex_unlock(&s->mu);
            tsr_gen_event ev;
            memset(&ev, 0, sizeof ev);
            tsr_error err;
            tsr_error_clear(&err);
            int rc = s->be.step(s->be.ctx, j->gen, &ev, &err);
            double t = tsr_now_seconds();
            json_t *lp = rc == TSR_OK && j->rq.logprobs && ev.n_tokens > 0 ? event_logprobs(s, &ev)
                                                                           : NULL;
            if (rc == TSR_OK && ev.n_tokens > 0) {
                if (j->n_generated == 0) tsr_srv_metrics_ttft(s->m, t - j->t_arrival);
                else
                    for (int k = 0; k < ev.n_tokens; k++)
                        tsr_srv_metrics_itl(s->m, (t - j->t_last_token) / ev.n_tokens);
                j->t_last_token = t;
            }
            pthread_mutex_lock(&s->mu);
            if (rc != TSR_OK) {
                if (rc == TSR_ERR_DEVICE) s->fatal = 1, s->accepting = 0;
                tsr_srv_error_set(&j->error, 500, "", "generation failed: %s", err.msg);
                j->status = 500;
                j->finish = TSR_FINISH_NONE;
                retire_locked(s, i, j, TSR_SRV_FIN_ERROR);
                changed = 1;
                continue;
            }
            j->n_generated += ev.n_tokens;
            int oom = ev.text_len && tsr_srv_buf_append(&j->text, ev.text, ev.text_len);
            if (lp) {
                if (!j->logprobs) j->logprobs = json_array();
                if (j->logprobs) json_array_extend(j->logprobs, lp);
                json_decref(lp);
            }
            if (oom) {
                tsr_srv_error_set(&j->error, 500, "", "out of memory");
                j->status = 500;
                ev.finish = TSR_FINISH_NONE;
            }
            if (ev.text_len || ev.n_tokens) pthread_cond_broadcast(&j->cond);
            if (ev.finish != TSR_FINISH_NONE || oom) {
                tsr_srv_finish_reason why = oom ? TSR_SRV_FIN_ERROR
                                            : ev.finish == TSR_FINISH_STOP   ? TSR_SRV_FIN_STOP
                                            : ev.finish == TSR_FINISH_LENGTH ? TSR_SRV_FIN_LENGTH
                                                                             : TSR_SRV_FIN_CANCELLED;
                j->finish = ev.finish;
                retire_locked(s, i, j, why);
                changed = 1;
            }
        }
        if (changed) {
            kv_blocked = 0;
            int w = 0;
            for (int i = 0; i < s->n_run; i++) {
                if (s->run[i]) s->run[w++] = s->run[i];
            }
            s->n_run = w;
            pthread_mutex_unlock(&s->mu);
            refresh_gauges(s);
            pthread_mutex_lock(&s->mu);
        }
        if (s->fatal) {
            for (int i = 0; i < s->n_run; i++) s->run[i]->cancelled = 1;
            for (tsr_srv_job *j = s->wait_head; j; j = j->next) j->cancelled = 1;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int tsr_srv_sched_new(const tsr_srv_backend *be, const tsr_srv_sched_opts *o, tsr_srv_metrics *m,
                      tsr_srv_sched **out, tsr_error *err) {
    *out = NULL;
    if (!be || !be->prompt || !be->start || !be->step || !be->free_gen || !be->token_text)
        return tsr_error_set(err, TSR_ERR_INVALID, "server backend lacks a required member");
    if (o->parallel < 1 || o->queue < 0)
        return tsr_error_set(err, TSR_ERR_INVALID, "parallel must be >= 1 and queue >= 0");
    tsr_srv_sched *s = calloc(1, sizeof *s);
    if (!s) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    s->run = calloc((size_t)o->parallel, sizeof *s->run);
    if (!s->run) {
        free(s);
        return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
    }
    s->be = *be;
    s->m = m;
    s->parallel = o->parallel;
    s->queue = o->queue;
    s->accepting = 1;
    s->next_id = (uint64_t)time(NULL) << 20;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    if (pthread_create(&s->thread, NULL, engine_main, s) != 0) {
        pthread_cond_destroy(&s->work);
        pthread_mutex_destroy(&s->mu);
        free(s->run);
        free(s);
        return tsr_error_set(err, TSR_ERR_NOMEM, "could not start the engine thread");
    }
    *out = s;
    return TSR_OK;
}

void tsr_srv_sched_free(tsr_srv_sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    s->accepting = 0;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    /* The engine thread ended every job and dropped its references; what
     * HTTP threads still hold is theirs to release before this point. */
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->mu);
    free(s->run);
    free(s);
}

tsr_srv_job *tsr_srv_submit(tsr_srv_sched *s, tsr_srv_request *rq, tsr_srv_error *e) {
    tsr_srv_job *j = calloc(1, sizeof *j);
    if (!j) {
        tsr_srv_error_set(e, 503, "", "out of memory");
        return NULL;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cond, &ca);
    pthread_condattr_destroy(&ca);
    j->t_arrival = tsr_now_seconds();
    j->created = (int64_t)time(NULL);
    pthread_mutex_lock(&s->mu);
    if (!s->accepting) {
        pthread_mutex_unlock(&s->mu);
        tsr_srv_error_set(e, 503, "",
                          s->fatal ? "the engine failed; the server is going down"
                                   : "the server is shutting down");
        job_free(j);
        return NULL;
    }
    /* Capacity is parallel running + queue waiting, whatever the engine
     * thread has admitted yet; a job it is admitting (its prompt being
     * processed, the lock released) still counts: without it a request
     * arriving during a long prefill found room that was not there. */
    if ((int64_t)s->n_run + s->n_admitting + s->n_wait >= (int64_t)s->parallel + s->queue) {
        int n = s->n_wait;
        pthread_mutex_unlock(&s->mu);
        tsr_srv_error_set(e, 429, "", "the queue is full (%d waiting); retry later", n);
        job_free(j);
        return NULL;
    }
    j->rq = *rq;
    memset(rq, 0, sizeof *rq);
    snprintf(j->id, sizeof j->id, "%s-%016llx",
             j->rq.kind == TSR_SRV_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)s->next_id++);
    j->refs = 2;
    j->state = TSR_SRV_JOB_QUEUED;
    if (s->wait_tail) s->wait_tail->next = j;
    else s->wait_head = j;
    s->wait_tail = j;
    s->n_wait++;
    update_load_locked(s);
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return j;
}

tsr_srv_job_state tsr_srv_job_wait_started(tsr_srv_sched *s, tsr_srv_job *j, int timeout_ms) {
    struct timespec ts;
    deadline(&ts, timeout_ms);
    pthread_mutex_lock(&s->mu);
    while (j->state == TSR_SRV_JOB_QUEUED)
        if (pthread_cond_timedwait(&j->cond, &s->mu, &ts) == ETIMEDOUT) break;
    tsr_srv_job_state st = j->state;
    pthread_mutex_unlock(&s->mu);
    return st;
}

int tsr_srv_job_take(tsr_srv_sched *s, tsr_srv_job *j, int timeout_ms, tsr_srv_take *out) {
    memset(out, 0, sizeof *out);
    struct timespec ts;
    deadline(&ts, timeout_ms);
    pthread_mutex_lock(&s->mu);
    while (j->state != TSR_SRV_JOB_DONE && j->text.len == 0 && !j->logprobs)
        if (pthread_cond_timedwait(&j->cond, &s->mu, &ts) == ETIMEDOUT) break;
    int got = j->state == TSR_SRV_JOB_DONE || j->text.len || j->logprobs;
    if (got) {
        out->text = j->text.data;
        out->len = j->text.len;
        out->text_offset = j->text_taken;
        j->text_taken += j->text.len;
        memset(&j->text, 0, sizeof j->text);
        out->logprobs = j->logprobs;
        j->logprobs = NULL;
        out->done = j->state == TSR_SRV_JOB_DONE;
        out->finish = j->finish;
        out->status = j->status;
        out->error = j->error;
        out->n_prompt = j->n_prompt;
        out->n_generated = j->n_generated;
    }
    pthread_mutex_unlock(&s->mu);
    return got;
}

void tsr_srv_take_clear(tsr_srv_take *t) {
    if (!t) return;
    free(t->text);
    json_decref(t->logprobs);
    memset(t, 0, sizeof *t);
}

void tsr_srv_job_cancel(tsr_srv_sched *s, tsr_srv_job *j) {
    pthread_mutex_lock(&s->mu);
    if (j->state != TSR_SRV_JOB_DONE) {
        j->cancelled = 1;
        pthread_cond_signal(&s->work);
    }
    pthread_mutex_unlock(&s->mu);
}

void tsr_srv_sched_stop_accepting(tsr_srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->accepting = 0;
    pthread_mutex_unlock(&s->mu);
}

int tsr_srv_sched_active(tsr_srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->n_wait + s->n_run;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void tsr_srv_sched_cancel_all(tsr_srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_run; i++) s->run[i]->cancelled = 1;
    for (tsr_srv_job *j = s->wait_head; j; j = j->next) j->cancelled = 1;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
}

int tsr_srv_sched_fatal(tsr_srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    int f = s->fatal;
    pthread_mutex_unlock(&s->mu);
    return f;
}
