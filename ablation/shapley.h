/*
 * shapley.h - exact Shapley values of n players from the value of every
 * coalition: the share of a speedup each plugin is attributed, interactions
 * split evenly between the plugins that take part in them.
 *
 *   phi_i = sum over S not holding i of |S|! (n-|S|-1)! / n! * (v(S+i) - v(S))
 *
 * They sum to v(all) - v(none) (efficiency), which ablate checks.
 */
#ifndef TSR_ABL_SHAPLEY_H
#define TSR_ABL_SHAPLEY_H

#include "../core/util/error.h"

#define TSR_SHAPLEY_MAX_PLAYERS 16

/* v[mask] is the value of the coalition whose players are mask's set bits
 * (bit i = player i), for every mask in [0, 2^n). known[mask] (NULL: all
 * known) says which values exist: a coalition that was refused or failed has
 * none, and then no exact value exists: TSR_ERR_UNSUPPORTED naming the
 * first missing coalition. phi receives n values. */
int tsr_shapley(int n, const double *v, const unsigned char *known, double *phi, tsr_error *err);

#endif
