/*
 * fuzz.h — the libFuzzer entry points every target in tests/fuzz defines.
 * Built with clang -fsanitize=fuzzer (meson -Dlibfuzzer=true) libFuzzer
 * drives them; otherwise fuzz_main.c replays corpus files through them, so
 * the default and sanitizer builds run the seeds and every crash kept in the
 * corpus as a regression test.
 */
#ifndef ST_FUZZ_H
#define ST_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* One input: must not crash, leak or read out of bounds, whatever the
 * bytes; returns 0 (libFuzzer's contract). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Optional one-time set-up (targets that load a tokenizer); 0 on success.
 * Declared weak so targets without it link. */
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

/* Aborts with a message when a target's own check fails (a decoder
 * accepted something it must refuse): a finding, like a sanitizer report. */
#define FUZZ_CHECK(cond, ...)                                                 \
	do {                                                                  \
		if (!(cond)) {                                                \
			fprintf(stderr, "fuzz check failed: %s: ", #cond);    \
			fprintf(stderr, __VA_ARGS__);                         \
			fputc('\n', stderr);                                  \
			abort();                                              \
		}                                                             \
	} while (0)

#endif
