/*
 * tokenizer_json.c - Hugging Face tokenizer.json (byte-level BPE) and the
 * tokenizer_config.json beside it (bos/eos, add_bos_token, chat_template).
 *
 * Supported: model.type "BPE" with vocab, merges ("a b" strings or [a, b]
 * pairs), ignore_merges; added_tokens (special -> control, others -> always
 * matched); pre_tokenizer ByteLevel (use_regex, add_prefix_space), Split
 * (Regex or String pattern, behavior Isolated) and Sequence of those;
 * normalizer null or NFC. NFC is applied as the identity: input that is
 * already NFC (nearly all text) encodes exactly; text with decomposed
 * accents may give different (still lossless) ids than Hugging Face.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer_impl.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../util/checked.h"

#define JSON_MAX_BYTES (512ull << 20)

typedef struct jctx {
    const char *file;
    tsr_error *err;
} jctx;

static int jfail(jctx *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int jfail(jctx *c, int code, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tsr_error_set_at(c->err, code, c->file, 0, 0, "%s", msg);
}

/* Pre-tokenizer: one node (ByteLevel, Split, Sequence). */
static int add_pre(tsr_tokenizer *t, json_t *pre, int depth, int *byte_level, jctx *c) {
    if (!pre || json_is_null(pre)) return TSR_OK;
    if (depth > 8) return jfail(c, TSR_ERR_FORMAT, "pre_tokenizer: nested too deeply");
    if (!json_is_object(pre)) return jfail(c, TSR_ERR_FORMAT, "pre_tokenizer: not an object");
    const char *type = json_string_value(json_object_get(pre, "type"));
    if (!type) return jfail(c, TSR_ERR_FORMAT, "pre_tokenizer: 'type' is missing or not a string");
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(pre, "pretokenizers");
        if (!json_is_array(list))
            return jfail(c, TSR_ERR_FORMAT, "pre_tokenizer.pretokenizers: not an array");
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) {
            int rc = add_pre(t, v, depth + 1, byte_level, c);
            if (rc) return rc;
        }
        return TSR_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        *byte_level = 1;
        json_t *ur = json_object_get(pre, "use_regex");
        if (json_is_true(json_object_get(pre, "add_prefix_space"))) t->add_prefix_space = 1;
        if (ur && !json_is_boolean(ur))
            return jfail(c, TSR_ERR_FORMAT, "pre_tokenizer ByteLevel: use_regex is not a boolean");
        if (!ur || json_is_true(ur))
            return tsr_bpe_add_pre_named(t, "gpt-2", c->err);
        return TSR_OK;
    }
    if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(pre, "pattern");
        const char *behavior = json_string_value(json_object_get(pre, "behavior"));
        if (json_is_true(json_object_get(pre, "invert")))
            return jfail(c, TSR_ERR_UNSUPPORTED, "pre_tokenizer Split: invert is not supported");
        if (behavior && strcmp(behavior, "Isolated"))
            return jfail(c, TSR_ERR_UNSUPPORTED, "pre_tokenizer Split: behavior '%s' is not supported (only Isolated)",
                         behavior);
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        if (re) return tsr_bpe_add_regex(t, re, "pre_tokenizer Split pattern", c->err);
        if (lit) {
            size_t n = strlen(lit);
            char *esc = malloc(2 * n + 1), *o = esc;
            if (!esc) return tsr_error_set(c->err, TSR_ERR_NOMEM, "out of memory");
            for (size_t i = 0; i < n; i++) {
                unsigned char ch = (unsigned char)lit[i];
                if (ch < 0x80 && !((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')))
                    *o++ = '\\';
                *o++ = (char)ch;
            }
            *o = '\0';
            int rc = tsr_bpe_add_regex(t, esc, "pre_tokenizer Split pattern", c->err);
            free(esc);
            return rc;
        }
        return jfail(c, TSR_ERR_FORMAT, "pre_tokenizer Split: pattern has neither Regex nor String");
    }
    return jfail(c, TSR_ERR_UNSUPPORTED, "pre_tokenizer type '%s' is not supported", type);
}

static int get_id(json_t *v, int *id) {
    if (!json_is_integer(v)) return -1;
    json_int_t x = json_integer_value(v);
    if (x < 0 || x >= TSR_TOKEN_MAX_ID) return -1;
    *id = (int)x;
    return 0;
}

/* "a b" or ["a", "b"] */
static int add_merge(tsr_tokenizer *t, json_t *m, size_t i, jctx *c) {
    char what[64];
    snprintf(what, sizeof what, "model.merges[%zu]", i);
    const char *a, *b;
    size_t al, bl;
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        size_t n = json_string_length(m);
        const char *sp = memchr(s, ' ', n);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)))
            return jfail(c, TSR_ERR_FORMAT, "%s: not two tokens separated by one space", what);
        a = s;
        al = (size_t)(sp - s);
        b = sp + 1;
        bl = n - al - 1;
    } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
               json_is_string(json_array_get(m, 1))) {
        a = json_string_value(json_array_get(m, 0));
        al = json_string_length(json_array_get(m, 0));
        b = json_string_value(json_array_get(m, 1));
        bl = json_string_length(json_array_get(m, 1));
    } else {
        return jfail(c, TSR_ERR_FORMAT, "%s: neither \"a b\" nor a pair of strings", what);
    }
    int rc = tsr_bpe_add_merge(t, a, al, b, bl, what, c->err);
    if (rc && c->err) snprintf(c->err->file, sizeof c->err->file, "%s", c->file);
    return rc;
}

/* bos_token / eos_token: "text", {"content": "text"} or null. */
static const char *token_text(json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

static int apply_config(tsr_tokenizer *t, json_t *cfg, jctx *c) {
    if (!json_is_object(cfg)) return jfail(c, TSR_ERR_FORMAT, "not a JSON object");
    const char *names[2] = {"bos_token", "eos_token"};
    int *ids[2] = {&t->bos, &t->eos};
    for (int k = 0; k < 2; k++) {
        json_t *v = json_object_get(cfg, names[k]);
        const char *s = token_text(v);
        if (!s) {
            if (v && !json_is_null(v))
                return jfail(c, TSR_ERR_FORMAT, "%s: not a string, an object with content, or null",
                             names[k]);
            continue;
        }
        int id = tsr_tok_find(t, s, strlen(s));
        if (id < 0) return jfail(c, TSR_ERR_FORMAT, "%s '%.200s' is not in the vocabulary", names[k], s);
        *ids[k] = id;
    }
    json_t *ab = json_object_get(cfg, "add_bos_token");
    if (ab && !json_is_boolean(ab)) return jfail(c, TSR_ERR_FORMAT, "add_bos_token: not a boolean");
    if (ab) t->add_bos = json_is_true(ab);
    json_t *ct = json_object_get(cfg, "chat_template");
    const char *tmpl = json_string_value(ct);
    if (json_is_array(ct)) { /* [{"name": "default", "template": "..."}, ...] */
        size_t i;
        json_t *v;
        json_array_foreach(ct, i, v) {
            const char *name = json_string_value(json_object_get(v, "name"));
            if (name && !strcmp(name, "default")) tmpl = json_string_value(json_object_get(v, "template"));
        }
    } else if (ct && !json_is_null(ct) && !tmpl) {
        return jfail(c, TSR_ERR_FORMAT, "chat_template: not a string or a list of named templates");
    }
    if (tmpl) {
        free(t->chat_template);
        t->chat_template = strdup(tmpl);
        if (!t->chat_template) return tsr_error_set(c->err, TSR_ERR_NOMEM, "out of memory");
    }
    return TSR_OK;
}

/* SentencePiece-style tokenizer.json (Llama 2, Mistral on the Hub): no
 * ByteLevel, spaces as U+2581 by a Metaspace pre-tokenizer or a
 * Prepend/Replace normalizer, merges by rank, byte fallback. */
typedef struct spm_json {
    int on, prefix, prefix_mode, split;
} spm_json;

static int is_meta(const char *s) { return s && !strcmp(s, "\xe2\x96\x81"); }
static const char *str_or(json_t *v) { return json_string_value(v) ? json_string_value(v) : ""; }

/* Reads the normalizer and pre_tokenizer; sets sj->on when they describe
 * SentencePiece-style text. 1 if something there is not supported. */
static int spm_detect(json_t *root, spm_json *sj, jctx *c, int *rc) {
    memset(sj, 0, sizeof *sj);
    json_t *norm = json_object_get(root, "normalizer"), *pre = json_object_get(root, "pre_tokenizer");
    json_t *one[1] = {norm}, **list = one;
    size_t nl = norm && !json_is_null(norm) ? 1 : 0;
    const char *nt = json_string_value(json_object_get(norm, "type"));
    json_t *seq = nt && !strcmp(nt, "Sequence") ? json_object_get(norm, "normalizers") : NULL;
    json_t *items[8];
    if (seq) {
        nl = json_array_size(seq) < 8 ? json_array_size(seq) : 8;
        for (size_t i = 0; i < nl; i++) items[i] = json_array_get(seq, i);
        list = items;
    }
    int prepend = 0, replace = 0, nfc = 0;
    for (size_t i = 0; i < nl; i++) {
        const char *ty = json_string_value(json_object_get(list[i], "type"));
        if (ty && !strcmp(ty, "NFC")) nfc++;
        else if (ty && !strcmp(ty, "Prepend") && is_meta(json_string_value(json_object_get(list[i], "prepend")))) prepend = 1;
        else if (ty && !strcmp(ty, "Replace") &&
                 !strcmp(str_or(json_object_get(json_object_get(list[i], "pattern"), "String")), " ") &&
                 is_meta(json_string_value(json_object_get(list[i], "content"))))
            replace = 1;
    }
    const char *pt = json_string_value(json_object_get(pre, "type"));
    json_t *meta = NULL;
    if (pt && !strcmp(pt, "Metaspace")) meta = pre;
    if (pt && !strcmp(pt, "Sequence")) {
        json_t *l = json_object_get(pre, "pretokenizers");
        if (json_array_size(l) == 1 &&
            !strcmp(str_or(json_object_get(json_array_get(l, 0), "type")), "Metaspace"))
            meta = json_array_get(l, 0);
    }
    if (!meta && !(replace && (!pre || json_is_null(pre)))) return 0;
    sj->on = 1;
    if ((size_t)(prepend + replace + nfc) != nl || (meta && prepend)) {
        *rc = jfail(c, TSR_ERR_UNSUPPORTED, "SentencePiece-style tokenizer.json: normalizer steps other than "
                                            "Prepend/Replace of U+2581 and NFC are not supported");
        return 1;
    }
    if (meta) {
        if (json_object_get(meta, "replacement") && !is_meta(json_string_value(json_object_get(meta, "replacement")))) {
            *rc = jfail(c, TSR_ERR_UNSUPPORTED, "pre_tokenizer Metaspace: replacement other than U+2581");
            return 1;
        }
        const char *scheme = json_string_value(json_object_get(meta, "prepend_scheme"));
        json_t *aps = json_object_get(meta, "add_prefix_space");
        sj->split = !json_is_false(json_object_get(meta, "split"));
        if (scheme && !strcmp(scheme, "first")) { sj->prefix = 1; sj->prefix_mode = 2; }
        else if (scheme && !strcmp(scheme, "never")) sj->prefix = 0;
        else if (scheme && strcmp(scheme, "always")) {
            *rc = jfail(c, TSR_ERR_UNSUPPORTED, "pre_tokenizer Metaspace: prepend_scheme '%.40s'", scheme);
            return 1;
        } else { sj->prefix = scheme || !aps || json_is_true(aps); sj->prefix_mode = 1; }
    } else {
        sj->prefix = prepend;
        sj->prefix_mode = 1;
    }
    return 0;
}

/* The document text with model.vocab and model.merges to read directly
 * (see tokenizer_json_fast.c); NULL: everything comes from jansson. */
typedef struct fast_src {
    const char *s;
    size_t span[4];
} fast_src;

static int load_root(json_t *root, const char *file, const fast_src *fs, tsr_tokenizer **out, tsr_error *err) {
    jctx c = {file, err};
    char *fdec = NULL;
    void *fents = NULL;
    int n_fents = 0;
    if (!json_is_object(root)) return jfail(&c, TSR_ERR_FORMAT, "the document is not a JSON object");
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return jfail(&c, TSR_ERR_FORMAT, "'model' is %s", model ? "not an object" : "missing");
    json_t *type = json_object_get(model, "type");
    if (type && !json_is_string(type)) return jfail(&c, TSR_ERR_FORMAT, "model.type: not a string");
    if (type && strcmp(json_string_value(type), "BPE"))
        return jfail(&c, TSR_ERR_UNSUPPORTED, "model.type '%s' is not supported (only BPE)",
                     json_string_value(type));
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab)) return jfail(&c, TSR_ERR_FORMAT, "model.vocab is %s", vocab ? "not an object" : "missing");
    if (merges && !json_is_array(merges)) return jfail(&c, TSR_ERR_FORMAT, "model.merges: not an array");
    if (added && !json_is_null(added) && !json_is_array(added))
        return jfail(&c, TSR_ERR_FORMAT, "added_tokens: not an array");
    json_t *im = json_object_get(model, "ignore_merges");
    if (im && !json_is_boolean(im)) return jfail(&c, TSR_ERR_FORMAT, "model.ignore_merges: not a boolean");

    int n_vocab = 0, id = 0;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (get_id(v, &id)) return jfail(&c, TSR_ERR_FORMAT, "model.vocab['%.200s']: not an integer id in range", key);
        if (id + 1 > n_vocab) n_vocab = id + 1;
    }
    size_t i;
    json_array_foreach(added, i, v) {
        if (!json_is_object(v) || get_id(json_object_get(v, "id"), &id) || !json_is_string(json_object_get(v, "content")))
            return jfail(&c, TSR_ERR_FORMAT, "added_tokens: an entry lacks an integer 'id' in range or a string 'content'");
        if (id + 1 > n_vocab) n_vocab = id + 1;
    }
    if (fs) {
        int nv;
        int rc = tsr_json_fast_vocab_scan(fs->s, fs->span[0], fs->span[1], file, &fdec, &fents, &n_fents, &nv, err);
        if (rc) return rc;
        if (nv > n_vocab) n_vocab = nv;
    }
    tsr_tokenizer *t = NULL;
    int rc = TSR_OK;
    if (n_vocab == 0) {
        rc = jfail(&c, TSR_ERR_FORMAT, "model.vocab is empty");
        goto fail;
    }
    /* Ids are dense in real vocabularies; a few sparse ids must not size a
     * table of millions (memory bounded by the document). */
    uint64_t n_tokens = (uint64_t)n_fents + json_object_size(vocab) + json_array_size(added);
    if ((uint64_t)n_vocab > 2 * n_tokens + 1024) {
        rc = jfail(&c, TSR_ERR_FORMAT, "model.vocab: ids are sparse (largest id %d for %llu tokens)", n_vocab - 1,
                   (unsigned long long)n_tokens);
        goto fail;
    }
    spm_json sj;
    if (spm_detect(root, &sj, &c, &rc)) goto fail;
    if (!(t = tsr_tok_new(sj.on ? TSR_TOK_SPM : TSR_TOK_BPE, n_vocab, err))) {
        rc = err ? err->code : TSR_ERR_NOMEM;
        goto fail;
    }
    if (fs && (rc = tsr_json_fast_vocab_set(t, fdec, fents, n_fents, err))) goto fail;
    t->ignore_merges = json_is_true(im);
    json_object_foreach(vocab, key, v) {
        get_id(v, &id);
        if ((rc = tsr_tok_set(t, id, key, strlen(key), TSR_TOKATTR_NORMAL, "model.vocab", err))) goto fail;
    }
    json_array_foreach(added, i, v) {
        get_id(json_object_get(v, "id"), &id);
        json_t *content = json_object_get(v, "content");
        const char *s = json_string_value(content);
        size_t n = json_string_length(content);
        uint8_t attr = TSR_TOKATTR_RAW | (json_is_true(json_object_get(v, "special")) ? TSR_TOKATTR_CONTROL : TSR_TOKATTR_USER);
        if (t->text[id]) {
            if (t->len[id] != n || memcmp(t->text[id], s, n)) {
                rc = tsr_error_set(err, TSR_ERR_FORMAT, "added_tokens: id %d is '%.100s' in model.vocab", id, t->text[id]);
                goto fail;
            }
            t->attr[id] = attr;
        } else if ((rc = tsr_tok_set(t, id, s, n, attr, "added_tokens", err))) {
            goto fail;
        }
    }
    if ((rc = tsr_tok_finish(t, err))) goto fail;
    /* a text given twice in model.vocab (the fast reader sees no duplicate keys) */
    for (int k = 0; k < t->n_vocab; k++) {
        if (!t->text[k] || (t->attr[k] & (TSR_TOKATTR_CONTROL | TSR_TOKATTR_USER))) continue;
        int other = tsr_tok_find(t, t->text[k], t->len[k]);
        if (other != k && !(t->attr[other] & (TSR_TOKATTR_CONTROL | TSR_TOKATTR_USER))) {
            rc = jfail(&c, TSR_ERR_FORMAT, "model.vocab: '%.100s' is given twice (ids %d and %d)", t->text[k], other, k);
            goto fail;
        }
    }
    if (fs && fs->span[3]) {
        if ((rc = tsr_json_fast_merges(t, fs->s, fs->span[2], fs->span[3], file, err))) goto fail;
    } else if (merges) {
        if ((rc = tsr_bpe_reserve_merges(t, json_array_size(merges), err))) goto fail;
        json_array_foreach(merges, i, v)
            if ((rc = add_merge(t, v, i, &c))) goto fail;
    }
    int byte_level = 0;
    if (sj.on) {
        t->spm_escape = 1;
        t->spm_rank = 1;
        t->spm_space_prefix = sj.prefix;
        t->spm_prefix_mode = sj.prefix_mode;
        t->spm_split = sj.split;
        t->spm_byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
        const char *unk = json_string_value(json_object_get(model, "unk_token"));
        if (unk && (t->unk = tsr_tok_find(t, unk, strlen(unk))) < 0) {
            rc = jfail(&c, TSR_ERR_FORMAT, "model.unk_token '%.100s' is not in the vocabulary", unk);
            goto fail;
        }
    } else if ((rc = add_pre(t, json_object_get(root, "pre_tokenizer"), 0, &byte_level, &c))) {
        goto fail;
    }
    json_t *dec = json_object_get(root, "decoder");
    const char *dtype = json_string_value(json_object_get(dec, "type"));
    if (dtype && !strcmp(dtype, "ByteLevel")) byte_level = 1;
    if (!byte_level && !sj.on) {
        rc = jfail(&c, TSR_ERR_UNSUPPORTED,
                   "tokenizer.json is neither byte-level BPE (ByteLevel pre_tokenizer or decoder) nor "
                   "SentencePiece-style BPE (Metaspace, or a Prepend/Replace U+2581 normalizer)");
        goto fail;
    }
    /* post_processor TemplateProcessing whose single template starts with a
     * special token: that token is BOS and is added (Llama 3). */
    json_t *pp = json_object_get(root, "post_processor");
    const char *ppt = json_string_value(json_object_get(pp, "type"));
    if (ppt && !strcmp(ppt, "Sequence")) {
        size_t k;
        json_t *q;
        json_array_foreach(json_object_get(pp, "processors"), k, q) {
            const char *qt = json_string_value(json_object_get(q, "type"));
            if (qt && !strcmp(qt, "TemplateProcessing")) pp = q;
        }
        ppt = json_string_value(json_object_get(pp, "type"));
    }
    if (ppt && !strcmp(ppt, "TemplateProcessing")) {
        json_t *first = json_array_get(json_object_get(pp, "single"), 0);
        const char *bos = json_string_value(json_object_get(json_object_get(first, "SpecialToken"), "id"));
        int id = bos ? tsr_tok_find(t, bos, strlen(bos)) : -1;
        if (bos && id < 0) {
            rc = jfail(&c, TSR_ERR_FORMAT, "post_processor: special token '%.100s' is not in the vocabulary", bos);
            goto fail;
        }
        if (id >= 0) {
            t->bos = id;
            t->add_bos = 1;
        }
    }
    json_t *norm = json_object_get(root, "normalizer");
    if (!sj.on && norm && !json_is_null(norm)) {
        const char *nt = json_string_value(json_object_get(norm, "type"));
        if (!nt || strcmp(nt, "NFC")) {
            rc = jfail(&c, TSR_ERR_UNSUPPORTED, "normalizer '%s' is not supported (only none or NFC)",
                       nt ? nt : "?");
            goto fail;
        }
    }
    free(fdec);
    free(fents);
    *out = t;
    return TSR_OK;
fail:
    if (err && !err->file[0]) snprintf(err->file, sizeof err->file, "%s", file);
    free(fdec);
    free(fents);
    tsr_tokenizer_free(t);
    return rc;
}

/* Parse a document; model.vocab and model.merges are read directly when
 * the skeleton scans (same errors, much faster on 150k-token vocabularies). */
static int load_doc(const char *buf, size_t len, const char *name, tsr_tokenizer **out, tsr_error *err) {
    fast_src fs;
    char *copy = malloc(len + 1);
    if (!copy) return tsr_error_set(err, TSR_ERR_NOMEM, "out of memory for %zu bytes", len);
    memcpy(copy, buf, len);
    copy[len] = '\0';
    int fast = tsr_json_fast_locate(copy, len, fs.span) == 0;
    if (fast) {
        fs.s = buf;
        tsr_json_fast_blank(copy, fs.span[0], fs.span[1]);
        if (fs.span[3]) tsr_json_fast_blank(copy, fs.span[2], fs.span[3]);
    }
    json_error_t je;
    json_t *root = json_loadb(copy, len, JSON_REJECT_DUPLICATES, &je);
    free(copy);
    if (!root)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, name, je.line > 0 ? je.line : 0,
                                je.column > 0 ? je.column : 0, "not valid JSON: %s", je.text);
    int rc = load_root(root, name, fast ? &fs : NULL, out, err);
    json_decref(root);
    return rc;
}

int tsr_tokenizer_load_json_mem(const char *buf, size_t len, const char *name, tsr_tokenizer **out,
                                tsr_error *err) {
    *out = NULL;
    tsr_error_clear(err);
    if (!buf && len) return tsr_error_set(err, TSR_ERR_INVALID, "tokenizer.json buffer is NULL");
    return load_doc(buf ? buf : "", len, name, out, err);
}

static json_t *load_file(const char *path, tsr_error *err, int *rc) {
    struct stat st;
    if (stat(path, &st) != 0) {
        *rc = tsr_error_set_at(err, TSR_ERR_IO, path, 0, 0, "cannot open the file");
        return NULL;
    }
    if ((uint64_t)st.st_size > JSON_MAX_BYTES) {
        *rc = tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "file of %lld bytes is larger than %llu MiB",
                               (long long)st.st_size, JSON_MAX_BYTES >> 20);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        *rc = tsr_error_set_at(err, TSR_ERR_FORMAT, path, je.line > 0 ? je.line : 0,
                               je.column > 0 ? je.column : 0, "not valid JSON: %s", je.text);
    return root;
}

int tsr_tokenizer_load_json(const char *path, tsr_tokenizer **out, tsr_error *err) {
    *out = NULL;
    tsr_error_clear(err);
    int rc = TSR_OK;
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return tsr_error_set_at(err, TSR_ERR_IO, path, 0, 0, "cannot open the file");
    if ((uint64_t)st.st_size > JSON_MAX_BYTES)
        return tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "file of %lld bytes is larger than %llu MiB",
                                (long long)st.st_size, JSON_MAX_BYTES >> 20);
    FILE *f = fopen(path, "rb");
    if (!f) return tsr_error_set_at(err, TSR_ERR_IO, path, 0, 0, "cannot open the file");
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf || fread(buf, 1, n, f) != n) {
        fclose(f);
        free(buf);
        return tsr_error_set_at(err, buf ? TSR_ERR_IO : TSR_ERR_NOMEM, path, 0, 0, "cannot read the file");
    }
    fclose(f);
    rc = load_doc(buf, n, path, out, err);
    free(buf);
    if (rc) return rc;

    /* tokenizer_config.json in the same folder, if present */
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path + 1) : 0;
    char cpath[4096];
    if (dl + sizeof "tokenizer_config.json" > sizeof cpath) return TSR_OK;
    memcpy(cpath, path, dl);
    memcpy(cpath + dl, "tokenizer_config.json", sizeof "tokenizer_config.json");
    if (stat(cpath, &st) != 0) return TSR_OK;
    json_t *cfg = load_file(cpath, err, &rc);
    if (cfg) {
        jctx c = {cpath, err};
        rc = apply_config(*out, cfg, &c);
        json_decref(cfg);
    }
    if (rc) {
        tsr_tokenizer_free(*out);
        *out = NULL;
    }
    return rc;
}
