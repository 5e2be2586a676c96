#include "catalog.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "halloc.h"

const char *tsr_catalog_default_dir(char *buf, size_t size) {
    const char *env = getenv("TESSERA_CATALOG");
    if (env && env[0]) {
        snprintf(buf, size, "%s", env);
        return buf;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        snprintf(buf, size, "catalog");
        return buf;
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    snprintf(buf, size, "%s/../catalog", exe);
    return buf;
}

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n > m && !strcmp(s + n - m, suf);
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_manifests(const void *a, const void *b) {
    const tsr_manifest *x = *(tsr_manifest *const *)a, *y = *(tsr_manifest *const *)b;
    return strcmp(x->name, y->name);
}

int tsr_catalog_load(const char *dir, tsr_catalog **out, tsr_diag *d) {
    *out = NULL;
    int before = tsr_diag_count(d);
    char defdir[PATH_MAX];
    if (!dir) dir = tsr_catalog_default_dir(defdir, sizeof defdir);
    DIR *dh = opendir(dir);
    if (!dh) return tsr_diag_add(d, TSR_ERR_IO, dir, 0, 0, "cannot open the catalog folder: %s", strerror(errno));
    char **names = NULL;
    int n_names = 0, cap = 0, rc = 0;
    struct dirent *de;
    while ((de = readdir(dh))) {
        if (de->d_name[0] == '.') continue;
        if (!ends_with(de->d_name, ".yaml") && !ends_with(de->d_name, ".yml")) continue;
        char *s = tsr_hstrdup(de->d_name);
        if (!s || tsr_hgrow((void **)&names, sizeof *names, n_names + 1, &cap)) {
            tsr_hfree(s);
            rc = tsr_diag_add(d, TSR_ERR_NOMEM, dir, 0, 0, "out of memory");
            break;
        }
        names[n_names++] = s;
    }
    closedir(dh);
    tsr_catalog *c = NULL;
    if (!rc) {
        if (n_names > 1) qsort(names, (size_t)n_names, sizeof *names, cmp_names); /* names: NULL when none */
        c = tsr_hcalloc(1, sizeof *c);
        if (c) c->dir = tsr_hstrdup(dir);
        if (c && n_names) c->items = tsr_hcalloc((size_t)n_names, sizeof *c->items);
        if (!c || !c->dir || (n_names && !c->items))
            rc = tsr_diag_add(d, TSR_ERR_NOMEM, dir, 0, 0, "out of memory");
    }
    for (int i = 0; !rc && i < n_names; i++) {
        size_t len = strlen(dir) + strlen(names[i]) + 2;
        char *path = tsr_halloc(len);
        if (!path) {
            rc = tsr_diag_add(d, TSR_ERR_NOMEM, dir, 0, 0, "out of memory");
            break;
        }
        snprintf(path, len, "%s/%s", dir, names[i]);
        tsr_manifest *m = NULL;
        int r = tsr_manifest_load(path, &m, d);
        if (r == TSR_ERR_NOMEM) rc = r;
        if (m) {
            for (int j = 0; j < c->n; j++)
                if (!strcmp(c->items[j]->name, m->name)) {
                    int line, col;
                    tsr_manifest_pos(m, "name", &line, &col);
                    tsr_diag_add(d, TSR_ERR_FORMAT, path, line, col,
                                 "plugin name '%s' already used by %s", m->name, c->items[j]->path);
                    tsr_manifest_free(m);
                    m = NULL;
                    break;
                }
        }
        if (m) c->items[c->n++] = m;
        tsr_hfree(path);
    }
    for (int i = 0; i < n_names; i++) tsr_hfree(names[i]);
    tsr_hfree(names);
    if (!rc && tsr_diag_count(d) > before)
        rc = d->n_errors > before ? d->errors[before].code : TSR_ERR_FORMAT;
    if (rc) {
        tsr_catalog_free(c);
        return rc;
    }
    if (c->n > 1) qsort(c->items, (size_t)c->n, sizeof *c->items, cmp_manifests); /* items: NULL when none */
    *out = c;
    return TSR_OK;
}

void tsr_catalog_free(tsr_catalog *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) tsr_manifest_free(c->items[i]);
    tsr_hfree(c->items);
    tsr_hfree(c->dir);
    tsr_hfree(c);
}

const tsr_manifest *tsr_catalog_find(const tsr_catalog *c, const char *name) {
    for (int i = 0; c && i < c->n; i++)
        if (!strcmp(c->items[i]->name, name)) return c->items[i];
    return NULL;
}
