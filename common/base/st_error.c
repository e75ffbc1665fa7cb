/* st_error.c — names for strata's error space (see st_error.h). */
#include "st_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int st_diag_set(struct st_diag *diag, int err, const char *fmt, ...)
{
	va_list ap;

	if (!diag)
		return err;
	va_start(ap, fmt);
	vsnprintf(diag->msg, sizeof(diag->msg), fmt, ap);
	va_end(ap);
	return err;
}

const char *st_strerror(int err)
{
	int e = err < 0 ? -err : err;

	switch (e) {
	case ST_E_BADMAGIC: return "bad magic (not a strata object or wrong kind)";
	case ST_E_VERSION: return "layout or protocol version mismatch";
	case ST_E_CHECKSUM: return "checksum mismatch";
	case ST_E_BUDGET: return "budget too small";
	case ST_E_PEERGONE: return "peer daemon gone or not answering";
	case ST_E_FORMAT: return "malformed file contents";
	case ST_E_CONFIG: return "inconsistent model config";
	case ST_E_UNSUPPORTED: return "unsupported";
	case ST_E_PROTO: return "malformed message";
	case ST_E_NOTFOUND: return "not found";
	case ST_E_BUSY: return "all slots busy (pinned or loading)";
	case ST_E_STALE: return "stale handle (generation or epoch changed)";
	case ST_E_TOKENIZER: return "tokenizer error";
	case ST_E_NOMSG: return "messaging (nanomsg) error";
	case ST_E_CUDA: return "CUDA runtime error";
	case ST_E_CUBLAS: return "cuBLAS error";
	case ST_E_TIMEOUT: return "timed out";
	case ST_E_LIMIT: return "request exceeds a limit";
	default:
		break;
	}
	if (e > 0 && e < ST_ERR_BASE)
		return strerror(e);
	return "unknown error";
}
