/* cli_cmds.h — the subcommands of the strata CLI.  Each takes argv starting
 * at the command name and returns the process exit code (0 ok, 1 failure,
 * 2 usage error). */
#ifndef CLI_CMDS_H
#define CLI_CMDS_H

#include <stddef.h>
#include <stdint.h>

#include "st_error.h"

int cli_cmd_run(int argc, char **argv);
int cli_cmd_convert(int argc, char **argv);
int cli_cmd_verify(int argc, char **argv);
int cli_cmd_up(int argc, char **argv);
int cli_cmd_down(int argc, char **argv);
int cli_cmd_status(int argc, char **argv);
int cli_cmd_ps(int argc, char **argv);
int cli_cmd_perplexity(int argc, char **argv);
int cli_cmd_info(int argc, char **argv);
int cli_cmd_restart(int argc, char **argv);
int cli_cmd_exec(int argc, char **argv);
int cli_cmd_topo(int argc, char **argv);
int cli_cmd_plan(int argc, char **argv);
int cli_cmd_replay(int argc, char **argv);
int cli_cmd_calibrate(int argc, char **argv);
int cli_cmd_session(int argc, char **argv);

/* Helpers shared by the commands (cmd_convert.c). */
/* Default store directory for a model dir and expert format, under
 * $STRATA_CACHE_DIR or $XDG_CACHE_HOME/strata or ~/.cache/strata. */
int cli_default_store_dir(const char *model_dir, const char *experts,
			  char *buf, size_t len);
/* An expert-format spec is "FORMAT[:KEEP][/SEARCH]" (--experts,
 * --keep-layers and --scale-search together, e.g.
 * "mxfp4:first,last=bf16/mse"); writes it into buf.  keep and
 * scale_search may be NULL; scale_search "none" is left out. */
int cli_experts_spec(char *buf, size_t len, const char *experts,
		     const char *keep, const char *scale_search);
/* Dense weights of a conversion (cli_convert's dense_f32 argument). */
#define CLI_DENSE_AUTO 0 /* BF16 when the checkpoint's are BF16, else F32 */
#define CLI_DENSE_F32 1
#define CLI_DENSE_FP8 2  /* attention and LM head FP8 E4M3 (es_convert.h) */
/* Converts model_dir into store_dir with a progress bar on a terminal.
 * experts: an expert-format spec (cli_experts_spec); dense_f32: a
 * CLI_DENSE_* value.  A stop signal pending on sigfd (>= 0)
 * cancels the conversion cleanly.  0, 1 (error printed) or 130
 * (interrupted). */
int cli_convert(const char *model_dir, const char *store_dir,
		const char *experts, int dense_f32, int force, int sigfd);
/* 1 if store_dir was written by another store version, or the checkpoint
 * files recorded in its manifest differ in size from those in model_dir now
 * (or one is missing), else 0. */
int cli_store_stale(const char *store_dir, const char *model_dir);
/* 1 if store_dir is a store of another model than the checkpoint in
 * model_dir (their configs differ in architecture or shape: not a stale
 * store of the same model), else 0 (also when either cannot be read).
 * ret_store / ret_model: what each holds, for the message
 * ("MixtralForCausalLM, 4 layers, hidden 64, vocab 32000"). */
int cli_store_other_model(const char *store_dir, const char *model_dir,
			  char *ret_store, size_t store_cap, char *ret_model,
			  size_t model_cap);
/* When store_dir holds another model than model_dir
 * (cli_store_other_model): says so on stderr, naming both and --force,
 * and returns 1; else 0. */
int cli_store_refuse_other(const char *store_dir, const char *model_dir,
			   const char *who);
/* Checks options shared by several commands before anything starts:
 * instance name, budgets, KV dtype, expert format (any may be NULL).
 * Prints what is wrong, prefixed by `who`, and returns 1; else 0. */
int cli_check_common(const char *instance, const char *host_budget,
		     const char *kv_budget, const char *kv_dtype,
		     const char *experts, const char *who);
/* Default calibration statistics file of a model (what strata calibrate
 * writes and the "/cal" spec suffix reads): the store directory name of
 * cli_default_store_dir(model_dir, "stats") with ".calib" for ".strata".
 * 0 or -errno. */
int cli_default_calib_path(const char *model_dir, char *buf, size_t len);
/* st_calib_model_id of the checkpoint in model_dir.  0 or an error of
 * st_checkpoint_open / reading config.json, with diag. */
int cli_calib_model_id(const char *model_dir, uint64_t *ret,
		       struct st_diag *diag);
/* cli_convert with the statistics file of a calibrated search: calib_path,
 * or NULL for the model's default one (cli_default_calib_path) when the
 * spec asks for "/cal"; a calib_path given with a spec that asks for
 * another search makes the search calibrated. */
int cli_convert_calib(const char *model_dir, const char *store_dir,
		      const char *experts, const char *calib_path,
		      int dense_f32, int force, int sigfd);
/* cli_convert_calib with the precision of the other tensor kinds:
 * attention "bf16" / "f32" / "auto" (es_convert_parse_attention), shared
 * the shared-experts format; either may be NULL (defaults). */
int cli_convert_kinds(const char *model_dir, const char *store_dir,
		      const char *experts, const char *calib_path,
		      const char *attention, const char *shared,
		      int dense_f32, int force, int sigfd);
/* Default embedded model directory (models/kjv-moe of the source tree or of
 * the installed data dir) into buf; 0 or -ENOENT. */
int cli_default_model_dir(char *buf, size_t len);

/* strata activations: expert activation histogram (cmd_activations.c). */
int cli_cmd_activations(int argc, char **argv);

#endif
