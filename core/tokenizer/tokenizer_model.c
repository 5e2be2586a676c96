/*
 * tokenizer_model.c - the tokenizer that goes with a model file. Kept apart
 * from the rest so the tokenizer builds without core/format's model reader.
 */
#include "tokenizer_impl.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../format/model_file.h"

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* tokenizer.json or llama2.c .bin, told apart by the first non-blank byte. */
static int load_path(const char *path, int vocab, tsr_tokenizer **out, tsr_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return tsr_error_set_at(err, TSR_ERR_IO, path, 0, 0, "cannot open the tokenizer file");
    int c;
    while ((c = fgetc(f)) == ' ' || c == '\n' || c == '\r' || c == '\t') {}
    fclose(f);
    if (c == '{') return tsr_tokenizer_load_json(path, out, err);
    return tsr_tokenizer_load_llama2c(path, vocab, out, err);
}

int tsr_tokenizer_load_for_model(const struct tsr_model_file *f, const char *override_path,
                                 tsr_tokenizer **out, tsr_error *err) {
    *out = NULL;
    tsr_error_clear(err);
    const tsr_model_config *cfg = tsr_model_file_config(f);
    int vocab = cfg ? cfg->vocab : 0;
    if (override_path) return load_path(override_path, vocab, out, err);
    const struct tsr_gguf *g = tsr_model_file_gguf(f);
    if (g) return tsr_tokenizer_load_gguf(g, tsr_model_file_path(f), out, err);
    const char *dir = tsr_model_file_dir(f);
    char p[4096];
    if (!dir || !dir[0]) dir = ".";
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    if (is_file(p)) return tsr_tokenizer_load_json(p, out, err);
    if (tsr_model_file_format(f) == TSR_FORMAT_LLAMA2C) {
        snprintf(p, sizeof p, "%s/tokenizer.bin", dir);
        if (is_file(p)) return tsr_tokenizer_load_llama2c(p, vocab, out, err);
        DIR *d = opendir(dir);
        struct dirent *e;
        int found = 0;
        while (d && (e = readdir(d))) {
            size_t n = strlen(e->d_name);
            if (n > 7 && !strncmp(e->d_name, "tok", 3) && !strcmp(e->d_name + n - 4, ".bin")) {
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                found = is_file(p);
                if (found) break;
            }
        }
        if (d) closedir(d);
        if (found) return tsr_tokenizer_load_llama2c(p, vocab, out, err);
    }
    return tsr_error_set_at(err, TSR_ERR_IO, tsr_model_file_path(f), 0, 0,
                            "no tokenizer found (no GGUF vocabulary, no tokenizer.json in %s%s); "
                            "give one with --tokenizer",
                            dir, tsr_model_file_format(f) == TSR_FORMAT_LLAMA2C ? ", no tokenizer.bin or tok*.bin" : "");
}
