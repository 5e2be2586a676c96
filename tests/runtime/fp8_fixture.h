/*
 * fp8_fixture.h - FP8 checkpoints made at test time from the transformers
 * fixtures by tools/mk_fp8_checkpoint, in a temporary folder removed at the
 * end. Shared by test_fp8_checkpoint (CPU) and test_cuda_fp8_ckpt (GPU).
 * The tool is $MK_FP8_CHECKPOINT when set, else the one this build made,
 * else (a build carried elsewhere, as to the GPU machine) bin/ beside the
 * test binary's tests/bin.
 */
#ifndef TSR_TESTS_FP8_FIXTURE_H
#define TSR_TESTS_FP8_FIXTURE_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef MK_FP8_CHECKPOINT
#error "MK_FP8_CHECKPOINT: the path of the tool, set by the build"
#endif

static char fp8_tmp_root[256];

static inline const char *fp8_src_dir(void) {
    const char *s = getenv("TESSERA_SOURCE_DIR");
    return s ? s : ".";
}

static inline void fp8_rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[4096];
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
        if (e->d_type == DT_DIR)
            fp8_rm_tree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static inline int fp8_setup(void **state) {
    (void)state;
    snprintf(fp8_tmp_root, sizeof fp8_tmp_root, "/tmp/tsr_fp8_XXXXXX");
    return mkdtemp(fp8_tmp_root) ? 0 : -1;
}

static inline int fp8_teardown(void **state) {
    (void)state;
    fp8_rm_tree(fp8_tmp_root);
    return 0;
}

/* A transformers fixture by family name, or a folder given by its path. */
static inline void fp8_fixture_dir(const char *family, char *out, size_t n) {
    if (family[0] == '/')
        snprintf(out, n, "%s", family);
    else
        snprintf(out, n, "%s/tests/data/fixtures/transformers/%s", fp8_src_dir(), family);
}

/* The converter to run (the header). */
static inline const char *fp8_tool(void) {
    static char found[4096];
    const char *env = getenv("MK_FP8_CHECKPOINT");
    if (env && env[0]) return env;
    if (access(MK_FP8_CHECKPOINT, X_OK) == 0) return MK_FP8_CHECKPOINT;
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            if (snprintf(found, sizeof found, "%s/../../bin/mk_fp8_checkpoint", exe) < (int)sizeof found &&
                access(found, X_OK) == 0)
                return found;
        }
    }
    return MK_FP8_CHECKPOINT; /* named by the failure */
}

/* Run the tool on a fixture: the FP8 checkpoint into tmp/NAME (dir), and the
 * dequantised f32 one into tmp/NAME-deq (deq) unless deq is NULL. */
static inline void fp8_make_ckpt(const char *family, const char *name, const char *args, char *dir, char *deq,
                                 size_t n) {
    char src[4096], cmd[16384];
    const char *tool = fp8_tool();
    fp8_fixture_dir(family, src, sizeof src);
    snprintf(dir, n, "%s/%s", fp8_tmp_root, name);
    if (deq) snprintf(deq, n, "%s/%s-deq", fp8_tmp_root, name);
    if (snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' %s%s%s%s", tool, src, dir, args, deq ? " --dequant '" : "",
                 deq ? deq : "", deq ? "'" : "") >= (int)sizeof cmd)
        fail_msg("the command for %s does not fit %zu bytes", name, sizeof cmd);
    if (system(cmd) != 0) fail_msg("%s failed", cmd);
}

#endif /* TSR_TESTS_FP8_FIXTURE_H */
