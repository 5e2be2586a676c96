/*
 * report.h - the outputs of tessera ablate in its folder:
 *   result.json  schema "tessera.ablation/1": settings, device record,
 *                assembly, git commit, plugins with off/alone/Shapley
 *                shares, variants with every sample of every case
 *   result.csv   one row per variant and case (medians, min, max, ceilings)
 *   report.md    per variant: decode, prefill, TTFT, speedup over the
 *                baseline, share of ceiling, quality, verdict; then plugins
 *   speedup.svg  each plugin's attributed speedup: off, alone, Shapley bars
 */
#ifndef TSR_ABL_REPORT_H
#define TSR_ABL_REPORT_H

#include <jansson.h>
#include <stdio.h>

#include "ablate.h"

json_t *tsr_abl_result_json(const tsr_abl_result *r);
int tsr_abl_write_csv(const tsr_abl_result *r, FILE *f);
int tsr_abl_write_md(const tsr_abl_result *r, FILE *f);
int tsr_abl_write_svg(const tsr_abl_result *r, FILE *f);
/* All four into dir. */
int tsr_abl_write_reports(const tsr_abl_result *r, const char *dir, tsr_error *err);

#endif
