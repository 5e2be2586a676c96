/* backend_runtime.c - the scheduler's backend on the model runtime. */
#include "backend_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../host/slot_calls.h"

static int rt_prompt(void *ctx, const tsr_srv_request *rq, int32_t **ids, int *n,
                     tsr_srv_error *e) {
    tsr_srv_runtime *rt = ctx;
    const tsr_tokenizer *tok = tsr_model_get_tokenizer(rt->m);
    tsr_error err;
    tsr_error_clear(&err);
    *ids = NULL;
    *n = 0;
    if (rq->kind == TSR_SRV_COMPLETION && rq->prompt_ids) {
        int vocab = tsr_tokenizer_vocab_size(tok);
        for (int i = 0; i < rq->n_prompt_ids; i++)
            if (rq->prompt_ids[i] >= vocab)
                return tsr_srv_error_set(e, 400, "prompt",
                                         "'prompt[%d]' is token %d; the vocabulary has %d tokens",
                                         i, rq->prompt_ids[i], vocab);
        *ids = malloc(sizeof(int32_t) * (size_t)rq->n_prompt_ids);
        if (!*ids) return tsr_srv_error_set(e, 503, "", "out of memory");
        memcpy(*ids, rq->prompt_ids, sizeof(int32_t) * (size_t)rq->n_prompt_ids);
        *n = rq->n_prompt_ids;
        return 0;
    }
    char *rendered = NULL;
    const char *text = rq->prompt;
    int parse_special = 0;
    if (rq->kind == TSR_SRV_CHAT) {
        if (!rt->has_chat) return tsr_srv_error_set(e, 400, "messages", "%s", rt->chat_problem);
        tsr_chat_msg *msgs = calloc((size_t)rq->n_msgs, sizeof *msgs);
        if (!msgs) return tsr_srv_error_set(e, 503, "", "out of memory");
        for (int i = 0; i < rq->n_msgs; i++) msgs[i] = (tsr_chat_msg){rq->msgs[i].role, rq->msgs[i].content};
        rendered = tsr_chat_render(rt->chat_format, msgs, rq->n_msgs, 1, NULL, &err);
        free(msgs);
        if (!rendered)
            return tsr_srv_error_set(e, 400, "messages", "cannot apply the chat template: %s",
                                     err.msg);
        text = rendered;
        parse_special = 1; /* as `tessera run --chat` does */
    }
    int rc = tsr_tokenizer_encode(tok, text, strlen(text), tsr_tokenizer_adds_bos(tok),
                                  parse_special, ids, n, &err);
    free(rendered);
    if (rc != TSR_OK)
        return tsr_srv_error_set(e, rc == TSR_ERR_NOMEM ? 503 : 400,
                                 rq->kind == TSR_SRV_CHAT ? "messages" : "prompt",
                                 "cannot tokenize the prompt: %s", err.msg);
    return 0;
}

static int rt_start(void *ctx, const int32_t *ids, int n, const tsr_gen_params *p, void **gen,
                    tsr_error *err) {
    tsr_srv_runtime *rt = ctx;
    tsr_gen *g = NULL;
    int rc = tsr_gen_start(rt->m, ids, n, p, &g, err);
    *gen = g;
    return rc;
}

static int rt_step(void *ctx, void *gen, tsr_gen_event *ev, tsr_error *err) {
    (void)ctx;
    return tsr_gen_step(gen, ev, err);
}

static void rt_free(void *ctx, void *gen) {
    (void)ctx;
    tsr_gen_free(gen);
}

static void rt_stats(void *ctx, void *gen, tsr_gen_stats *out) {
    (void)ctx;
    tsr_gen_get_stats(gen, out);
}

static size_t rt_token_text(void *ctx, int32_t id, char *buf, size_t size) {
    tsr_srv_runtime *rt = ctx;
    return tsr_tokenizer_token_bytes(tsr_model_get_tokenizer(rt->m), id, 1, buf, size);
}

static void rt_kv(void *ctx, uint64_t *used, uint64_t *cap) {
    tsr_srv_runtime *rt = ctx;
    tsr_model_kv_usage(rt->m, used, cap);
}

static int rt_experts(void *ctx, uint64_t *hits, uint64_t *misses) {
    tsr_srv_runtime *rt = ctx;
    const tsr_model_config *cfg = tsr_model_get_config(rt->m);
    if (!cfg || cfg->n_experts <= 0) return -1; /* dense: the slot is never attached */
    const tsr_slot_ref *s = tsr_engine_slot(tsr_model_get_engine(rt->m), TSR_SLOT_EXPERT_CACHE);
    if (!s || !s->inst) return -1;
    tsr_expert_stats st;
    tsr_expert_stats_get(s, &st);
    *hits = st.hits;
    *misses = st.misses;
    return 0;
}

int tsr_srv_runtime_init(tsr_srv_runtime *rt, tsr_model *m, const char *chat_format_name,
                         const char *model_id, tsr_srv_backend *be, tsr_error *err) {
    memset(rt, 0, sizeof *rt);
    rt->m = m;
    snprintf(rt->model_id, sizeof rt->model_id, "%s", model_id && model_id[0] ? model_id : "tessera");
    if (chat_format_name) {
        int f = tsr_chat_format_from_name(chat_format_name);
        if (f < 0 || f == TSR_CHAT_NONE)
            return tsr_error_set(err, TSR_ERR_INVALID,
                                 "unknown --chat-format '%s' (chatml, llama3, llama2)",
                                 chat_format_name);
        rt->chat_format = (tsr_chat_format)f;
        rt->has_chat = 1;
    } else {
        tsr_error e2;
        tsr_error_clear(&e2);
        tsr_chat_format f = TSR_CHAT_NONE;
        if (tsr_chat_format_detect(tsr_model_get_tokenizer(m), &f, &e2) != TSR_OK)
            snprintf(rt->chat_problem, sizeof rt->chat_problem,
                     "/v1/chat/completions needs a chat template: %.300s; start the server with "
                     "--chat-format chatml|llama3|llama2",
                     e2.msg);
        else if (f == TSR_CHAT_NONE)
            snprintf(rt->chat_problem, sizeof rt->chat_problem,
                     "/v1/chat/completions needs a chat template and this model has none; start "
                     "the server with --chat-format chatml|llama3|llama2 to choose one");
        else {
            rt->chat_format = f;
            rt->has_chat = 1;
        }
    }
    memset(be, 0, sizeof *be);
    be->ctx = rt;
    be->model_id = rt->model_id;
    be->n_ctx = tsr_model_ctx(m);
    be->prompt = rt_prompt;
    be->start = rt_start;
    be->step = rt_step;
    be->free_gen = rt_free;
    be->stats = rt_stats;
    be->token_text = rt_token_text;
    be->kv_usage = rt_kv;
    be->expert_stats = rt_experts;
    return TSR_OK;
}
