/*
 * st_proto.h — the wire format shared by every strata daemon and client.
 *
 * A message is a fixed 32-byte header followed by a payload of fixed-width
 * little-endian fields (no pointers, no padding on the wire).  The header:
 *
 *   off size field
 *     0    4 magic        ST_PROTO_MAGIC ("STRM")
 *     4    2 version      ST_PROTO_VERSION; a mismatch is refused
 *     6    2 type         ST_MSG_* (requests) or the same | ST_MSG_REPLY
 *     8    8 request_id   chosen by the client, echoed in the reply
 *    16    4 client_id    from ST_MSG_HELLO (0 before registering)
 *    20    4 status       replies: 0 or a negative st_error code
 *    24    4 payload_len  bytes after the header
 *    28    4 reserved     must be 0
 *
 * Every receiver validates magic, version, payload_len against the bytes
 * received and every payload field before using it (st_proto_decode_header,
 * st_rbuf_* return errors instead of reading past the end).  Bulk data never
 * travels in messages: it lives in shared memory (see DESIGN.md section 4).
 *
 * Type ranges: 0x00xx common to all daemons, 0x01xx expertd, 0x02xx kvd,
 * 0x03xx computed.  Per-daemon payloads are in es_proto.h, kv_proto.h,
 * cw_proto.h.
 */
#ifndef ST_PROTO_H
#define ST_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define ST_PROTO_MAGIC 0x4d525453u /* "STRM" little-endian */
#define ST_PROTO_VERSION 2 /* 2: HELLO start_ticks, pool_id in replies */
#define ST_PROTO_HEADER_BYTES 32
/* Receive limit set explicitly on every socket (PITFALLS P16); senders refuse
 * larger messages with -ST_E_LIMIT instead of letting the peer drop them. */
#define ST_MSG_MAX_BYTES (1024 * 1024)
/* Bytes the socket protocol (REQ/REP request ids, backtrace) adds in front
 * of a message; the receive limit is ST_MSG_MAX_BYTES plus this. */
#define ST_MSG_PROTO_HEADROOM 256

#define ST_MSG_REPLY 0x8000u

/* SHUTDOWN flags (optional u32 payload; other bits are refused).  KEEP_POOL:
 * exit cleanly but leave the pool segment (and kvd's spill file) for the
 * next daemon of the instance to adopt, as after a crash: `strata restart`
 * of expertd or kvd while computed runs keeps every expert and KV page
 * (DESIGN.md section 6).  A high bit, so a stray 1 is refused. */
#define ST_SHUTDOWN_F_KEEP_POOL 0x10000u

enum st_msg_type {
	/* common to every daemon */
	ST_MSG_HELLO = 0x0001,    /* u32 pid, u32 proto_version, char name[32] -> u32 client_id, u64 epoch */
	ST_MSG_BYE = 0x0002,      /* (no payload) -> (no payload); releases the client's leases */
	ST_MSG_PING = 0x0003,     /* -> u32 pid, u64 epoch, u32 ready */
	ST_MSG_STATS = 0x0004,    /* -> daemon-specific stats payload */
	ST_MSG_SHUTDOWN = 0x0005, /* [u32 flags] -> (no payload); the daemon then exits cleanly */

	ST_MSG_ES_FIRST = 0x0100,
	ST_MSG_KV_FIRST = 0x0200,
	ST_MSG_CW_FIRST = 0x0300,
};

struct st_msg_header {
	uint32_t magic;
	uint16_t version;
	uint16_t type;
	uint64_t request_id;
	uint32_t client_id;
	int32_t status;
	uint32_t payload_len;
	uint32_t reserved;
};

/* A growing little-endian write buffer.  Owns `data` (free with
 * st_wbuf_fini).  Any allocation failure is sticky in `err`. */
struct st_wbuf {
	uint8_t *data;
	size_t len;
	size_t cap;
	int err;
};

/* A bounds-checked little-endian read cursor over borrowed bytes. */
struct st_rbuf {
	const uint8_t *data;
	size_t len;
	size_t pos;
};

void st_wbuf_init(struct st_wbuf *w);
void st_wbuf_fini(struct st_wbuf *w);
void st_wbuf_u8(struct st_wbuf *w, uint8_t v);
void st_wbuf_u16(struct st_wbuf *w, uint16_t v);
void st_wbuf_u32(struct st_wbuf *w, uint32_t v);
void st_wbuf_i32(struct st_wbuf *w, int32_t v);
void st_wbuf_u64(struct st_wbuf *w, uint64_t v);
void st_wbuf_f32(struct st_wbuf *w, float v);
void st_wbuf_f64(struct st_wbuf *w, double v);
/* Writes exactly n bytes (copied). */
void st_wbuf_bytes(struct st_wbuf *w, const void *p, size_t n);
/* Writes u32 length + bytes. */
void st_wbuf_str(struct st_wbuf *w, const char *s);

void st_rbuf_init(struct st_rbuf *r, const void *data, size_t len);
/* Each reader returns 0, or -ST_E_PROTO if fewer bytes remain than needed
 * (the cursor does not move then). */
int st_rbuf_u8(struct st_rbuf *r, uint8_t *v);
int st_rbuf_u16(struct st_rbuf *r, uint16_t *v);
int st_rbuf_u32(struct st_rbuf *r, uint32_t *v);
int st_rbuf_i32(struct st_rbuf *r, int32_t *v);
int st_rbuf_u64(struct st_rbuf *r, uint64_t *v);
int st_rbuf_f32(struct st_rbuf *r, float *v);
int st_rbuf_f64(struct st_rbuf *r, double *v);
int st_rbuf_bytes(struct st_rbuf *r, void *out, size_t n);
/* Reads a u32-length string of at most max_len bytes into a new malloc'd
 * NUL-terminated buffer (*ret owned by the caller).  -ST_E_PROTO if too long
 * or truncated, -ENOMEM. */
int st_rbuf_str(struct st_rbuf *r, size_t max_len, char **ret);
/* Bytes not yet read. */
size_t st_rbuf_left(const struct st_rbuf *r);

/*
 * Builds a complete message (header + payload) into `out` (reset first).
 * payload may be NULL when payload_len is 0.  Returns 0, -ENOMEM, or
 * -ST_E_LIMIT when the message would exceed ST_MSG_MAX_BYTES.
 */
int st_proto_encode(struct st_wbuf *out, uint16_t type, uint64_t request_id,
		    uint32_t client_id, int32_t status, const void *payload,
		    size_t payload_len);

/*
 * Validates and decodes the header of a received message of `len` bytes.
 * On success *ret_hdr is filled and the payload is buf+32 .. buf+32+payload_len.
 * Errors: -ST_E_PROTO (too short, payload_len inconsistent, reserved != 0),
 * -ST_E_BADMAGIC, -ST_E_VERSION.
 */
int st_proto_decode_header(const void *buf, size_t len,
			   struct st_msg_header *ret_hdr);

/* A readable name for a message type (for logs), never NULL. */
const char *st_proto_type_name(uint16_t type);

#endif
