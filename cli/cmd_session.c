/* cmd_session.c — `strata session save|load|ls|rm`: saved sessions
 * (conversations' KV, issue 23 item 4; computed/serve/cw_session.h,
 * kvd/kv_session.h) on a running instance, through computed's control
 * socket (CW_MSG_SESSION), so they work without the HTTP API too. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_cmds.h"
#include "cli_registry.h"
#include "cw_client.h"
#include "cw_proto.h"
#include "kv_session_proto.h"
#include "st_daemon.h"
#include "st_util.h"

static void usage(FILE *f)
{
	fprintf(f,
"Usage: strata session ls [--json]\n"
"       strata session save NAME (--prompt TEXT | --prompt-file FILE)\n"
"       strata session load NAME\n"
"       strata session rm NAME\n"
"       [--instance NAME] [--run-dir DIR] [--timeout SEC]\n"
"\n"
"Saved sessions of a running instance (strata up): a conversation's KV,\n"
"every stream of the model, kept in kvd's session directory (kvd\n"
"--session-dir, default RUN_DIR/sessions) and usable after kvd, computed\n"
"or the whole instance restarted.\n"
"  ls    the sessions: name, rows, bytes, model; a file kvd cannot load\n"
"        (corrupt, truncated, a symbolic link, another format) shows as\n"
"        corrupt (WHY)\n"
"  save  saves the KV the instance holds in its prefix cache for the\n"
"        conversation TEXT (a prompt it computed before: every full page\n"
"        of rows); a session of that name is replaced (said so, with its\n"
"        old row count); HTTP clients save with the request field\n"
"        \"session\": {\"save\": NAME}, which includes the generated tokens\n"
"  load  puts the session's pages in kvd's prefix cache: a request whose\n"
"        prompt starts with the conversation maps them instead of\n"
"        computing them (the HTTP field \"session\": {\"load\": NAME} does\n"
"        this before its request); refused, with what differs, for another\n"
"        model, store, KV dtype or page size, and for a corrupt file\n"
"  rm    removes it\n"
"Names: 1-64 letters, digits, '.', '_', '-', not starting with '.'.\n");
}

/* Prints computed's JSON answer for op. */
static void print_answer(uint32_t op, const char *txt, int json)
{
	json_t *j = json_loads(txt, 0, NULL), *data, *e;
	size_t i;

	if (json || !j) {
		printf("%s\n", txt);
		json_decref(j);
		return;
	}
	if (op == KV_SESSION_LIST) {
		data = json_object_get(j, "data");
		printf("%-32s %8s %12s  %s\n", "NAME", "ROWS", "BYTES",
		       "MODEL");
		json_array_foreach(data, i, e) {
			const char *id = json_string_value(
				json_object_get(e, "id"));
			const char *bad = json_string_value(
				json_object_get(e, "corrupt"));
			long long bytes = (long long)json_integer_value(
				json_object_get(e, "bytes"));

			if (bad)
				printf("%-32s %8s %12lld  corrupt (%s)\n", id,
				       "-", bytes, bad);
			else
				printf("%-32s %8lld %12lld  %s\n", id,
				       (long long)json_integer_value(
					       json_object_get(e, "rows")),
				       bytes, json_string_value(
					       json_object_get(e, "model")));
		}
	} else if (op == KV_SESSION_REMOVE) {
		printf("session '%s' removed\n",
		       json_string_value(json_object_get(j, "id")));
	} else {
		printf("session '%s' %s: %lld rows",
		       json_string_value(json_object_get(j, "id")),
		       op == KV_SESSION_SAVE ? "saved" : "loaded into the "
		       "prefix cache",
		       (long long)json_integer_value(
			       json_object_get(j, "rows")));
		if (json_is_true(json_object_get(j, "replaced")))
			printf(" (replaced the old session of %lld rows)",
			       (long long)json_integer_value(
				       json_object_get(j, "replaced_rows")));
		printf("\n");
	}
	json_decref(j);
}

int cli_cmd_session(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "instance", required_argument, NULL, 'i' },
		{ "run-dir", required_argument, NULL, 'R' },
		{ "prompt", required_argument, NULL, 'p' },
		{ "prompt-file", required_argument, NULL, 'f' },
		{ "timeout", required_argument, NULL, 't' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *instance = "default", *run_dir = NULL, *prompt = NULL;
	const char *prompt_file = NULL, *sub, *name = "";
	char rd[4096], *text = NULL, *answer = NULL;
	struct st_diag diag = { "" };
	struct cw_client *cw = NULL;
	int timeout_s = 120, json = 0, c, r;
	uint32_t op;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'i': instance = optarg; break;
		case 'R': run_dir = optarg; break;
		case 'p': prompt = optarg; break;
		case 'f': prompt_file = optarg; break;
		case 't': timeout_s = atoi(optarg); break;
		case 'j': json = 1; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return 2;
	}
	sub = argv[optind++];
	op = !strcmp(sub, "ls") ? KV_SESSION_LIST :
	     !strcmp(sub, "save") ? KV_SESSION_SAVE :
	     !strcmp(sub, "load") ? KV_SESSION_LOAD :
	     !strcmp(sub, "rm") ? KV_SESSION_REMOVE : 0;
	if (!op || (op == KV_SESSION_LIST) != (optind == argc) ||
	    argc - optind > 1 || timeout_s <= 0) {
		fprintf(stderr, "strata session: %s\n", !op ?
			"the command is ls, save, load or rm" :
			op == KV_SESSION_LIST ? "ls takes no name" :
			"give one session NAME");
		return 2;
	}
	if (optind < argc)
		name = argv[optind];
	if (op != KV_SESSION_LIST && !kv_session_name_ok(name, &diag)) {
		fprintf(stderr, "strata session: %s\n", diag.msg);
		return 2;
	}
	if ((op == KV_SESSION_SAVE) != (prompt || prompt_file) ||
	    (prompt && prompt_file)) {
		fprintf(stderr, "strata session: %s\n", op == KV_SESSION_SAVE ?
			"save takes --prompt TEXT or --prompt-file FILE" :
			"--prompt and --prompt-file are for save only");
		return 2;
	}
	if (prompt_file && (r = st_read_file(prompt_file, &text, NULL)) < 0) {
		fprintf(stderr, "strata session: %s: %s\n", prompt_file,
			st_strerror(r));
		return 1;
	}
	if (run_dir) {
		snprintf(rd, sizeof(rd), "%s", run_dir);
	} else if (cli_registry_lookup(instance, rd, sizeof(rd)) < 0) {
		st_run_dir_default(instance, rd, sizeof(rd));
	}
	c = st_pidfile_read(rd, "computed");
	if (c <= 0 || !st_pid_alive(c)) {
		free(text);
		fprintf(stderr, "strata session: no running computed for "
			"instance %s (%s); start it with strata up\n",
			instance, rd);
		return 1;
	}
	r = cw_client_open(rd, timeout_s * 1000, &cw, &diag);
	if (r == 0)
		r = cw_client_session(cw, op, name,
				      CW_GEN_F_ADD_SPECIAL |
				      CW_GEN_F_PARSE_SPECIAL,
				      text ? text : prompt ? prompt : "",
				      &answer, &diag);
	cw_client_close(cw);
	free(text);
	if (r < 0) {
		fprintf(stderr, "strata session %s: %s (instance %s, %s)\n",
			sub, diag.msg, instance, rd);
		return 1;
	}
	print_answer(op, answer, json);
	free(answer);
	return 0;
}
