//go:build linux

// A hardware CRC-32C for librocksdb (see crc32c_amd64.go for why).
//
// Debian's librocksdb 7.8.3 is built portable, without SSE4.2, so its
// rocksdb::crc32c::Extend is a table-driven loop of about 1.2 GB/s on the
// dev VM: it checksums every blob record, WAL record and SST block, and it
// was about a quarter of the CPU of a 1 MiB block write. librocksdb calls
// Extend through its PLT (37 call sites, no -Bsymbolic), so the definition
// below, in the executable, is the one those calls bind to: the same ELF
// interposition that lets a program supply its own malloc. The function
// computes exactly what RocksDB's does (CRC-32C, Castagnoli, reflected,
// with the pre- and post-inversion inside Extend), three streams at a time
// with the SSE4.2 crc32 instruction.

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <pthread.h>
#include <nmmintrin.h>

// Stream lengths of the three-way loops: three streams of kLong bytes, then
// three of kShort, then one stream for what is left.
enum { kLong = 4096, kShort = 256 };

// Shift tables: shift_n(s) is the raw CRC register after n zero bytes from
// register s. It is linear in s, so four tables of 256 entries (one per
// byte of s) hold it.
static uint32_t long_shift[4][256];
static uint32_t short_shift[4][256];

static pthread_once_t tables_once = PTHREAD_ONCE_INIT;
static int have_sse42;

// zeros runs the raw register s over n zero bytes (n a multiple of 8).
__attribute__((target("sse4.2")))
static uint32_t zeros(uint32_t s, size_t n) {
	uint64_t r = s;
	for (size_t i = 0; i < n; i += 8) {
		r = _mm_crc32_u64(r, 0);
	}
	return (uint32_t)r;
}

__attribute__((target("sse4.2")))
static void fill_shift(uint32_t t[4][256], size_t n) {
	uint32_t basis[32];
	for (int i = 0; i < 32; i++) {
		basis[i] = zeros((uint32_t)1 << i, n);
	}
	for (int k = 0; k < 4; k++) {
		for (int b = 0; b < 256; b++) {
			uint32_t v = 0;
			for (int j = 0; j < 8; j++) {
				if (b & (1 << j)) {
					v ^= basis[8 * k + j];
				}
			}
			t[k][b] = v;
		}
	}
}

static void init_tables(void) {
	__builtin_cpu_init();
	have_sse42 = __builtin_cpu_supports("sse4.2");
	if (have_sse42) {
		fill_shift(long_shift, kLong);
		fill_shift(short_shift, kShort);
	}
}

static inline uint32_t shift(uint32_t t[4][256], uint32_t s) {
	return t[0][s & 0xff] ^ t[1][(s >> 8) & 0xff] ^ t[2][(s >> 16) & 0xff] ^ t[3][s >> 24];
}

static inline uint64_t load64(const unsigned char *p) {
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

// three runs the raw register s over 3*n bytes at p (n a multiple of 8) as
// three interleaved streams, joined with the shift table for n bytes.
__attribute__((target("sse4.2")))
static uint32_t three(uint32_t s, const unsigned char *p, size_t n, uint32_t t[4][256]) {
	uint64_t a = s, b = 0, c = 0;
	const unsigned char *pb = p + n, *pc = p + 2 * n;
	for (size_t i = 0; i < n; i += 8) {
		a = _mm_crc32_u64(a, load64(p + i));
		b = _mm_crc32_u64(b, load64(pb + i));
		c = _mm_crc32_u64(c, load64(pc + i));
	}
	return shift(t, shift(t, (uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)c;
}

// hw_extend is tidepool_crc32c_extend with the crc32 instruction.
__attribute__((target("sse4.2")))
static uint32_t hw_extend(uint32_t crc, const unsigned char *p, size_t n) {
	uint32_t s = ~crc;
	while (n >= 3 * kLong) {
		s = three(s, p, kLong, long_shift);
		p += 3 * kLong;
		n -= 3 * kLong;
	}
	while (n >= 3 * kShort) {
		s = three(s, p, kShort, short_shift);
		p += 3 * kShort;
		n -= 3 * kShort;
	}
	uint64_t r = s;
	for (; n >= 8; n -= 8, p += 8) {
		r = _mm_crc32_u64(r, load64(p));
	}
	s = (uint32_t)r;
	for (; n > 0; n--, p++) {
		s = _mm_crc32_u8(s, *p);
	}
	return ~s;
}

// sw_extend is the bitwise CRC-32C, for a CPU without SSE4.2 (none that
// runs tidepool in practice; it keeps the symbol correct everywhere).
static uint32_t sw_extend(uint32_t crc, const unsigned char *p, size_t n) {
	uint32_t s = ~crc;
	while (n--) {
		s ^= *p++;
		for (int k = 0; k < 8; k++) {
			s = (s >> 1) ^ (0x82f63b78u & (0u - (s & 1)));
		}
	}
	return ~s;
}

// extend_calls counts the calls, so that a test can see librocksdb's
// checksums come here (one relaxed add next to a pass over the bytes).
static volatile uint64_t extend_calls;

// tidepool_crc32c_extend is the CRC-32C of buf[0:n] continued from crc (a
// finished CRC-32C, 0 for none), as rocksdb::crc32c::Extend.
uint32_t tidepool_crc32c_extend(uint32_t crc, const char *buf, size_t n) {
	pthread_once(&tables_once, init_tables);
	__atomic_fetch_add(&extend_calls, 1, __ATOMIC_RELAXED);
	if (have_sse42) {
		return hw_extend(crc, (const unsigned char *)buf, n);
	}
	return sw_extend(crc, (const unsigned char *)buf, n);
}

uint64_t tidepool_crc32c_calls(void) {
	return __atomic_load_n(&extend_calls, __ATOMIC_RELAXED);
}

int tidepool_crc32c_hardware(void) {
	pthread_once(&tables_once, init_tables);
	return have_sse42;
}

// rocksdb::crc32c::Extend(unsigned int, char const*, unsigned long), by its
// mangled name: the symbol librocksdb's PLT resolves.
uint32_t _ZN7rocksdb6crc32c6ExtendEjPKcm(uint32_t crc, const char *buf, size_t n)
	__attribute__((alias("tidepool_crc32c_extend")));
