#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"

#ifndef TESSERA_SOURCE_DIR
#define TESSERA_SOURCE_DIR "."
#endif

const char *tsr_cli_exe_dir(void) {
    static char dir[PATH_MAX];
    if (!dir[0]) {
        ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
        if (n <= 0) {
            strcpy(dir, ".");
        } else {
            dir[n] = '\0';
            char *slash = strrchr(dir, '/');
            if (slash) *slash = '\0';
        }
    }
    return dir;
}

const char *tsr_cli_default_catalog(void) {
    static char path[PATH_MAX + 16];
    const char *env = getenv("TESSERA_CATALOG");
    if (env && env[0]) return env;
    if (!path[0]) snprintf(path, sizeof path, "%s/../catalog", tsr_cli_exe_dir());
    return path;
}

const char *tsr_cli_source_dir(void) {
    const char *env = getenv("TESSERA_SOURCE_DIR");
    return env && env[0] ? env : TESSERA_SOURCE_DIR;
}

int tsr_cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
    return 0;
}
