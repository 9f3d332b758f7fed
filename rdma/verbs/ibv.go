//go:build verbs

package verbs

/*
#cgo LDFLAGS: -libverbs
#include <infiniband/verbs.h>
#include <errno.h>
#include <poll.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t byte_len;
	uint32_t qp_num;
	uint32_t vendor_err;
	uint32_t pad;
} tp_wc;

typedef struct {
	uint64_t wr_id;
	uint64_t laddr;
	uint64_t raddr;
	uint32_t len;
	uint32_t lkey;
	uint32_t rkey;
	uint32_t pad;
} tp_wr;

static struct ibv_device **tp_devices(int *n, int *err) {
	errno = 0;
	struct ibv_device **l = ibv_get_device_list(n);
	*err = errno;
	return l;
}

static struct ibv_device *tp_device_at(struct ibv_device **l, int i) { return l[i]; }

static int tp_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a) {
	return ibv_query_port(c, port, a);
}

static int tp_query_gid(struct ibv_context *c, uint8_t port, int idx, uint8_t *gid, uint32_t *type) {
	struct ibv_gid_entry e;
	int rc = ibv_query_gid_ex(c, port, idx, &e, 0);
	if (rc) return rc;
	memcpy(gid, e.gid.raw, 16);
	*type = e.gid_type;
	return 0;
}

static struct ibv_mr *tp_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int *err) {
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(pd, (void *)addr, len,
		IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
	*err = errno;
	return mr;
}

static struct ibv_cq *tp_create_cq(struct ibv_context *c, int n, struct ibv_comp_channel *ch, int *err) {
	errno = 0;
	struct ibv_cq *cq = ibv_create_cq(c, n, NULL, ch, 0);
	*err = errno;
	return cq;
}

static struct ibv_qp *tp_create_qp(struct ibv_pd *pd, struct ibv_cq *cq, int depth, int *err) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 0;
	a.cap.max_send_wr = depth;
	a.cap.max_recv_wr = 1;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	errno = 0;
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	*err = errno;
	return qp;
}

static int tp_qp_init(struct ibv_qp *qp, uint8_t port) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int tp_qp_rtr(struct ibv_qp *qp, uint8_t port, int mtu, uint32_t dqpn, uint32_t rpsn,
		const uint8_t *dgid, int sgid_index, uint16_t dlid, int rd_atomic) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = dqpn;
	a.rq_psn = rpsn;
	a.max_dest_rd_atomic = rd_atomic;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	memcpy(a.ah_attr.grh.dgid.raw, dgid, 16);
	a.ah_attr.grh.sgid_index = sgid_index;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.dlid = dlid;
	a.ah_attr.sl = 0;
	a.ah_attr.src_path_bits = 0;
	a.ah_attr.port_num = port;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int tp_qp_rts(struct ibv_qp *qp, uint32_t psn, int timeout, int retry, int rd_atomic) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = timeout;
	a.retry_cnt = retry;
	a.rnr_retry = 7;
	a.sq_psn = psn;
	a.max_rd_atomic = rd_atomic;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
		IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int tp_qp_err(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_ERR;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

// tp_post chains n signaled RDMA READs (write=0) or WRITEs into one
// ibv_post_send call.
static int tp_post(struct ibv_qp *qp, int write, tp_wr *w, int n) {
	struct ibv_send_wr wrs[64];
	struct ibv_sge sges[64];
	struct ibv_send_wr *bad = NULL;
	if (n <= 0 || n > 64) return EINVAL;
	memset(wrs, 0, sizeof(wrs[0]) * n);
	for (int i = 0; i < n; i++) {
		sges[i].addr = w[i].laddr;
		sges[i].length = w[i].len;
		sges[i].lkey = w[i].lkey;
		wrs[i].wr_id = w[i].wr_id;
		wrs[i].sg_list = &sges[i];
		wrs[i].num_sge = 1;
		wrs[i].opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
		wrs[i].send_flags = IBV_SEND_SIGNALED;
		wrs[i].wr.rdma.remote_addr = w[i].raddr;
		wrs[i].wr.rdma.rkey = w[i].rkey;
		wrs[i].next = i + 1 < n ? &wrs[i + 1] : NULL;
	}
	return ibv_post_send(qp, wrs, &bad);
}

static int tp_poll(struct ibv_cq *cq, tp_wc *out, int n) {
	struct ibv_wc wc[64];
	if (n > 64) n = 64;
	int got = ibv_poll_cq(cq, n, wc);
	for (int i = 0; i < got; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].byte_len = wc[i].byte_len;
		out[i].qp_num = wc[i].qp_num;
		out[i].vendor_err = wc[i].vendor_err;
	}
	return got;
}

static int tp_arm(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

// tp_wait blocks until a completion event on ch or wake becomes readable
// (ms < 0: no timeout); 1: an event was taken and acknowledged, 0: none
// (woken or timeout), <0: error.
static int tp_wait(struct ibv_comp_channel *ch, int wake, int ms) {
	struct pollfd p[2] = { { .fd = ch->fd, .events = POLLIN }, { .fd = wake, .events = POLLIN } };
	int rc = poll(p, 2, ms);
	if (rc <= 0) return rc < 0 && errno != EINTR ? -1 : 0;
	if (!(p[0].revents & POLLIN)) return 0;
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(ch, &cq, &ctx)) return errno == EAGAIN ? 0 : -1;
	ibv_ack_cq_events(cq, 1);
	return 1;
}

static int tp_nonblock(int fd) {
	int fl = fcntl(fd, F_GETFL);
	return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int tp_async_nonblock(struct ibv_context *c) { return tp_nonblock(c->async_fd); }

typedef struct {
	uint32_t type;
	uint32_t qp_num;
	uint32_t port;
} tp_async;

// tp_async_wait blocks until one asynchronous event of c (or wake
// readable, or ms when >= 0), copies
// what the transport needs out of it and acknowledges it at once (a QP
// cannot be destroyed while an event about it is unacknowledged). 1: an
// event, 0: none, <0: error.
static int tp_async_wait(struct ibv_context *c, int wake, int ms, tp_async *out) {
	struct pollfd p[2] = { { .fd = c->async_fd, .events = POLLIN }, { .fd = wake, .events = POLLIN } };
	int rc = poll(p, 2, ms);
	if (rc <= 0) return rc < 0 && errno != EINTR ? -1 : 0;
	if (!(p[0].revents & POLLIN)) return 0;
	struct ibv_async_event e;
	if (ibv_get_async_event(c, &e)) return errno == EAGAIN ? 0 : -1;
	out->type = e.event_type;
	out->qp_num = 0;
	out->port = 0;
	switch (e.event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->qp_num = e.element.qp->qp_num;
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_GID_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
		out->port = e.element.port_num;
		break;
	default:
		break;
	}
	ibv_ack_async_event(&e);
	return 1;
}

static int tp_fork_init(void) { return ibv_fork_init(); }
static int tp_fork_status(void) { return ibv_is_fork_initialized(); }
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// Work completion statuses the transport tells apart (enum ibv_wc_status).
const (
	wcSuccess      = C.IBV_WC_SUCCESS
	wcLocLenErr    = C.IBV_WC_LOC_LEN_ERR
	wcLocProtErr   = C.IBV_WC_LOC_PROT_ERR
	wcFlushErr     = C.IBV_WC_WR_FLUSH_ERR
	wcRemInvReqErr = C.IBV_WC_REM_INV_REQ_ERR
	wcRemAccessErr = C.IBV_WC_REM_ACCESS_ERR
	wcRemOpErr     = C.IBV_WC_REM_OP_ERR
	wcRetryExcErr  = C.IBV_WC_RETRY_EXC_ERR
	wcRnrRetryErr  = C.IBV_WC_RNR_RETRY_EXC_ERR
)

func wcStatusString(s uint32) string {
	return C.GoString(C.ibv_wc_status_str(C.enum_ibv_wc_status(s)))
}

// Asynchronous events (enum ibv_event_type) by the name the metrics use.
var asyncNames = map[uint32]string{
	C.IBV_EVENT_CQ_ERR: "cq_err", C.IBV_EVENT_QP_FATAL: "qp_fatal", C.IBV_EVENT_QP_REQ_ERR: "qp_req_err",
	C.IBV_EVENT_QP_ACCESS_ERR: "qp_access_err", C.IBV_EVENT_COMM_EST: "comm_est", C.IBV_EVENT_SQ_DRAINED: "sq_drained",
	C.IBV_EVENT_PATH_MIG: "path_mig", C.IBV_EVENT_PATH_MIG_ERR: "path_mig_err", C.IBV_EVENT_DEVICE_FATAL: "device_fatal",
	C.IBV_EVENT_PORT_ACTIVE: "port_active", C.IBV_EVENT_PORT_ERR: "port_err", C.IBV_EVENT_LID_CHANGE: "lid_change",
	C.IBV_EVENT_PKEY_CHANGE: "pkey_change", C.IBV_EVENT_SM_CHANGE: "sm_change", C.IBV_EVENT_SRQ_ERR: "srq_err",
	C.IBV_EVENT_SRQ_LIMIT_REACHED: "srq_limit", C.IBV_EVENT_QP_LAST_WQE_REACHED: "qp_last_wqe",
	C.IBV_EVENT_CLIENT_REREGISTER: "client_reregister", C.IBV_EVENT_GID_CHANGE: "gid_change", C.IBV_EVENT_WQ_FATAL: "wq_fatal",
}

// asyncEvent is one asynchronous event of a device.
type asyncEvent struct {
	name string
	qpn  uint32 // QP events
	port int    // port events
}

// asyncWait blocks until the device's next asynchronous event, which is
// acknowledged before it returns, or until wake is readable (false).
func (c *device) asyncWait(wake int) (asyncEvent, bool, error) {
	var e C.tp_async
	switch rc := C.tp_async_wait(c.ctx, C.int(wake), -1, &e); {
	case rc < 0:
		return asyncEvent{}, false, errors.New("verbs: ibv_get_async_event failed")
	case rc == 0:
		return asyncEvent{}, false, nil
	}
	name, ok := asyncNames[uint32(e._type)]
	if !ok {
		name = "other"
	}
	return asyncEvent{name: name, qpn: uint32(e.qp_num), port: int(e.port)}, true, nil
}

// Fork safety: ibv_fork_init runs once, before the first other libibverbs
// call (so before any registration). With a kernel that copies pinned
// pages on fork (>= 5.13) it does nothing ("unneeded"); on older ones it
// makes every registered range MADV_DONTFORK, so that a child made by
// fork() (not Go's os/exec, which uses vfork-style clone and exec) does
// not break the parent's registrations; the child has no access to
// those ranges.
var (
	forkOnce sync.Once
	forkErr  error
)

func forkInit() error {
	forkOnce.Do(func() {
		if rc := C.tp_fork_init(); rc != 0 {
			forkErr = fmt.Errorf("verbs: ibv_fork_init: %v", syscall.Errno(rc))
		}
	})
	return forkErr
}

// ForkSafety reports what ibv_fork_init did: "enabled" (registered ranges
// are not inherited by fork), "unneeded" (the kernel copies pinned pages
// on fork), or "disabled" (ibv_fork_init failed or was not called yet).
func ForkSafety() string {
	switch C.tp_fork_status() {
	case C.IBV_FORK_ENABLED:
		return "enabled"
	case C.IBV_FORK_UNNEEDED:
		return "unneeded"
	default:
		return "disabled"
	}
}

// maxPost is how many work requests one tp_post call chains.
const maxPost = 64

// listDevices returns the names of the RDMA devices libibverbs sees. No
// devices, or ENOSYS (no kernel support), is ErrNoDevice.
func listDevices() ([]string, error) {
	_ = forkInit() // reported by NewTransport
	var n, e C.int
	l := C.tp_devices(&n, &e)
	if l == nil {
		if syscall.Errno(e) == syscall.ENOSYS || e == 0 {
			return nil, ErrNoDevice
		}
		return nil, fmt.Errorf("%w: ibv_get_device_list: %v", ErrNoDevice, syscall.Errno(e))
	}
	defer C.ibv_free_device_list(l)
	var names []string
	for i := 0; i < int(n); i++ {
		names = append(names, C.GoString(C.ibv_get_device_name(C.tp_device_at(l, C.int(i)))))
	}
	if len(names) == 0 {
		return nil, ErrNoDevice
	}
	return names, nil
}

// device is an opened device: its protection domain, the completion queue
// of the initiator queue pairs (with its event channel) and the small one
// the responder queue pairs must name but never fill.
type device struct {
	mu      sync.RWMutex // guards info (re-queried after port and GID events)
	info    DeviceInfo
	gidWant int // Config.GIDIndex
	ctx     *C.struct_ibv_context
	pd      *C.struct_ibv_pd
	ch      *C.struct_ibv_comp_channel
	cq      *C.struct_ibv_cq
	rcq     *C.struct_ibv_cq
}

func errnoErr(what string, rc C.int) error {
	if rc == 0 {
		return nil
	}
	return fmt.Errorf("verbs: %s: %v", what, syscall.Errno(rc))
}

// openDevice opens name, queries port, picks the GID and allocates the
// protection domain and completion queues.
func openDevice(name string, port int, gidIndex int, cqSize int) (*device, error) {
	_ = forkInit()
	var n, e C.int
	l := C.tp_devices(&n, &e)
	if l == nil {
		return nil, ErrNoDevice
	}
	defer C.ibv_free_device_list(l)
	var dev *C.struct_ibv_device
	for i := 0; i < int(n); i++ {
		d := C.tp_device_at(l, C.int(i))
		if C.GoString(C.ibv_get_device_name(d)) == name {
			dev = d
		}
	}
	if dev == nil {
		return nil, fmt.Errorf("%w: device %q not found", ErrNoDevice, name)
	}
	c := &device{}
	c.ctx = C.ibv_open_device(dev)
	if c.ctx == nil {
		return nil, fmt.Errorf("%w: ibv_open_device %s failed", ErrNoDevice, name)
	}
	info, err := c.query(name, port, gidIndex)
	if err != nil {
		c.close()
		return nil, err
	}
	c.info = info
	c.gidWant = gidIndex
	if c.pd = C.ibv_alloc_pd(c.ctx); c.pd == nil {
		c.close()
		return nil, fmt.Errorf("verbs: %s: ibv_alloc_pd failed", name)
	}
	if c.ch = C.ibv_create_comp_channel(c.ctx); c.ch == nil {
		c.close()
		return nil, fmt.Errorf("verbs: %s: ibv_create_comp_channel failed", name)
	}
	if C.tp_nonblock(c.ch.fd) != 0 || C.tp_async_nonblock(c.ctx) != 0 {
		c.close()
		return nil, fmt.Errorf("verbs: %s: O_NONBLOCK failed", name)
	}
	if c.cq = C.tp_create_cq(c.ctx, C.int(cqSize), c.ch, &e); c.cq == nil {
		c.close()
		return nil, fmt.Errorf("verbs: %s: ibv_create_cq(%d): %v", name, cqSize, syscall.Errno(e))
	}
	if c.rcq = C.tp_create_cq(c.ctx, 16, nil, &e); c.rcq == nil {
		c.close()
		return nil, fmt.Errorf("verbs: %s: ibv_create_cq(responder): %v", name, syscall.Errno(e))
	}
	if rc := C.tp_arm(c.cq); rc != 0 {
		c.close()
		return nil, errnoErr("ibv_req_notify_cq", rc)
	}
	return c, nil
}

// cur returns what is known about the device's port now.
func (c *device) cur() DeviceInfo {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.info
}

// refresh queries the port again (state, MTU, GID table) after a port or
// GID event; it reports whether the port is active.
func (c *device) refresh() (DeviceInfo, error) {
	info, err := c.query(c.cur().Name, c.cur().Port, c.gidWant)
	if err != nil {
		return info, err
	}
	c.mu.Lock()
	c.info = info
	c.mu.Unlock()
	return info, nil
}

// query fills the device's port attributes and chooses the GID: gidIndex
// when >= 0, else the first RoCE v2 GID holding an IPv4-mapped address,
// else the first RoCE v2 GID, else index 0 (InfiniBand, or RoCE v1).
func (c *device) query(name string, port, gidIndex int) (DeviceInfo, error) {
	var pa C.struct_ibv_port_attr
	if rc := C.tp_query_port(c.ctx, C.uint8_t(port), &pa); rc != 0 {
		return DeviceInfo{}, errnoErr("ibv_query_port "+name, rc)
	}
	info := DeviceInfo{
		Name: name, Port: port, State: portState(int(pa.state)), Active: pa.state == C.IBV_PORT_ACTIVE,
		ActiveMTU: mtuBytes(int(pa.active_mtu)), MaxMTU: mtuBytes(int(pa.max_mtu)), mtuEnum: int(pa.active_mtu),
		LID: uint16(pa.lid), GIDIndex: -1, NUMANode: numaNode(name),
	}
	switch pa.link_layer {
	case C.IBV_LINK_LAYER_ETHERNET:
		info.LinkLayer = "Ethernet"
	case C.IBV_LINK_LAYER_INFINIBAND, C.IBV_LINK_LAYER_UNSPECIFIED:
		info.LinkLayer = "InfiniBand"
	}
	var gid [16]byte
	var typ C.uint32_t
	var firstV2 = -1
	for i := 0; i < int(pa.gid_tbl_len); i++ {
		if C.tp_query_gid(c.ctx, C.uint8_t(port), C.int(i), (*C.uint8_t)(unsafe.Pointer(&gid[0])), &typ) != 0 {
			continue
		}
		g := GIDEntry{Index: i, GID: gid}
		switch typ {
		case C.IBV_GID_TYPE_ROCE_V2:
			g.Type = "RoCE v2"
		case C.IBV_GID_TYPE_ROCE_V1:
			g.Type = "RoCE v1"
		default:
			g.Type = "IB"
		}
		info.GIDs = append(info.GIDs, g)
		if g.Type == "RoCE v2" && firstV2 < 0 {
			firstV2 = i
		}
		if g.Type == "RoCE v2" && info.GIDIndex < 0 && g.ipv4Mapped() {
			info.GIDIndex = i
		}
	}
	switch {
	case gidIndex >= 0:
		info.GIDIndex = -1
		for _, g := range info.GIDs {
			if g.Index == gidIndex {
				info.GIDIndex = gidIndex
			}
		}
		if info.GIDIndex < 0 {
			return info, fmt.Errorf("%w: %s port %d has no GID index %d", ErrNoDevice, name, port, gidIndex)
		}
	case info.GIDIndex >= 0:
	case firstV2 >= 0:
		info.GIDIndex = firstV2
	case len(info.GIDs) > 0 && info.LinkLayer == "InfiniBand":
		info.GIDIndex = info.GIDs[0].Index
	default:
		return info, fmt.Errorf("%w: %s port %d has no usable GID", ErrNoDevice, name, port)
	}
	for _, g := range info.GIDs {
		if g.Index == info.GIDIndex {
			info.GID = g.GID
		}
	}
	return info, nil
}

func (c *device) close() {
	if c.rcq != nil {
		C.ibv_destroy_cq(c.rcq)
	}
	if c.cq != nil {
		C.ibv_destroy_cq(c.cq)
	}
	if c.ch != nil {
		C.ibv_destroy_comp_channel(c.ch)
	}
	if c.pd != nil {
		C.ibv_dealloc_pd(c.pd)
	}
	if c.ctx != nil {
		C.ibv_close_device(c.ctx)
	}
	*c = device{}
}

func numaNode(dev string) int {
	b, err := os.ReadFile(filepath.Join("/sys/class/infiniband", dev, "device/numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}

func portState(s int) string {
	return C.GoString(C.ibv_port_state_str(C.enum_ibv_port_state(s)))
}

// mtuBytes maps enum ibv_mtu (1..5) to bytes.
func mtuBytes(m int) int {
	if m < 1 || m > 5 {
		return 0
	}
	return 128 << m
}

// mr is a registered memory region.
type mr struct {
	p    *C.struct_ibv_mr
	lkey uint32
	rkey uint32
	addr uint64
	size uint64
}

func (c *device) regMR(buf []byte) (*mr, error) {
	if len(buf) == 0 {
		return &mr{}, nil
	}
	addr := uintptr(unsafe.Pointer(&buf[0]))
	var e C.int
	p := C.tp_reg_mr(c.pd, C.uintptr_t(addr), C.size_t(len(buf)), &e)
	if p == nil {
		return nil, fmt.Errorf("verbs: ibv_reg_mr(%d bytes): %v", len(buf), syscall.Errno(e))
	}
	return &mr{p: p, lkey: uint32(p.lkey), rkey: uint32(p.rkey), addr: uint64(addr)}, nil
}

func (m *mr) dereg() error {
	if m.p == nil {
		return nil
	}
	rc := C.ibv_dereg_mr(m.p)
	m.p = nil
	return errnoErr("ibv_dereg_mr", rc)
}

// qp is one RC queue pair.
type qp struct {
	p   *C.struct_ibv_qp
	num uint32
	psn uint32
}

// connData is what one side tells the other to connect a queue pair.
type connData struct {
	GID [16]byte
	QPN uint32
	PSN uint32
	MTU uint8 // enum ibv_mtu
	LID uint16
}

var errQP = errors.New("verbs: queue pair")

func (c *device) createQP(responder bool, depth int, psn uint32) (*qp, error) {
	cq := c.cq
	if responder {
		cq = c.rcq
	}
	var e C.int
	p := C.tp_create_qp(c.pd, cq, C.int(depth), &e)
	if p == nil {
		return nil, fmt.Errorf("%w: ibv_create_qp: %v", errQP, syscall.Errno(e))
	}
	q := &qp{p: p, num: uint32(p.qp_num), psn: psn & 0xffffff}
	if rc := C.tp_qp_init(p, C.uint8_t(c.cur().Port)); rc != 0 {
		q.destroy()
		return nil, fmt.Errorf("%w: RESET->INIT: %v", errQP, syscall.Errno(rc))
	}
	return q, nil
}

// connect brings q from INIT through RTR to RTS towards remote.
func (c *device) connect(q *qp, remote connData, timeout, retry, rdAtomic int) error {
	info := c.cur()
	mtu := info.mtuEnum
	if int(remote.MTU) < mtu {
		mtu = int(remote.MTU)
	}
	if rc := C.tp_qp_rtr(q.p, C.uint8_t(info.Port), C.int(mtu), C.uint32_t(remote.QPN), C.uint32_t(remote.PSN),
		(*C.uint8_t)(unsafe.Pointer(&remote.GID[0])), C.int(info.GIDIndex), C.uint16_t(remote.LID), C.int(rdAtomic)); rc != 0 {
		return fmt.Errorf("%w: INIT->RTR (remote qpn %d mtu %d): %v", errQP, remote.QPN, mtu, syscall.Errno(rc))
	}
	if rc := C.tp_qp_rts(q.p, C.uint32_t(q.psn), C.int(timeout), C.int(retry), C.int(rdAtomic)); rc != 0 {
		return fmt.Errorf("%w: RTR->RTS: %v", errQP, syscall.Errno(rc))
	}
	return nil
}

func (c *device) local(q *qp) connData {
	info := c.cur()
	return connData{GID: info.GID, QPN: q.num, PSN: q.psn, MTU: uint8(info.mtuEnum), LID: info.LID}
}

// toError moves q to the error state: posted work requests are flushed
// (each completes with IBV_WC_WR_FLUSH_ERR).
func (q *qp) toError() error { return errnoErr("modify_qp(ERR)", C.tp_qp_err(q.p)) }

func (q *qp) destroy() {
	if q.p != nil {
		C.ibv_destroy_qp(q.p)
		q.p = nil
	}
}

// wr is one work request of a post batch.
type wr = C.tp_wr

func mkWR(id, laddr, raddr uint64, n, lkey, rkey uint32) wr {
	return wr{wr_id: C.uint64_t(id), laddr: C.uint64_t(laddr), raddr: C.uint64_t(raddr),
		len: C.uint32_t(n), lkey: C.uint32_t(lkey), rkey: C.uint32_t(rkey)}
}

// post chains ws (at most maxPost) into one ibv_post_send.
func (q *qp) post(write bool, ws []wr) error {
	w := C.int(0)
	if write {
		w = 1
	}
	if rc := C.tp_post(q.p, w, &ws[0], C.int(len(ws))); rc != 0 {
		return fmt.Errorf("%w: ibv_post_send: %v", errQP, syscall.Errno(rc))
	}
	return nil
}

// wc is one work completion.
type wc = C.tp_wc

// poll takes up to len(out) completions off the initiator CQ.
func (c *device) poll(out []wc) (int, error) {
	n := C.tp_poll(c.cq, &out[0], C.int(len(out)))
	if n < 0 {
		return 0, errors.New("verbs: ibv_poll_cq failed")
	}
	return int(n), nil
}

// arm requests an event for the next completion.
func (c *device) arm() error { return errnoErr("ibv_req_notify_cq", C.tp_arm(c.cq)) }

// wait blocks until a completion event, or until wake is readable (false).
func (c *device) wait(wake int) (bool, error) {
	rc := C.tp_wait(c.ch, C.int(wake), -1)
	if rc < 0 {
		return false, errors.New("verbs: waiting for a completion event failed")
	}
	return rc == 1, nil
}
