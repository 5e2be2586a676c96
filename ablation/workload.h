/*
 * workload.h - a versioned workload file (ablation/workloads/NAME.json): cases
 * of chat messages with fixed output lengths, how many warm-up runs and
 * repetitions, and a fixed text for the quality score path.
 *
 *   {"schema": "tessera.workload/1", "name": "ci", "version": 1,
 *    "warmup": 1, "repeats": 3,
 *    "score_text": "...",
 *    "cases": [{"name": "chat-short", "kind": "chat", "max_tokens": 32,
 *               "messages": [{"role": "user", "content": "..."}]}, ...]}
 *
 * kind is one of chat, code, math, tool_call, summary, agent. Errors name
 * the file and the field (jansson's line:column for malformed JSON).
 */
#ifndef TSR_ABL_WORKLOAD_H
#define TSR_ABL_WORKLOAD_H

#include <jansson.h>

#include "../core/util/error.h"

#define TSR_WORKLOAD_SCHEMA "tessera.workload/1"
#define TSR_WORKLOAD_MAX_CASES 1024
#define TSR_WORKLOAD_MAX_TOKENS 65536
#define TSR_WORKLOAD_MAX_REPEATS 1000

typedef struct tsr_wl_case {
    char *name;
    char *kind;
    int max_tokens;
    json_t *messages;  /* the array of {role, content} as written (owned) */
} tsr_wl_case;

typedef struct tsr_workload {
    char *path;
    char *name;
    int version;
    int warmup;
    int repeats;
    char *score_text;  /* "" when absent */
    tsr_wl_case *cases;
    int n_cases;
} tsr_workload;

int tsr_workload_load(const char *path, tsr_workload **out, tsr_error *err);
/* The same from memory (tests); path names it in errors. */
int tsr_workload_parse(const char *buf, size_t len, const char *path, tsr_workload **out,
                       tsr_error *err);
void tsr_workload_free(tsr_workload *w);

#endif
