package fdlimit

import (
	"os"
	"syscall"
	"testing"
)

func TestGuardCeiling(t *testing.T) {
	for _, tc := range []struct {
		limit, reserve, fd int
		admit              bool
		wantReserve        int
	}{
		{1024, 100, 923, true, 100},
		{1024, 100, 924, false, 100},
		{1024, 1000, 767, true, 256}, // at most a quarter of the limit
		{1024, 1000, 768, false, 256},
		{64, 0, 63, true, 0}, // no reserve: everything below the limit
	} {
		g := NewFor(tc.limit, tc.reserve)
		if got := g.Admit(tc.fd); got != tc.admit {
			t.Errorf("limit %d reserve %d: Admit(%d) = %v", tc.limit, tc.reserve, tc.fd, got)
		}
		st := g.Stats()
		if st.Reserve != tc.wantReserve || st.Limit != tc.limit || st.Refused != uint64(map[bool]int{true: 0, false: 1}[tc.admit]) {
			t.Errorf("limit %d reserve %d: stats %+v", tc.limit, tc.reserve, st)
		}
	}
	var none *Guard
	if !none.Admit(1<<20) || none.Stats() != (Stats{}) {
		t.Fatal("a nil Guard refuses")
	}
}

// TestRaise: the soft limit becomes the hard one.
func TestRaise(t *testing.T) {
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old)
	low := old
	low.Cur = min(old.Max, 128)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	soft, hard, err := Raise()
	if err != nil || soft != hard || hard != old.Max {
		t.Fatalf("Raise: %d, %d, %v (hard limit %d)", soft, hard, err, old.Max)
	}
	g, err := New(16)
	if err != nil || g.Stats().Limit != int(min(hard, 1<<30)) {
		t.Fatalf("New: %+v, %v", g.Stats(), err)
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !g.Admit(int(f.Fd())) {
		t.Fatal("a low descriptor refused")
	}
}
