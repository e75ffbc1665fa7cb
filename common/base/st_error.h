/*
 * st_error.h — strata's single error space.
 *
 * Every function that can fail returns an int: 0 (or a count) on success and a
 * negative code on failure.  Negative errno values pass through unchanged
 * (-ENOMEM, -EIO, ...); strata's own codes start above the errno range
 * (ST_ERR_BASE) so the two never collide.  st_strerror() names all of them.
 *
 * Rule (from nng): on success the callee owns what it was given; on failure
 * the caller still does.  Exactly one layer logs an error: the one that
 * handles it (usually a daemon's main loop or a command's main()).
 */
#ifndef ST_ERROR_H
#define ST_ERROR_H

#define ST_ERR_BASE 4096

enum st_err {
	ST_E_BADMAGIC = ST_ERR_BASE + 1, /* shm/file magic is not ours */
	ST_E_VERSION,      /* layout / protocol version mismatch */
	ST_E_CHECKSUM,     /* a checksum did not match */
	ST_E_BUDGET,       /* budget too small for the work asked */
	ST_E_PEERGONE,     /* the peer daemon died or does not answer */
	ST_E_FORMAT,       /* malformed file contents (safetensors, json, store) */
	ST_E_CONFIG,       /* inconsistent or unsupported model config */
	ST_E_UNSUPPORTED,  /* architecture / dtype / feature not supported */
	ST_E_PROTO,        /* malformed message */
	ST_E_NOTFOUND,     /* named thing (tensor, sequence, key) does not exist */
	ST_E_BUSY,         /* every slot/page pinned or loading; retry later */
	ST_E_STALE,        /* handle generation/epoch changed under us */
	ST_E_TOKENIZER,    /* tokenizer file not understood */
	ST_E_NOMSG,        /* nanomsg error (wrapped) */
	ST_E_CUDA,         /* CUDA runtime error (wrapped) */
	ST_E_CUBLAS,       /* cuBLAS error (wrapped) */
	ST_E_TIMEOUT,      /* operation timed out */
	ST_E_LIMIT,        /* request exceeds a hard limit (context, message size) */
	ST_E_MAX
};

/*
 * A diagnostic message that travels up with an error code: the layer that
 * detects a problem writes what and where ("model.safetensors: tensor
 * lm_head.weight: data [10, 20) outside the file"), the layer that handles it
 * logs it once.  Functions take `struct st_diag *diag`, which may be NULL.
 */
struct st_diag {
	char msg[1024];
};

/* Formats into diag->msg (no-op when diag is NULL) and returns `err`, so a
 * failing function can `return st_diag_set(diag, -ST_E_FORMAT, "...")`. */
int st_diag_set(struct st_diag *diag, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Returns a static, human-readable name for any code of the error space
 * (negative errno or -ST_E_*); never NULL. */
const char *st_strerror(int err);

#endif
