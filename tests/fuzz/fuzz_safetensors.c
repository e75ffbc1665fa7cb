/*
 * fuzz_safetensors.c — st_safetensors_parse on any bytes as a whole
 * .safetensors file image (8-byte header length, JSON header, data).
 * Checks what a caller relies on: on success every tensor lies inside the
 * buffer after the length word, its element count is its shape's product,
 * names are sorted and unique; on failure a message.
 */
#include <string.h>

#include "fuzz.h"
#include "st_safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct st_tensor_info *t = NULL;
	struct st_diag diag = { { 0 } };
	int n = st_safetensors_parse(data, size, "fuzz.safetensors", 0, &t,
				     &diag);

	if (n < 0) {
		FUZZ_CHECK(diag.msg[0], "error %d without a message", n);
		return 0;
	}
	FUZZ_CHECK(n == 0 || t, "%d tensors, no array", n);
	for (int i = 0; i < n; i++) {
		uint64_t elems = 1;

		FUZZ_CHECK(t[i].name, "tensor %d unnamed", i);
		FUZZ_CHECK(t[i].n_dims >= 0 && t[i].n_dims <= ST_MAX_DIMS,
			   "tensor %s: %d dims", t[i].name, t[i].n_dims);
		for (int d = 0; d < t[i].n_dims; d++) {
			FUZZ_CHECK(t[i].shape[d] >= 0, "tensor %s: dim %d < 0",
				   t[i].name, d);
			elems *= (uint64_t)t[i].shape[d];
		}
		FUZZ_CHECK(elems == t[i].n_elems, "tensor %s: %llu elements, "
			   "shape gives %llu", t[i].name,
			   (unsigned long long)t[i].n_elems,
			   (unsigned long long)elems);
		FUZZ_CHECK(t[i].file_offset >= 8 &&
			   t[i].file_offset <= size &&
			   t[i].n_bytes <= size - t[i].file_offset,
			   "tensor %s [%llu, +%llu) outside %zu bytes",
			   t[i].name, (unsigned long long)t[i].file_offset,
			   (unsigned long long)t[i].n_bytes, size);
		FUZZ_CHECK(i == 0 || strcmp(t[i - 1].name, t[i].name) < 0,
			   "tensors not sorted or a duplicate: %s", t[i].name);
	}
	st_tensor_infos_free(t, n);
	return 0;
}
