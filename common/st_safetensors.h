/*
 * st_safetensors.h — reading Hugging Face safetensors checkpoints.
 *
 * A checkpoint directory holds config.json and either model.safetensors or
 * several shards listed in model.safetensors.index.json ("weight_map":
 * tensor name -> shard file).  Each file: u64 little-endian header length N,
 * N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]},
 * "__metadata__": {...}}, then the data; offsets are relative to the end of
 * the header.  The header is parsed with jansson and validated: header length
 * inside the file and at most 100 MB (the reference implementation's limit),
 * a JSON object without duplicate keys, each entry an object with "dtype"
 * (a string naming a supported dtype), "shape" (at most ST_MAX_DIMS
 * non-negative integers; [] is a scalar) and "data_offsets" ([begin, end],
 * non-negative integers), end >= begin, end inside the data area, shape
 * product x dtype size == end - begin, no two non-empty tensors overlapping
 * (gaps between tensors are allowed), "__metadata__" (an object) skipped;
 * across shards: no duplicate names, every tensor of the index present in
 * the shard it names, shard names plain file names in the directory, and —
 * stricter than transformers, which ignores them — no tensor in a shard
 * that the index does not list (shards and index from different
 * checkpoints).  Every error names the file, the tensor and the problem
 * (struct st_diag).
 */
#ifndef ST_SAFETENSORS_H
#define ST_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "st_error.h"
#include "st_formats.h"

#define ST_MAX_DIMS 8

struct st_tensor_info {
	char *name;            /* owned by the checkpoint */
	enum st_dtype dtype;
	int n_dims;
	int64_t shape[ST_MAX_DIMS];
	uint64_t n_elems;
	int file_index;        /* index into st_checkpoint.files */
	uint64_t file_offset;  /* absolute byte offset of the data in its file */
	uint64_t n_bytes;
};

struct st_checkpoint {
	char *dir;             /* owned */
	int n_files;
	char **file_names;     /* owned, base names */
	const uint8_t **maps;  /* read-only mmap of each file */
	uint64_t *file_sizes;
	int n_tensors;
	struct st_tensor_info *tensors; /* owned, sorted by name (strcmp) */
};

/*
 * Opens a checkpoint directory (single file or sharded with an index),
 * mmaps every file read-only and validates every header.
 * On success *ret is owned by the caller (st_checkpoint_close).
 * The index wins when both model.safetensors.index.json and
 * model.safetensors exist.  Files stay mapped until st_checkpoint_close (a
 * file truncated by someone else meanwhile faults on access: not guarded).
 * Errors: -ENOENT (no model.safetensors and no index, or a shard missing),
 * -ST_E_FORMAT (bad header or index, with the file/tensor/problem in diag),
 * -ST_E_UNSUPPORTED (dtype), -ENOMEM, -errno from open/mmap.
 */
int st_checkpoint_open(const char *dir, struct st_checkpoint **ret,
		       struct st_diag *diag);

/* Unmaps and frees everything; NULL is fine. */
void st_checkpoint_close(struct st_checkpoint *ck);

/* Finds a tensor by exact name (binary search), or NULL. */
const struct st_tensor_info *st_checkpoint_find(const struct st_checkpoint *ck,
						const char *name);

/* Pointer to the tensor's bytes inside the mapping (borrowed, valid until
 * st_checkpoint_close; no alignment guaranteed), or NULL for a tensor that
 * is not of this checkpoint. */
const void *st_checkpoint_data(const struct st_checkpoint *ck,
			       const struct st_tensor_info *t);

/*
 * Validates one safetensors file image (buf, len: the whole file) and calls
 * nothing else: used by st_checkpoint_open and by tests/fuzzers.
 * On success returns the number of tensors and, if ret_tensors is non-NULL,
 * a malloc'd array of them sorted by name, with file_index set and
 * file_offset absolute in buf (names malloc'd; free with
 * st_tensor_infos_free).  file_name is used in messages only.
 * Errors: -ST_E_FORMAT, -ST_E_UNSUPPORTED (dtype, MXFP4 included: strata's
 * packed type never appears in safetensors), -ENOMEM; diag says which.
 */
int st_safetensors_parse(const void *buf, uint64_t len, const char *file_name,
			 int file_index, struct st_tensor_info **ret_tensors,
			 struct st_diag *diag);

void st_tensor_infos_free(struct st_tensor_info *t, int n);

#endif
