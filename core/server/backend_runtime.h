/*
 * backend_runtime.h - the server's engine backend on the model runtime
 * (runtime.h): prompts through the tokenizer and chat template, generation
 * through tsr_gen_*, KV usage, drafter and expert-cache statistics. Every
 * call runs on the scheduler's engine thread.
 */
#ifndef TSR_SRV_BACKEND_RUNTIME_H
#define TSR_SRV_BACKEND_RUNTIME_H

#include "../runtime/runtime.h"
#include "sched.h"

typedef struct tsr_srv_runtime {
    tsr_model *m;
    int has_chat;              /* a chat format is known */
    tsr_chat_format chat_format;
    char chat_problem[512];    /* why chat is refused when !has_chat */
    char model_id[256];
} tsr_srv_runtime;

/* Wire a loaded model (borrowed). chat_format_name: "chatml", "llama3",
 * "llama2", or NULL to use the template the tokenizer carries; a model
 * without one serves completions only and answers chat with a 400 that
 * names --chat-format. An unknown name is TSR_ERR_INVALID. */
int tsr_srv_runtime_init(tsr_srv_runtime *rt, tsr_model *m, const char *chat_format_name,
                         const char *model_id, tsr_srv_backend *be, tsr_error *err);

#endif /* TSR_SRV_BACKEND_RUNTIME_H */
