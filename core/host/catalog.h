/*
 * catalog.h - the folder of plugin manifests an engine is assembled from.
 *
 * Every *.yaml / *.yml file of the folder is a manifest (the build writes
 * build/catalog/<name>.yaml beside lib<name>.so). A catalog with a bad
 * manifest, or two manifests of one name, fails to load with every problem.
 */
#ifndef TSR_CATALOG_H
#define TSR_CATALOG_H

#include "diag.h"
#include "manifest.h"

typedef struct tsr_catalog {
    char *dir;
    tsr_manifest **items; /* sorted by name */
    int n;
} tsr_catalog;

/* dir NULL: $TESSERA_CATALOG, else <exe dir>/../catalog. */
int tsr_catalog_load(const char *dir, tsr_catalog **out, tsr_diag *d);
void tsr_catalog_free(tsr_catalog *c);

const tsr_manifest *tsr_catalog_find(const tsr_catalog *c, const char *name);
/* The default catalog folder (into buf). */
const char *tsr_catalog_default_dir(char *buf, size_t size);

#endif /* TSR_CATALOG_H */
