/*
 * tokenizer_llama2c.c - llama2.c's tokenizer.bin: int32 max_token_length,
 * then per token a float32 score, an int32 length and the bytes. Spaces are
 * stored as spaces (not U+2581); <unk> 0, <s> 1, </s> 2, <0x00>.. from 3.
 */
#include "tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/checked.h"

static int rd(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n ? 0 : -1; }

int tsr_tokenizer_load_llama2c(const char *path, int vocab_size, tsr_tokenizer **out, tsr_error *err) {
    *out = NULL;
    tsr_error_clear(err);
    FILE *f = fopen(path, "rb");
    if (!f) return tsr_error_set_at(err, TSR_ERR_IO, path, 0, 0, "cannot open the file");
    fseek(f, 0, SEEK_END);
    long fsize = ftell(f);
    fseek(f, 0, SEEK_SET);
    int32_t maxlen;
    int rc = TSR_OK;
    tsr_tokenizer *t = NULL;
    char *buf = NULL;
    if (fsize < 4 || rd(f, &maxlen, 4) || maxlen <= 0 || maxlen > TSR_TOKEN_MAX_TEXT) {
        rc = tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0,
                              "max_token_length header is missing or out of range (1..%d)", TSR_TOKEN_MAX_TEXT);
        goto done;
    }
    if (vocab_size <= 0) { /* count the records */
        uint64_t off = 4;
        vocab_size = 0;
        while (off < (uint64_t)fsize) {
            int32_t len;
            if (fseek(f, (long)off + 4, SEEK_SET) || rd(f, &len, 4) || len < 0 ||
                tsr_add_u64(off, 8 + (uint64_t)len, &off) || off > (uint64_t)fsize) {
                rc = tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "token record %d is truncated", vocab_size);
                goto done;
            }
            vocab_size++;
        }
        fseek(f, 4, SEEK_SET);
    }
    if (!(t = tsr_tok_new(TSR_TOK_SPM, vocab_size, err))) {
        rc = err ? err->code : TSR_ERR_NOMEM;
        goto done;
    }
    buf = malloc((size_t)maxlen + 1);
    if (!buf) {
        rc = tsr_error_set(err, TSR_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < vocab_size; i++) {
        float score;
        int32_t len;
        if (rd(f, &score, 4) || rd(f, &len, 4)) {
            rc = tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "token %d: file ends in its header (vocab_size %d)",
                                  i, vocab_size);
            goto done;
        }
        if (len < 0 || len > maxlen) {
            rc = tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "token %d: length %d is outside 0..%d", i,
                                  (int)len, (int)maxlen);
            goto done;
        }
        if (rd(f, buf, (size_t)len)) {
            rc = tsr_error_set_at(err, TSR_ERR_FORMAT, path, 0, 0, "token %d: file ends in its text", i);
            goto done;
        }
        uint8_t attr = i == 0 ? TSR_TOKATTR_UNKNOWN : (i == 1 || i == 2) ? TSR_TOKATTR_CONTROL : TSR_TOKATTR_NORMAL;
        if ((rc = tsr_tok_set(t, i, buf, (size_t)len, attr, "token", err))) goto done;
        t->score[i] = score;
    }
    t->unk = 0;
    t->bos = vocab_size > 1 ? 1 : -1;
    t->eos = vocab_size > 2 ? 2 : -1;
    t->add_bos = 1;
    t->spm_space_prefix = 1;
    t->spm_escape = 0;
    rc = tsr_tok_finish(t, err);
done:
    fclose(f);
    free(buf);
    if (rc) {
        if (err && !err->file[0]) snprintf(err->file, sizeof err->file, "%s", path);
        tsr_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return TSR_OK;
}
