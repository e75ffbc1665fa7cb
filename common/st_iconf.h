/*
 * st_iconf.h — the instance configuration file: every knob an operator
 * tunes, in one INI file read with libinih (`strata up --config FILE`,
 * `strata plan --config FILE`; example: docs/strata.conf.example).
 *
 * Table-driven (one row per knob: section, key, type, bounds, default,
 * the command-line flag that sets the same thing, and whether strata
 * honours it today).  Values are kept as validated text; the launcher
 * passes them on as the daemons' options.  Command-line flags override the
 * file (st_iconf_set after st_iconf_load).
 */
#ifndef ST_ICONF_H
#define ST_ICONF_H

#include <stdint.h>
#include <stdio.h>

#include "st_error.h"

enum st_iconf_type {
	ST_ICONF_STR,      /* free text (paths, names) */
	ST_ICONF_NAME,     /* instance name [A-Za-z0-9_-]{1,48} */
	ST_ICONF_SIZE,     /* bytes: 64GiB, 512MiB, 1048576 */
	ST_ICONF_BUDGET,   /* bytes or a share "25%" */
	ST_ICONF_INT,      /* integer in [min, max] */
	ST_ICONF_BOOL,     /* on/off, true/false, yes/no, 1/0 */
	ST_ICONF_ENUM,     /* one of a '|'-separated list */
	ST_ICONF_WFORMAT,  /* an expert weight format (st_wformat_parse) */
	ST_ICONF_NUMA,     /* auto, interleave, off or a node number */
	ST_ICONF_HOT,      /* a count of experts per layer, or bytes */
};

struct st_iconf_knob {
	const char *section, *key;
	enum st_iconf_type type;
	int64_t min, max;        /* ST_ICONF_INT */
	const char *choices;     /* ST_ICONF_ENUM: "f32|f16|bf16|fp8" */
	const char *def;         /* default as text; NULL: none */
	const char *flag;        /* the matching command-line flag */
	int honoured;            /* 0: parsed and passed on, not acted on yet */
	const char *help;
};

/* The table, and its length. */
const struct st_iconf_knob *st_iconf_knobs(int *ret_n);

#define ST_ICONF_MAX_KNOBS 48
#define ST_ICONF_VAL_MAX 4096

struct st_iconf {
	char val[ST_ICONF_MAX_KNOBS][ST_ICONF_VAL_MAX];
	uint8_t set[ST_ICONF_MAX_KNOBS];  /* 1 when the file or a flag set it */
};

/* Fills every knob with its default (set[] stays 0). */
void st_iconf_init(struct st_iconf *c);

/*
 * Reads an INI file into c (on top of what c holds).  Unknown sections or
 * keys, and invalid values, are errors: -EINVAL with diag "FILE:LINE: key
 * kv.dtype: 'fp9' is not one of f32|f16|bf16|fp8".  -errno when the file
 * cannot be read.
 */
int st_iconf_load(struct st_iconf *c, const char *path, struct st_diag *diag);

/* Sets "section.key" to value after validating it (same errors, without a
 * line).  0, -ST_E_NOTFOUND (no such knob) or -EINVAL. */
int st_iconf_set(struct st_iconf *c, const char *name, const char *value,
		 struct st_diag *diag);

/* The value of "section.key" (its default when unset; "" when none);
 * NULL when there is no such knob. */
const char *st_iconf_get(const struct st_iconf *c, const char *name);

/* 1 when the boolean knob "section.key" is on (on, true, yes, 1), else 0
 * (also for no such knob). */
int st_iconf_get_bool(const struct st_iconf *c, const char *name);

/* 1 when "section.key" was set by the file or a flag. */
int st_iconf_is_set(const struct st_iconf *c, const char *name);

/* Writes a warning line to f for every knob that is set to another value
 * than its default but not honoured yet; returns how many. */
int st_iconf_warn_unhonoured(const struct st_iconf *c, FILE *f,
			     const char *who);

/* Prints the knobs as a table (for --help-config). */
void st_iconf_print_help(FILE *f);

#endif
