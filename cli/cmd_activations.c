/*
 * cmd_activations.c — `strata activations`: the per-layer activation
 * histogram of the experts, from the statistics expertd saves in its state
 * directory (es_actstats.h): text bars on the terminal, JSON, or a PNG
 * drawn by gnuplot.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "cli_cmds.h"
#include "es_actstats.h"
#include "st_util.h"

static void usage(FILE *f)
{
	fprintf(f,
"Usage: strata activations (--state-dir DIR | --file FILE) [options]\n"
"\n"
"Prints how often each expert of each layer was chosen by the router, as\n"
"decayed counts (half-life in tokens, see expertd --stats-half-life), from\n"
"the activation statistics expertd keeps in its state directory.\n"
"\n"
"Options:\n"
"  --state-dir DIR   expertd's --state-dir (or run directory)\n"
"  --file FILE       an activations.bin file\n"
"  --layer L         only layer L\n"
"  --width N         bar width in characters (default 50)\n"
"  --json            counts as JSON on stdout\n"
"  --png FILE        draw a heat map with gnuplot: expert on x, layer on y,\n"
"                    colour the expert's share of its layer's decayed\n"
"                    activations; the colour bar marks the uniform share\n"
"                    1/experts (skipped with a message without gnuplot)\n"
"  -h, --help        this text\n");
}

static int have_gnuplot(void)
{
	return system("command -v gnuplot >/dev/null 2>&1") == 0;
}

/* Writes s as a gnuplot single-quoted string: a quote inside is doubled
 * (gnuplot's rule for '...' strings); no other character is special. */
static void put_quoted(FILE *g, const char *s)
{
	fputc('\'', g);
	for (; *s; s++) {
		if (*s == '\'')
			fputc('\'', g);
		fputc(*s, g);
	}
	fputc('\'', g);
}

/* Heat map: x expert, y layer, colour the share of the layer's count. */
static int draw_png(const struct es_actstats *s, const char *png)
{
	char dat[] = "/tmp/strata-act-XXXXXX";
	int fd;
	FILE *f, *g;
	int rc;

	if (!png[0] || strpbrk(png, "\n\r"))
		return -EINVAL; /* a gnuplot command ends at a line break */
	/* gnuplot writes to stdout when it cannot open its output: open it
	 * here first, so that a bad path is an error, not a PNG on stdout */
	fd = open(png, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	close(fd);
	fd = mkstemp(dat);
	if (fd < 0)
		return -errno;
	f = fdopen(fd, "w");
	if (!f) {
		close(fd);
		unlink(dat);
		return -ENOMEM;
	}
	for (uint32_t l = 0; l < s->n_layers; l++) {
		double sum = 0;

		for (uint32_t e = 0; e < s->n_experts; e++)
			sum += es_actstats_value(s, l, e);
		for (uint32_t e = 0; e < s->n_experts; e++)
			fprintf(f, "%u %u %g\n", e, l, sum > 0 ?
				es_actstats_value(s, l, e) / sum : 0);
		fprintf(f, "\n");
	}
	fclose(f);
	g = popen("gnuplot", "w");
	if (!g) {
		unlink(dat);
		return -errno;
	}
	fprintf(g, "set terminal png size 1000,%u\n", 200 + 24 * s->n_layers);
	fputs("set output ", g);
	put_quoted(g, png);
	fputc('\n', g);
	fprintf(g, "set title 'expert activations per layer (share of the "
		"layer, decayed, %llu tokens)'\n",
		(unsigned long long)s->tokens);
	fprintf(g, "set xlabel 'expert'\nset ylabel 'layer'\n");
	fprintf(g, "set xrange [-0.5:%u.5]\nset yrange [-0.5:%u.5]\n",
		s->n_experts - 1, s->n_layers - 1);
	/* above or below the uniform share is what the map is read for */
	if (s->n_experts)
		fprintf(g, "set cbtics add ('uniform 1/%u' %g)\n", s->n_experts,
			1.0 / s->n_experts);
	fprintf(g, "plot '%s' using 1:2:3 with image notitle\n", dat);
	rc = pclose(g);
	unlink(dat);
	return rc == 0 ? 0 : -EIO;
}

int cli_cmd_activations(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "state-dir", required_argument, NULL, 'd' },
		{ "file", required_argument, NULL, 'f' },
		{ "layer", required_argument, NULL, 'l' },
		{ "width", required_argument, NULL, 'w' },
		{ "json", no_argument, NULL, 'j' },
		{ "png", required_argument, NULL, 'p' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *dir = NULL, *file = NULL, *png = NULL;
	int only = -1, width = 50, json = 0, c, r;
	struct es_actstats s;
	struct st_diag diag = { "" };
	char path[4200];

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'd': dir = optarg; break;
		case 'f': file = optarg; break;
		case 'l': only = atoi(optarg); break;
		case 'w':
			width = atoi(optarg);
			if (width < 1 || width > 500) {
				fprintf(stderr, "strata activations: --width "
					"wants 1..500\n");
				return 2;
			}
			break;
		case 'j': json = 1; break;
		case 'p': png = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!dir == !file) {
		fprintf(stderr, "strata activations: give --state-dir DIR or "
			"--file FILE (see --help)\n");
		return 2;
	}
	if (dir)
		snprintf(path, sizeof(path), "%s/%s", dir, ES_ACTSTATS_FILE);
	else
		snprintf(path, sizeof(path), "%s", file);
	memset(&s, 0, sizeof(s));
	r = es_actstats_load(&s, path, 0, &diag);
	if (r < 0) {
		fprintf(stderr, "strata activations: %s%s\n", diag.msg,
			r == -ENOENT ? " (expertd writes it at exit and every "
			"--stats-save-interval seconds once it has seen "
			"tokens)" : "");
		return 1;
	}
	if (only >= (int)s.n_layers) {
		fprintf(stderr, "strata activations: --layer %d: the model has "
			"%u layers\n", only, s.n_layers);
		es_actstats_fini(&s);
		return 2;
	}
	if (json) {
		json_t *j = json_object(), *layers = json_array();

		json_object_set_new(j, "tokens", json_integer((json_int_t)s.tokens));
		json_object_set_new(j, "n_layers", json_integer(s.n_layers));
		json_object_set_new(j, "n_experts", json_integer(s.n_experts));
		for (uint32_t l = 0; l < s.n_layers; l++) {
			json_t *row = json_array();

			for (uint32_t e = 0; e < s.n_experts; e++)
				json_array_append_new(row, json_real(
					es_actstats_value(&s, l, e)));
			json_array_append_new(layers, row);
		}
		json_object_set_new(j, "counts", layers);
		json_dumpf(j, stdout, JSON_COMPACT);
		printf("\n");
		json_decref(j);
	} else {
		printf("activation statistics %s: %llu tokens, %u layers x %u "
		       "experts (decayed counts)\n", path,
		       (unsigned long long)s.tokens, s.n_layers, s.n_experts);
		for (uint32_t l = 0; l < s.n_layers; l++) {
			double max = 0, sum = 0;

			if (only >= 0 && (uint32_t)only != l)
				continue;
			for (uint32_t e = 0; e < s.n_experts; e++) {
				double v = es_actstats_value(&s, l, e);

				sum += v;
				if (v > max)
					max = v;
			}
			printf("layer %u\n", l);
			for (uint32_t e = 0; e < s.n_experts; e++) {
				double v = es_actstats_value(&s, l, e);
				int n = max > 0 ? (int)(v / max * width + 0.5) :
						  0;

				printf("  %4u %5.1f%% |", e,
				       sum > 0 ? 100 * v / sum : 0);
				for (int i = 0; i < n; i++)
					putchar('#');
				printf("\n");
			}
		}
	}
	if (png) {
		if (!have_gnuplot()) {
			fprintf(stderr, "strata activations: gnuplot is not "
				"installed, so no PNG was drawn (apt-get install "
				"gnuplot-nox)\n");
		} else if ((r = draw_png(&s, png)) < 0) {
			if (r == -EINVAL)
				fprintf(stderr, "strata activations: --png: "
					"the file name is empty or has a line "
					"break; choose another name\n");
			else if (r != -EIO)
				fprintf(stderr, "strata activations: --png "
					"%s: %s\n", png, st_strerror(r));
			else
				fprintf(stderr, "strata activations: gnuplot "
					"failed to draw %s\n", png);
			es_actstats_fini(&s);
			return 1;
		} else {
			fprintf(stderr, "strata activations: wrote %s\n", png);
		}
	}
	es_actstats_fini(&s);
	return 0;
}
