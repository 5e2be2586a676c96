/*
 * tokenizer_gguf.c - the vocabulary stored in GGUF metadata (tokenizer.ggml.*):
 * model "llama" (SentencePiece scores, token types, byte tokens) or "gpt2"
 * (byte-level BPE with merges; the pre-tokenizer chosen by tokenizer.ggml.pre).
 */
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#include "../format/gguf.h"

/* llama.cpp's token types */
enum { GT_NORMAL = 1, GT_UNKNOWN = 2, GT_CONTROL = 3, GT_USER = 4, GT_UNUSED = 5, GT_BYTE = 6 };

static int get_opt_int(const tsr_gguf *g, const char *key, int64_t *v, const char *name, tsr_error *err) {
    int i = tsr_gguf_find(g, key);
    if (i < 0) return 0;
    if (tsr_gguf_get_int(g, i, v) != 0)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, name, 0, 0, "%s: not an integer", key);
    return 1;
}

static int get_opt_bool(const tsr_gguf *g, const char *key, int *v, const char *name, tsr_error *err) {
    int i = tsr_gguf_find(g, key);
    if (i < 0) return 0;
    if (tsr_gguf_get_bool(g, i, v) != 0)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, name, 0, 0, "%s: not a boolean", key);
    return 1;
}

/* A string value copied to a NUL-terminated buffer of size cap; -1 if absent. */
static int get_str(const tsr_gguf *g, const char *key, char *buf, size_t cap) {
    int i = tsr_gguf_find(g, key);
    if (i < 0 || tsr_gguf_kv_type(g, i) != TSR_GGUF_STRING) return -1;
    uint64_t n;
    const char *s = tsr_gguf_get_str(g, i, &n);
    if (!s) return -1;
    if (n >= cap) n = cap - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    return 0;
}

/* A numeric array of elem type and exactly n elements, or NULL if absent. */
static int get_arr(const tsr_gguf *g, const char *key, tsr_gguf_type want, uint64_t n, const void **data,
                   const char *name, tsr_error *err) {
    *data = NULL;
    int i = tsr_gguf_find(g, key);
    if (i < 0) return TSR_OK;
    tsr_gguf_type et;
    uint64_t m;
    if (tsr_gguf_kv_type(g, i) != TSR_GGUF_ARRAY || tsr_gguf_get_arr(g, i, &et, &m, data) != 0 || et != want)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, name, 0, 0, "%s: not an array of %s", key,
                                want == TSR_GGUF_FLOAT32 ? "float32" : "int32");
    if (m != n)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, name, 0, 0,
                                "%s has %llu elements, tokenizer.ggml.tokens has %llu", key,
                                (unsigned long long)m, (unsigned long long)n);
    return TSR_OK;
}

int tsr_tokenizer_load_gguf(const tsr_gguf *g, const char *name, tsr_tokenizer **out, tsr_error *err) {
    *out = NULL;
    tsr_error_clear(err);
    if (!name) name = "gguf";
    char model[64], pre[64];
    if (get_str(g, "tokenizer.ggml.model", model, sizeof model) != 0)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, name, 0, 0, "tokenizer.ggml.model is missing or not a string");
    tsr_tok_kind kind;
    if (!strcmp(model, "llama")) kind = TSR_TOK_SPM;
    else if (!strcmp(model, "gpt2")) kind = TSR_TOK_BPE;
    else
        return tsr_error_set_at(err, TSR_ERR_UNSUPPORTED, name, 0, 0,
                                "tokenizer.ggml.model '%s' is not supported (llama, gpt2)", model);

    int ti = tsr_gguf_find(g, "tokenizer.ggml.tokens");
    tsr_gguf_type et;
    uint64_t n;
    const void *unused;
    if (ti < 0 || tsr_gguf_kv_type(g, ti) != TSR_GGUF_ARRAY || tsr_gguf_get_arr(g, ti, &et, &n, &unused) != 0 ||
        et != TSR_GGUF_STRING)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, name, 0, 0,
                                "tokenizer.ggml.tokens is missing or not an array of strings");
    if (n == 0 || n > TSR_TOKEN_MAX_ID)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, name, 0, 0, "tokenizer.ggml.tokens: %llu tokens is out of range",
                                (unsigned long long)n);
    /* metadata arrays are packed, not aligned: read elements with memcpy */
    const unsigned char *scores, *types;
    int rc = get_arr(g, "tokenizer.ggml.scores", TSR_GGUF_FLOAT32, n, (const void **)&scores, name, err);
    if (!rc) rc = get_arr(g, "tokenizer.ggml.token_type", TSR_GGUF_INT32, n, (const void **)&types, name, err);
    if (rc) return rc;

    tsr_tokenizer *t = tsr_tok_new(kind, (int)n, err);
    if (!t) return err ? err->code : TSR_ERR_NOMEM;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len;
        const char *s = tsr_gguf_get_arr_str(g, ti, i, &len);
        if (!s) {
            rc = tsr_error_set_at(err, TSR_ERR_FORMAT, name, 0, 0, "tokenizer.ggml.tokens[%llu] is unreadable",
                                  (unsigned long long)i);
            goto fail;
        }
        int32_t ty = GT_NORMAL;
        if (types) memcpy(&ty, types + 4 * i, 4);
        uint8_t attr;
        switch (ty) {
        case GT_UNKNOWN: attr = TSR_TOKATTR_UNKNOWN; break;
        case GT_CONTROL: attr = TSR_TOKATTR_CONTROL; break;
        case GT_USER: attr = TSR_TOKATTR_USER | TSR_TOKATTR_RAW; break;
        case GT_UNUSED: attr = TSR_TOKATTR_UNUSED; break;
        case GT_BYTE: attr = TSR_TOKATTR_BYTE; break;
        default: attr = TSR_TOKATTR_NORMAL; break;
        }
        if (ty == GT_UNKNOWN && t->unk < 0) t->unk = (int)i;
        if (len > TSR_TOKEN_MAX_TEXT) { /* keep the id, refuse to use an absurd text */
            rc = tsr_error_set_at(err, TSR_ERR_FORMAT, name, 0, 0,
                                  "tokenizer.ggml.tokens[%llu] is %llu bytes long (limit %d)",
                                  (unsigned long long)i, (unsigned long long)len, TSR_TOKEN_MAX_TEXT);
            goto fail;
        }
        if ((rc = tsr_tok_set(t, (int)i, s, (size_t)len, attr, "tokenizer.ggml.tokens", err))) goto fail;
        if (scores) memcpy(&t->score[i], scores + 4 * i, 4);
        else if (kind == TSR_TOK_SPM) t->score[i] = -(float)i;
    }

    int64_t v;
    int b;
    if (kind == TSR_TOK_SPM) {
        t->bos = 1;
        t->eos = 2;
        t->add_bos = 1;
        t->spm_space_prefix = 1;
        t->spm_escape = 1;
        if (t->unk < 0 && n > 0) t->unk = 0;
    }
    const char *ids[3] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.unknown_token_id"};
    int *dst[3] = {&t->bos, &t->eos, &t->unk};
    for (int k = 0; k < 3; k++) {
        int r = get_opt_int(g, ids[k], &v, name, err);
        if (r < 0) { rc = r; goto fail; }
        if (r == 1) {
            if (v < 0 || (uint64_t)v >= n) {
                rc = tsr_error_set_at(err, TSR_ERR_FORMAT, name, 0, 0, "%s %lld is not a token id", ids[k],
                                      (long long)v);
                goto fail;
            }
            *dst[k] = (int)v;
        }
    }
    int r = get_opt_bool(g, "tokenizer.ggml.add_bos_token", &b, name, err);
    if (r < 0) { rc = r; goto fail; }
    if (r == 1) t->add_bos = b;
    r = get_opt_bool(g, "tokenizer.ggml.add_space_prefix", &b, name, err);
    if (r < 0) { rc = r; goto fail; }
    if (r == 1 && kind == TSR_TOK_SPM) t->spm_space_prefix = b;
    if (kind == TSR_TOK_BPE) {
        r = get_opt_bool(g, "tokenizer.ggml.add_prefix_space", &b, name, err);
        if (r < 0) { rc = r; goto fail; }
        if (r == 1) t->add_prefix_space = b;
    }
    /* The BOS/EOS tokens are control tokens whatever their stored type says. */
    if (t->bos >= 0 && t->text[t->bos]) t->attr[t->bos] |= TSR_TOKATTR_CONTROL;
    if (t->eos >= 0 && t->text[t->eos]) t->attr[t->eos] |= TSR_TOKATTR_CONTROL;
    if ((rc = tsr_tok_finish(t, err))) goto fail;

    if (kind == TSR_TOK_BPE) {
        if (get_str(g, "tokenizer.ggml.pre", pre, sizeof pre) != 0) snprintf(pre, sizeof pre, "default");
        if ((rc = tsr_bpe_add_pre_named(t, pre, err))) goto fail;
        int mi = tsr_gguf_find(g, "tokenizer.ggml.merges");
        uint64_t nm = 0;
        if (mi >= 0 && (tsr_gguf_kv_type(g, mi) != TSR_GGUF_ARRAY || tsr_gguf_get_arr(g, mi, &et, &nm, &unused) != 0 ||
                        et != TSR_GGUF_STRING)) {
            rc = tsr_error_set_at(err, TSR_ERR_FORMAT, name, 0, 0, "tokenizer.ggml.merges: not an array of strings");
            goto fail;
        }
        if ((rc = tsr_bpe_reserve_merges(t, nm, err))) goto fail;
        for (uint64_t i = 0; i < nm; i++) {
            uint64_t len;
            const char *s = tsr_gguf_get_arr_str(g, mi, i, &len);
            char what[64];
            snprintf(what, sizeof what, "tokenizer.ggml.merges[%llu]", (unsigned long long)i);
            const char *sp = s ? memchr(s, ' ', (size_t)len) : NULL;
            if (!sp) {
                rc = tsr_error_set_at(err, TSR_ERR_FORMAT, name, 0, 0, "%s: not two tokens separated by a space", what);
                goto fail;
            }
            size_t al = (size_t)(sp - s);
            if ((rc = tsr_bpe_add_merge(t, s, al, sp + 1, (size_t)len - al - 1, what, err))) {
                if (err) snprintf(err->file, sizeof err->file, "%s", name);
                goto fail;
            }
        }
    }
    int ci = tsr_gguf_find(g, "tokenizer.chat_template");
    if (ci >= 0 && tsr_gguf_kv_type(g, ci) == TSR_GGUF_STRING) {
        uint64_t len;
        const char *s = tsr_gguf_get_str(g, ci, &len);
        if (s && len < (1u << 24)) {
            t->chat_template = malloc((size_t)len + 1);
            if (!t->chat_template) {
                rc = tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
                goto fail;
            }
            memcpy(t->chat_template, s, (size_t)len);
            t->chat_template[len] = '\0';
        }
    }
    *out = t;
    return TSR_OK;
fail:
    if (err && !err->file[0]) snprintf(err->file, sizeof err->file, "%s", name);
    tsr_tokenizer_free(t);
    return rc;
}
