// libfakecuda.so: a TEST-ONLY STAND-IN for the CUDA driver library
// (libcuda.so.1). It is never shipped: the tests of cache/gpu and
// cmd/tidepool build it with cc and point gpu_library at it, so that the
// real package code loads it through the same purego path as the driver.
//
// It implements, on host memory, the driver calls cache/gpu makes, with the
// driver's signatures (CUipcMemHandle passed by value, 64 bytes):
//   - "device memory" is a memfd mapping (cuMemAlloc_v2);
//   - an IPC handle names the exporting process and the memfd's descriptor
//     (pid, fd, size); cuIpcOpenMemHandle_v2 opens /proc/<pid>/fd/<fd>, so
//     handles really cross processes, and one from a process that has
//     exited fails to open;
//   - each stream is a worker thread: copies and event records are queued
//     and complete asynchronously; an error is reported by the next event
//     or stream synchronization, as the driver reports copy faults;
//   - every call that needs a context fails with CUDA_ERROR_INVALID_CONTEXT
//     (201) on a thread where cuCtxSetCurrent was not called;
//   - copies check that device addresses lie in a known allocation or
//     opened handle (CUDA_ERROR_INVALID_VALUE otherwise).
//
// Injected failures:
//   - a copy whose source starts with the 8 bytes "FAILCOPY" fails (999),
//     one starting with "SLOWCOPY" takes 300 ms: data-dependent, so a test
//     can make a copy in another process (a real `tidepool serve`) fail;
//   - FAKECUDA_DEVICES=<n> (default 1): how many devices cuDeviceGetCount
//     reports (0: no device);
//   - FAKECUDA_COPY_DELAY_US=<us>: every copy sleeps that long;
//   - FAKECUDA_FAIL_HOST_REGISTER (set): cuMemHostRegister_v2 fails;
//   - fakecuda_fail(what, n): the next n calls of what ("dtoh", "htod",
//     "ipc_open", "host_register") fail;
//   - fakecuda_counts(out[8]): open IPC mappings, registered host ranges,
//     live streams, live events, live allocations, copies done, retained
//     primary contexts, failed copies.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct { char reserved[64]; } CUipcMemHandle;

enum {
	OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, NO_DEVICE = 100,
	INVALID_DEVICE = 101, INVALID_CONTEXT = 201, ALREADY_MAPPED = 208,
	INVALID_HANDLE = 400, HOST_MEMORY_ALREADY_REGISTERED = 712,
	HOST_MEMORY_NOT_REGISTERED = 713, UNKNOWN = 999,
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static __thread void *current_ctx;

struct range { uintptr_t base; size_t size; int fd; char key[64]; struct range *next; };
static struct range *allocs, *opened, *hostregs;
static long n_streams, n_events, n_copies, n_failed, n_ctx;
static int fail_dtoh, fail_htod, fail_ipc, fail_hostreg;

static int ndevices(void) {
	const char *s = getenv("FAKECUDA_DEVICES");
	return s ? atoi(s) : 1;
}

static long count(struct range *r) {
	long n = 0;
	for (; r; r = r->next) n++;
	return n;
}

static int inside(struct range *r, uintptr_t p, size_t n) {
	for (; r; r = r->next)
		if (p >= r->base && n <= r->size && p - r->base <= r->size - n) return 1;
	return 0;
}

static int device_range(uintptr_t p, size_t n) {
	pthread_mutex_lock(&mu);
	int ok = inside(allocs, p, n) || inside(opened, p, n);
	pthread_mutex_unlock(&mu);
	return ok;
}

static int take_fail(int *c) {
	pthread_mutex_lock(&mu);
	int f = *c > 0;
	if (f) (*c)--;
	pthread_mutex_unlock(&mu);
	return f;
}

void fakecuda_fail(const char *what, int n) {
	pthread_mutex_lock(&mu);
	if (!strcmp(what, "dtoh")) fail_dtoh = n;
	else if (!strcmp(what, "htod")) fail_htod = n;
	else if (!strcmp(what, "ipc_open")) fail_ipc = n;
	else if (!strcmp(what, "host_register")) fail_hostreg = n;
	pthread_mutex_unlock(&mu);
}

void fakecuda_counts(long *out) {
	pthread_mutex_lock(&mu);
	out[0] = count(opened); out[1] = count(hostregs); out[2] = n_streams; out[3] = n_events;
	out[4] = count(allocs); out[5] = n_copies; out[6] = n_ctx; out[7] = n_failed;
	pthread_mutex_unlock(&mu);
}

CUresult cuGetErrorString(CUresult e, const char **s) {
	switch (e) {
	case OK: *s = "no error"; break;
	case INVALID_VALUE: *s = "invalid argument (fakecuda)"; break;
	case NO_DEVICE: *s = "no CUDA-capable device is detected (fakecuda)"; break;
	case INVALID_CONTEXT: *s = "invalid device context (fakecuda: no current context on this thread)"; break;
	case ALREADY_MAPPED: *s = "resource already mapped (fakecuda)"; break;
	case INVALID_HANDLE: *s = "invalid resource handle (fakecuda)"; break;
	case UNKNOWN: *s = "unknown error (fakecuda: injected copy failure)"; break;
	default: *s = "fakecuda error"; break;
	}
	return OK;
}

CUresult cuInit(unsigned flags) {
	(void)flags;
	if (ndevices() <= 0) return NO_DEVICE;
	initialized = 1;
	return OK;
}

CUresult cuDriverGetVersion(int *v) { *v = 12040; return OK; }

CUresult cuDeviceGetCount(int *n) {
	if (!initialized) return NOT_INITIALIZED;
	*n = ndevices();
	return OK;
}

CUresult cuDeviceGet(int *dev, int ordinal) {
	if (!initialized) return NOT_INITIALIZED;
	if (ordinal < 0 || ordinal >= ndevices()) return INVALID_DEVICE;
	*dev = ordinal;
	return OK;
}

CUresult cuDeviceGetName(char *name, int len, int dev) {
	if (dev < 0 || dev >= ndevices() || len <= 0) return INVALID_VALUE;
	snprintf(name, (size_t)len, "fakecuda stand-in device %d", dev);
	return OK;
}

CUresult cuDeviceGetUuid_v2(unsigned char *uuid, int dev) {
	if (dev < 0 || dev >= ndevices()) return INVALID_DEVICE;
	memset(uuid, 0, 16);
	memcpy(uuid, "fakecuda", 8);
	uuid[15] = (unsigned char)dev;
	return OK;
}

static char ctxs[64];

CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
	if (!initialized) return NOT_INITIALIZED;
	if (dev < 0 || dev >= ndevices() || dev >= 64) return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	n_ctx++;
	pthread_mutex_unlock(&mu);
	*ctx = &ctxs[dev];
	return OK;
}

CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
	if (dev < 0 || dev >= ndevices()) return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	n_ctx--;
	pthread_mutex_unlock(&mu);
	return OK;
}

CUresult cuCtxSetCurrent(void *ctx) { current_ctx = ctx; return OK; }

#define NEED_CTX() do { if (!current_ctx) return INVALID_CONTEXT; } while (0)

// --- streams and events -------------------------------------------------

struct event { pthread_mutex_t mu; pthread_cond_t cv; int pending; CUresult err; };

enum { OP_COPY, OP_EVENT, OP_STOP };
struct op { int kind; void *dst; const void *src; size_t n; struct event *ev; struct op *next; };

struct stream {
	pthread_t th; pthread_mutex_t mu; pthread_cond_t cv;
	struct op *head, *tail; int busy; CUresult err;
};

static void *stream_main(void *arg) {
	struct stream *s = arg;
	long delay = 0;
	const char *d = getenv("FAKECUDA_COPY_DELAY_US");
	if (d) delay = atol(d);
	for (;;) {
		pthread_mutex_lock(&s->mu);
		while (!s->head) pthread_cond_wait(&s->cv, &s->mu);
		struct op *o = s->head;
		s->head = o->next;
		if (!s->head) s->tail = NULL;
		s->busy = 1;
		pthread_mutex_unlock(&s->mu);
		if (o->kind == OP_STOP) { free(o); return NULL; }
		if (o->kind == OP_COPY) {
			if (delay > 0) usleep((useconds_t)delay);
			if (o->n >= 8 && !memcmp(o->src, "SLOWCOPY", 8)) usleep(300000);
			CUresult e = OK;
			if (o->n >= 8 && !memcmp(o->src, "FAILCOPY", 8)) e = UNKNOWN;
			else memcpy(o->dst, o->src, o->n);
			pthread_mutex_lock(&mu);
			if (e) n_failed++; else n_copies++;
			pthread_mutex_unlock(&mu);
			pthread_mutex_lock(&s->mu);
			if (e && !s->err) s->err = e;
			pthread_mutex_unlock(&s->mu);
		} else {
			pthread_mutex_lock(&s->mu);
			CUresult e = s->err;
			s->err = OK;
			pthread_mutex_unlock(&s->mu);
			pthread_mutex_lock(&o->ev->mu);
			o->ev->err = e;
			o->ev->pending = 0;
			pthread_cond_broadcast(&o->ev->cv);
			pthread_mutex_unlock(&o->ev->mu);
		}
		free(o);
		pthread_mutex_lock(&s->mu);
		s->busy = 0;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mu);
	}
}

static CUresult enqueue(struct stream *s, struct op *o) {
	o->next = NULL;
	pthread_mutex_lock(&s->mu);
	if (s->tail) s->tail->next = o; else s->head = o;
	s->tail = o;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return OK;
}

CUresult cuStreamCreate(void **out, unsigned flags) {
	(void)flags;
	NEED_CTX();
	struct stream *s = calloc(1, sizeof *s);
	if (!s) return UNKNOWN;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	if (pthread_create(&s->th, NULL, stream_main, s)) { free(s); return UNKNOWN; }
	pthread_mutex_lock(&mu);
	n_streams++;
	pthread_mutex_unlock(&mu);
	*out = s;
	return OK;
}

CUresult cuStreamSynchronize(void *stream) {
	NEED_CTX();
	struct stream *s = stream;
	pthread_mutex_lock(&s->mu);
	while (s->head || s->busy) pthread_cond_wait(&s->cv, &s->mu);
	CUresult e = s->err;
	s->err = OK;
	pthread_mutex_unlock(&s->mu);
	return e;
}

CUresult cuStreamDestroy_v2(void *stream) {
	NEED_CTX();
	struct stream *s = stream;
	struct op *o = calloc(1, sizeof *o);
	o->kind = OP_STOP;
	enqueue(s, o);
	pthread_join(s->th, NULL);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s);
	pthread_mutex_lock(&mu);
	n_streams--;
	pthread_mutex_unlock(&mu);
	return OK;
}

CUresult cuEventCreate(void **out, unsigned flags) {
	(void)flags;
	NEED_CTX();
	struct event *e = calloc(1, sizeof *e);
	if (!e) return UNKNOWN;
	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->cv, NULL);
	pthread_mutex_lock(&mu);
	n_events++;
	pthread_mutex_unlock(&mu);
	*out = e;
	return OK;
}

CUresult cuEventRecord(void *event, void *stream) {
	NEED_CTX();
	struct event *e = event;
	pthread_mutex_lock(&e->mu);
	e->pending = 1;
	e->err = OK;
	pthread_mutex_unlock(&e->mu);
	struct op *o = calloc(1, sizeof *o);
	o->kind = OP_EVENT;
	o->ev = e;
	return enqueue(stream, o);
}

CUresult cuEventSynchronize(void *event) {
	NEED_CTX();
	struct event *e = event;
	pthread_mutex_lock(&e->mu);
	while (e->pending) pthread_cond_wait(&e->cv, &e->mu);
	CUresult r = e->err;
	pthread_mutex_unlock(&e->mu);
	return r;
}

CUresult cuEventDestroy_v2(void *event) {
	NEED_CTX();
	struct event *e = event;
	pthread_mutex_destroy(&e->mu);
	pthread_cond_destroy(&e->cv);
	free(e);
	pthread_mutex_lock(&mu);
	n_events--;
	pthread_mutex_unlock(&mu);
	return OK;
}

// --- copies ---------------------------------------------------------------

static CUresult copy_async(void *dst, const void *src, size_t n, void *stream) {
	struct op *o = calloc(1, sizeof *o);
	if (!o) return UNKNOWN;
	o->kind = OP_COPY;
	o->dst = dst;
	o->src = src;
	o->n = n;
	return enqueue(stream, o);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *stream) {
	NEED_CTX();
	if (take_fail(&fail_dtoh)) return UNKNOWN;
	if (!stream || !dst || !device_range((uintptr_t)src, n)) return INVALID_VALUE;
	return copy_async(dst, (const void *)(uintptr_t)src, n, stream);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *stream) {
	NEED_CTX();
	if (take_fail(&fail_htod)) return UNKNOWN;
	if (!stream || !src || !device_range((uintptr_t)dst, n)) return INVALID_VALUE;
	return copy_async((void *)(uintptr_t)dst, src, n, stream);
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
	NEED_CTX();
	if (!device_range((uintptr_t)src, n)) return INVALID_VALUE;
	memcpy(dst, (const void *)(uintptr_t)src, n);
	return OK;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
	NEED_CTX();
	if (!device_range((uintptr_t)dst, n)) return INVALID_VALUE;
	memcpy((void *)(uintptr_t)dst, src, n);
	return OK;
}

// --- device memory and IPC --------------------------------------------------

struct handle { char magic[8]; int32_t pid; int32_t fd; uint64_t size; char pad[40]; };
_Static_assert(sizeof(struct handle) == 64, "handle is 64 bytes");

CUresult cuMemAlloc_v2(CUdeviceptr *out, size_t size) {
	NEED_CTX();
	if (size == 0) return INVALID_VALUE;
	int fd = memfd_create("fakecuda-devmem", MFD_CLOEXEC);
	if (fd < 0) return UNKNOWN;
	if (ftruncate(fd, (off_t)size) < 0) { close(fd); return UNKNOWN; }
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) { close(fd); return UNKNOWN; }
	struct range *r = calloc(1, sizeof *r);
	r->base = (uintptr_t)p; r->size = size; r->fd = fd;
	pthread_mutex_lock(&mu);
	r->next = allocs; allocs = r;
	pthread_mutex_unlock(&mu);
	*out = (CUdeviceptr)(uintptr_t)p;
	return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	for (struct range **pp = &allocs; *pp; pp = &(*pp)->next) {
		struct range *r = *pp;
		if (r->base == (uintptr_t)p) {
			*pp = r->next;
			pthread_mutex_unlock(&mu);
			munmap((void *)r->base, r->size);
			close(r->fd);
			free(r);
			return OK;
		}
	}
	pthread_mutex_unlock(&mu);
	return INVALID_VALUE;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	for (int pass = 0; pass < 2; pass++)
		for (struct range *r = pass ? opened : allocs; r; r = r->next)
			if ((uintptr_t)p >= r->base && (uintptr_t)p < r->base + r->size) {
				if (base) *base = r->base;
				if (size) *size = r->size;
				pthread_mutex_unlock(&mu);
				return OK;
			}
	pthread_mutex_unlock(&mu);
	return INVALID_VALUE;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
	NEED_CTX();
	struct handle out;
	memset(&out, 0, sizeof out);
	pthread_mutex_lock(&mu);
	for (struct range *r = allocs; r; r = r->next) {
		if (r->base == (uintptr_t)p) {
			memcpy(out.magic, "FAKECUDA", 8);
			out.pid = getpid();
			out.fd = r->fd;
			out.size = r->size;
			pthread_mutex_unlock(&mu);
			memcpy(h, &out, sizeof out);
			return OK;
		}
	}
	pthread_mutex_unlock(&mu);
	return INVALID_VALUE;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *out, CUipcMemHandle h, unsigned flags) {
	(void)flags;
	NEED_CTX();
	if (take_fail(&fail_ipc)) return UNKNOWN;
	struct handle in;
	memcpy(&in, &h, sizeof in);
	if (memcmp(in.magic, "FAKECUDA", 8) || in.size == 0) return INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	for (struct range *r = opened; r; r = r->next)
		if (!memcmp(r->key, &in, sizeof in)) { pthread_mutex_unlock(&mu); return ALREADY_MAPPED; }
	pthread_mutex_unlock(&mu);
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fd/%d", in.pid, in.fd);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) return INVALID_HANDLE;
	struct stat st;
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != in.size) { close(fd); return INVALID_HANDLE; }
	void *p = mmap(NULL, in.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED) return INVALID_HANDLE;
	struct range *r = calloc(1, sizeof *r);
	r->base = (uintptr_t)p; r->size = in.size; r->fd = -1;
	memcpy(r->key, &in, sizeof in);
	pthread_mutex_lock(&mu);
	r->next = opened; opened = r;
	pthread_mutex_unlock(&mu);
	*out = (CUdeviceptr)(uintptr_t)p;
	return OK;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	for (struct range **pp = &opened; *pp; pp = &(*pp)->next) {
		struct range *r = *pp;
		if (r->base == (uintptr_t)p) {
			*pp = r->next;
			pthread_mutex_unlock(&mu);
			munmap((void *)r->base, r->size);
			free(r);
			return OK;
		}
	}
	pthread_mutex_unlock(&mu);
	return INVALID_VALUE;
}

// --- pinned host memory -----------------------------------------------------

CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags) {
	(void)flags;
	NEED_CTX();
	if (take_fail(&fail_hostreg) || getenv("FAKECUDA_FAIL_HOST_REGISTER")) return UNKNOWN;
	if (!p || size == 0) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	for (struct range *r = hostregs; r; r = r->next)
		if ((uintptr_t)p < r->base + r->size && r->base < (uintptr_t)p + size) {
			pthread_mutex_unlock(&mu);
			return HOST_MEMORY_ALREADY_REGISTERED;
		}
	struct range *r = calloc(1, sizeof *r);
	r->base = (uintptr_t)p; r->size = size; r->fd = -1;
	r->next = hostregs; hostregs = r;
	pthread_mutex_unlock(&mu);
	return OK;
}

CUresult cuMemHostUnregister(void *p) {
	NEED_CTX();
	pthread_mutex_lock(&mu);
	for (struct range **pp = &hostregs; *pp; pp = &(*pp)->next) {
		struct range *r = *pp;
		if (r->base == (uintptr_t)p) {
			*pp = r->next;
			pthread_mutex_unlock(&mu);
			free(r);
			return OK;
		}
	}
	pthread_mutex_unlock(&mu);
	return HOST_MEMORY_NOT_REGISTERED;
}
