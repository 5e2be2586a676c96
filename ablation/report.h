/*
 * report.h - the outputs of tessera ablate in its folder:
 *   result.json  schema "tessera.ablation/1": settings, device record,
 *                assembly, git commit, plugins with off/alone/Shapley
 *                shares, variants with every sample of every case (also
 *                written after each variant: what --resume continues from)
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
/* result.json alone (written to a temporary file, then renamed over it):
 * what tessera ablate leaves after each variant, so that an interrupted run
 * keeps its measurements (variants not yet measured: status "pending"). */
int tsr_abl_write_result_json(const tsr_abl_result *r, const char *dir, tsr_error *err);
/* One case of result.json read back (--resume): samples, medians, ceilings,
 * the first repetition's tokens and text. Free with the bench result. */
int tsr_abl_case_from_json(const json_t *j, tsr_bench_case *c, tsr_error *err);

#endif
