/*
 * fuzz_main.c — the driver of the fuzz targets where libFuzzer is not
 * linked (GCC builds, the sanitizer build): runs every file named on the
 * command line, or every file in a named directory, through
 * LLVMFuzzerTestOneInput once, and prints how many ran.  A crash, a
 * sanitizer report or a failed FUZZ_CHECK ends the process like under
 * libFuzzer.  Exit 1 when an argument cannot be read or nothing ran.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

/* Runs one file; 1 if it ran, 0 on a read error (reported). */
static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	size_t len = 0, cap = 0, n;

	if (!f) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		return 0;
	}
	do {
		if (len == cap) {
			uint8_t *nb = realloc(buf, cap = cap ? 2 * cap : 4096);

			if (!nb) {
				fprintf(stderr, "%s: out of memory\n", path);
				free(buf);
				fclose(f);
				return 0;
			}
			buf = nb;
		}
		n = fread(buf + len, 1, cap - len, f);
		len += n;
	} while (n > 0);
	if (ferror(f)) {
		fprintf(stderr, "%s: read error\n", path);
		free(buf);
		fclose(f);
		return 0;
	}
	fclose(f);
	/* an exact-size copy, so ASan sees a read past the input */
	{
		uint8_t *exact = malloc(len ? len : 1);

		if (!exact) {
			free(buf);
			return 0;
		}
		if (len)
			memcpy(exact, buf, len);
		free(buf);
		LLVMFuzzerTestOneInput(exact, len);
		free(exact);
	}
	return 1;
}

/* Runs a directory's regular files in name order; -1 on an error. */
static int run_dir(const char *dir)
{
	struct dirent **names;
	int n = scandir(dir, &names, NULL, alphasort), ran = 0, bad = 0;

	if (n < 0) {
		fprintf(stderr, "%s: %s\n", dir, strerror(errno));
		return -1;
	}
	for (int i = 0; i < n; i++) {
		char path[4096];
		struct stat st;

		if (names[i]->d_name[0] != '.' &&
		    snprintf(path, sizeof(path), "%s/%s", dir,
			     names[i]->d_name) < (int)sizeof(path) &&
		    stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
			if (run_file(path))
				ran++;
			else
				bad = 1;
		}
		free(names[i]);
	}
	free(names);
	return bad ? -1 : ran;
}

int main(int argc, char **argv)
{
	int ran = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: %s FILE|DIR...\n"
			"Runs each input through the fuzz target once (no "
			"mutation: build with -Dlibfuzzer=true for that).\n",
			argv[0]);
		return 2;
	}
	if (LLVMFuzzerInitialize && LLVMFuzzerInitialize(&argc, &argv) != 0)
		return 1;
	for (int i = 1; i < argc; i++) {
		struct stat st;
		int r;

		if (stat(argv[i], &st) != 0) {
			fprintf(stderr, "%s: %s\n", argv[i], strerror(errno));
			return 1;
		}
		r = S_ISDIR(st.st_mode) ? run_dir(argv[i]) : run_file(argv[i]);
		if (r < 0 || r == 0)
			return 1;
		ran += r;
	}
	printf("%d inputs ran without a finding\n", ran);
	return ran > 0 ? 0 : 1;
}
