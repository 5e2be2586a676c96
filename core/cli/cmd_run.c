/* tessera run: generate text from a prompt, streamed to stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "model_opts.h"
#include "../host/engine.h"
#include "../host/slot_calls.h"

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: tessera run [ASSEMBLY] [--model PATH] [-p PROMPT | --chat MESSAGE] [-n N]\n"
            "                   [--temp T] [--top-p P] [--top-k K] [--min-p P] [--seed S]\n"
            "                   [--repeat-penalty R] [--stop STR]... [--ignore-eos] [--echo] [--profile]\n"
            "                   [--host-sampling]\n"
            "                   [--chat-format chatml|llama3|llama2] [--system TEXT]\n\n"
            "Streams the generated text to stdout; prompt and decode speed go to stderr.\n"
            "Sampling is greedy unless --temp > 0 (see core/runtime/sampling.h for the order).\n\n"
            "%s"
            "  -p, --prompt TEXT  raw prompt (BOS added when the tokenizer wants one)\n"
            "  --chat MESSAGE     a user message rendered with the model's chat template\n"
            "  -n N               tokens to generate (default 128, or what the context leaves)\n"
            "  --random-prompt N  a prompt of N pseudo-random token ids and no tokenizer (speed\n"
            "                     runs on checkpoints without one); prints the generated\n"
            "                     token ids, one a line, instead of text\n"
            "  --profile          time every op, waiting for the device after each (no CUDA\n"
            "                     graphs): a table per prefill and decode on stderr; the\n"
            "                     speeds printed are then not the engine's\n"
            "  --host-sampling    on a GPU, bring each sampled row's logits to the host and\n"
            "                     sample there instead of on the device (to measure it)\n",
            TSR_MODEL_OPTS_HELP);
}

int tsr_cmd_run(int argc, char **argv) {
    if (tsr_cli_wants_help(argc, argv)) {
        run_usage(stdout);
        return 0;
    }
    tsr_model_opts o = {.progress = 1};
    tsr_gen_params gp = {.sampling = tsr_sampling_greedy(), .max_tokens = 128};
    const char *prompt = NULL, *chat = NULL, *chat_format = NULL, *system = NULL;
    int echo = 0, n_given = 0;
    long random_prompt = 0;
    for (int i = 1; i < argc; i++) {
        int r = tsr_cli_model_opt(argc, argv, &i, &o, "run");
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i];
        if (!strcmp(a, "--ignore-eos")) {
            gp.ignore_eos = 1;
            continue;
        }
        if (!strcmp(a, "--echo")) {
            echo = 1;
            continue;
        }
        if (!strcmp(a, "--profile")) {
            o.profile = 1;
            continue;
        }
        if (!strcmp(a, "--host-sampling")) {
            o.host_sampling = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tessera run: unknown option or missing value: %s\n", a);
            return 2;
        }
        const char *v = argv[++i];
        long n;
        double d;
        if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--chat")) chat = v;
        else if (!strcmp(a, "--chat-format")) chat_format = v;
        else if (!strcmp(a, "--system")) system = v;
        else if (!strcmp(a, "--random-prompt")) {
            if (tsr_cli_parse_int("run", a, v, 1, 1 << 24, &random_prompt)) return 2;
            o.no_tokenizer = 1;
        }
        else if (!strcmp(a, "-n")) {
            if (tsr_cli_parse_int("run", a, v, 1, 1 << 24, &n)) return 2;
            gp.max_tokens = (int)n;
            n_given = 1;
        } else if (!strcmp(a, "--temp")) {
            if (tsr_cli_parse_float("run", a, v, 0, 100, &d)) return 2;
            gp.sampling.temperature = (float)d;
        } else if (!strcmp(a, "--top-p")) {
            if (tsr_cli_parse_float("run", a, v, 0, 1, &d)) return 2;
            gp.sampling.top_p = (float)d;
        } else if (!strcmp(a, "--min-p")) {
            if (tsr_cli_parse_float("run", a, v, 0, 1, &d)) return 2;
            gp.sampling.min_p = (float)d;
        } else if (!strcmp(a, "--top-k")) {
            if (tsr_cli_parse_int("run", a, v, 0, 1 << 30, &n)) return 2;
            gp.sampling.top_k = (int)n;
        } else if (!strcmp(a, "--repeat-penalty")) {
            if (tsr_cli_parse_float("run", a, v, 0.01, 100, &d)) return 2;
            gp.sampling.repetition_penalty = (float)d;
        } else if (!strcmp(a, "--seed")) {
            if (tsr_cli_parse_int("run", a, v, 0, 0x7fffffffffffffffL, &n)) return 2;
            gp.sampling.seed = (uint64_t)n;
            gp.sampling.has_seed = 1;
        } else if (!strcmp(a, "--stop")) {
            if (gp.n_stop == TSR_MAX_STOP || !v[0]) {
                fprintf(stderr, "tessera run: at most %d non-empty --stop strings\n", TSR_MAX_STOP);
                return 2;
            }
            gp.stop[gp.n_stop++] = v;
        } else {
            fprintf(stderr, "tessera run: unknown option %s\n", a);
            return 2;
        }
    }
    if (!!prompt + !!chat + !!random_prompt != 1) {
        fprintf(stderr, "tessera run: give exactly one of -p PROMPT, --chat MESSAGE or --random-prompt N\n");
        return 2;
    }
    tsr_error err;
    tsr_error_clear(&err);
    char msg[2048];
    tsr_model *m;
    if (tsr_model_load(&o, &m, &err) != TSR_OK) {
        fprintf(stderr, "tessera run: %s\n", tsr_error_format(&err, msg, sizeof msg));
        return err.code == TSR_ERR_NOMEM || err.code == TSR_ERR_IO ? 1 : 2;
    }
    const tsr_tokenizer *tok = tsr_model_get_tokenizer(m);
    char *rendered = NULL;
    int status = 1;
    int32_t *ids = NULL;
    int n_ids = 0;
    tsr_gen *g = NULL;
    const char *text = prompt;
    int parse_special = 0;
    if (random_prompt) {
        const int vocab = tsr_model_get_config(m)->vocab;
        ids = malloc((size_t)random_prompt * sizeof *ids);
        if (!ids) goto done;
        uint64_t x = 0x9e3779b97f4a7c15ull;
        for (long i = 0; i < random_prompt; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            ids[i] = (int32_t)(x % (uint64_t)vocab);
        }
        n_ids = (int)random_prompt;
        gp.ignore_eos = 1;
    } else if (chat) {
        tsr_chat_format fmt;
        if (chat_format) {
            int f = tsr_chat_format_from_name(chat_format);
            if (f < 0) {
                fprintf(stderr, "tessera run: unknown --chat-format '%s' (chatml, llama3, llama2)\n",
                        chat_format);
                status = 2;
                goto done;
            }
            fmt = (tsr_chat_format)f;
        } else if (tsr_chat_format_detect(tok, &fmt, &err) != TSR_OK || fmt == TSR_CHAT_NONE) {
            if (err.code == TSR_OK)
                tsr_error_set(&err, TSR_ERR_UNSUPPORTED,
                              "the model has no chat template; choose one with --chat-format");
            fprintf(stderr, "tessera run: %s\n", tsr_error_format(&err, msg, sizeof msg));
            status = 2;
            goto done;
        }
        tsr_chat_msg msgs[2];
        int nm = 0;
        if (system) msgs[nm++] = (tsr_chat_msg){"system", system};
        msgs[nm++] = (tsr_chat_msg){"user", chat};
        rendered = tsr_chat_render(fmt, msgs, nm, 1, NULL, &err);
        if (!rendered) {
            fprintf(stderr, "tessera run: %s\n", tsr_error_format(&err, msg, sizeof msg));
            status = 2;
            goto done;
        }
        text = rendered;
        parse_special = 1;
    }
    if (!random_prompt && tsr_tokenizer_encode(tok, text, strlen(text), tsr_tokenizer_adds_bos(tok),
                                               parse_special, &ids, &n_ids, &err) != TSR_OK) {
        fprintf(stderr, "tessera run: %s\n", tsr_error_format(&err, msg, sizeof msg));
        status = 2;
        goto done;
    }
    /* without -n, generate up to the default or until the context is full */
    if (!n_given && n_ids + gp.max_tokens > tsr_model_ctx(m) && n_ids < tsr_model_ctx(m))
        gp.max_tokens = tsr_model_ctx(m) - n_ids;
    if (tsr_gen_start(m, ids, n_ids, &gp, &g, &err) != TSR_OK) {
        fprintf(stderr, "tessera run: %s\n", tsr_error_format(&err, msg, sizeof msg));
        status = 2;
        goto done;
    }
    if (echo && text) fputs(text, stdout);
    for (;;) {
        tsr_gen_event ev;
        if (tsr_gen_step(g, &ev, &err) != TSR_OK) {
            fprintf(stderr, "\ntessera run: %s\n", tsr_error_format(&err, msg, sizeof msg));
            goto done;
        }
        if (random_prompt) /* no tokenizer: the ids, to compare assemblies' outputs */
            for (int i = 0; i < ev.n_tokens; i++) printf("%d\n", ev.tokens[i].id);
        else
            fwrite(ev.text, 1, ev.text_len, stdout);
        fflush(stdout);
        if (ev.finish != TSR_FINISH_NONE) break;
    }
    tsr_gen_stats st;
    tsr_gen_get_stats(g, &st);
    fprintf(stderr, "\n[%s] prompt %d tokens, %.1f tok/s | decode %d tokens, %.1f tok/s | load %.2f s\n",
            tsr_engine_name(tsr_model_get_engine(m)), st.n_prompt,
            st.prefill_seconds > 0 ? st.n_prompt / st.prefill_seconds : 0.0, st.n_generated - 1,
            st.decode_seconds > 0 ? (st.n_generated - 1) / st.decode_seconds : 0.0,
            tsr_model_load_seconds(m));
    if (st.draft_proposed)
        fprintf(stderr, "drafts: %lld proposed, %lld accepted (%.0f%%), %.2f tokens per decode pass\n",
                (long long)st.draft_proposed, (long long)st.draft_accepted,
                100.0 * (double)st.draft_accepted / (double)st.draft_proposed,
                st.decode_passes ? (double)(st.n_generated - 1) / (double)st.decode_passes : 0.0);
    tsr_model_profile_print(m, stderr);
    uint64_t captures, replays;
    tsr_model_graph_stats(m, &captures, &replays);
    if (captures) fprintf(stderr, "cuda graphs: %llu captured, %llu replays\n", (unsigned long long)captures,
                          (unsigned long long)replays);
    if (tsr_model_get_config(m)->n_experts > 0) {
        tsr_expert_stats es;
        tsr_expert_stats_get(tsr_engine_slot(tsr_model_get_engine(m), TSR_SLOT_EXPERT_CACHE), &es);
        const uint64_t looked = es.hits + es.misses;
        fprintf(stderr, "experts: %llu lookups, %.1f%% hits, %llu evictions, %llu resident (%.1f MiB)\n",
                (unsigned long long)looked, looked ? 100.0 * (double)es.hits / (double)looked : 0.0,
                (unsigned long long)es.evictions, (unsigned long long)es.resident,
                (double)es.resident_bytes / (1 << 20));
    }
    status = 0;
done:
    tsr_gen_free(g);
    free(ids);
    free(rendered);
    tsr_model_free(m);
    return status;
}
