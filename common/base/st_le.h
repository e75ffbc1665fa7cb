/*
 * st_le.h — little-endian byte order for file and value formats that must
 * read the same on every host (the remote KV tier's values, session files).
 */
#ifndef ST_LE_H
#define ST_LE_H

#include <stdint.h>

/* Stores v in the 4 bytes at q, least significant first (q needs no
 * alignment). */
static inline void st_put_le32(uint8_t *q, uint32_t v)
{
	for (int b = 0; b < 4; b++)
		q[b] = (uint8_t)(v >> (8 * b));
}

/* Stores v in the 8 bytes at q, least significant first. */
static inline void st_put_le64(uint8_t *q, uint64_t v)
{
	for (int b = 0; b < 8; b++)
		q[b] = (uint8_t)(v >> (8 * b));
}

/* The value st_put_le32 stored at q. */
static inline uint32_t st_get_le32(const uint8_t *q)
{
	uint32_t v = 0;

	for (int b = 0; b < 4; b++)
		v |= (uint32_t)q[b] << (8 * b);
	return v;
}

/* The value st_put_le64 stored at q. */
static inline uint64_t st_get_le64(const uint8_t *q)
{
	uint64_t v = 0;

	for (int b = 0; b < 8; b++)
		v |= (uint64_t)q[b] << (8 * b);
	return v;
}

#endif
