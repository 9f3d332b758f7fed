package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tidepool-kv/tidepool/internal/poll"
)

// fakeCalls is a hand-written stand-in for the server behind a combiner:
// each call reports its items on entered and waits for an answer on
// answers.
type fakeCalls struct {
	entered chan []int
	answers chan fakeAnswer
	mu      sync.Mutex
	dropped []int
	undone  []int
}

type fakeAnswer struct {
	res []int
	err error
}

func newFakeCombiner(max int) (*combiner[int, int], *fakeCalls) {
	return newFakeCombinerWidth(max, 1)
}

func newFakeCombinerWidth(max, width int) (*combiner[int, int], *fakeCalls) {
	f := &fakeCalls{entered: make(chan []int), answers: make(chan fakeAnswer)}
	cb := &combiner[int, int]{
		name:  "Fake",
		width: width,
		call: func(ctx context.Context, _ flightKey, reqs []int) ([]int, error) {
			f.entered <- slices.Clone(reqs)
			a := <-f.answers
			return a.res, a.err
		},
		drop: func(reqs []int) { f.mu.Lock(); f.dropped = append(f.dropped, reqs...); f.mu.Unlock() },
		undo: func(res []int) { f.mu.Lock(); f.undone = append(f.undone, res...); f.mu.Unlock() },
		max:  func() int { return max },
	}
	return cb, f
}

// echo answers each item with itself times ten.
func echo(reqs []int) fakeAnswer {
	out := make([]int, len(reqs))
	for i, r := range reqs {
		out[i] = 10 * r
	}
	return fakeAnswer{res: out}
}

type result struct {
	res int
	err error
}

// TestCombiner: a call in flight makes later items queue; they go out
// together (in batches of at most max) when it returns, and each waiter
// gets its own answer or the call's error.
func TestCombiner(t *testing.T) {
	errBoom := &Error{Code: CodeUnavailable, Message: "boom"}
	for _, tc := range []struct {
		name    string
		max     int
		queued  int
		answer  func([]int) fakeAnswer // of the batched calls
		batches [][]int
		want    func(item int) result
	}{
		{
			name: "per-item answers", max: 100, queued: 5, answer: echo,
			batches: [][]int{{1, 2, 3, 4, 5}},
			want:    func(i int) result { return result{res: 10 * i} },
		},
		{
			name: "split at max batch", max: 2, queued: 5, answer: echo,
			batches: [][]int{{1, 2}, {3, 4}, {5}},
			want:    func(i int) result { return result{res: 10 * i} },
		},
		{
			name: "call error reaches every waiter", max: 100, queued: 4,
			answer:  func([]int) fakeAnswer { return fakeAnswer{err: errBoom} },
			batches: [][]int{{1, 2, 3, 4}},
			want:    func(int) result { return result{err: errBoom} },
		},
		{
			name: "malformed answer", max: 100, queued: 3,
			answer:  func([]int) fakeAnswer { return fakeAnswer{res: []int{1}} },
			batches: [][]int{{1, 2, 3}},
			want: func(int) result {
				return result{err: &Error{Code: CodeInternal, Message: "zero-copy: malformed Fake answer"}}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cb, f := newFakeCombiner(tc.max)
			ctx := context.Background()
			k := flightKey{ns: "ns"}
			lead := make(chan result, 1)
			go func() {
				r, err := cb.do(ctx, k, 0)
				lead <- result{r, err}
			}()
			if got := <-f.entered; !slices.Equal(got, []int{0}) {
				t.Fatalf("first call: %v", got)
			}
			// Queue the items in order while the first call is in flight.
			results := make([]chan result, tc.queued+1)
			for i := 1; i <= tc.queued; i++ {
				results[i] = make(chan result, 1)
				go func() {
					r, err := cb.do(ctx, k, i)
					results[i] <- result{r, err}
				}()
				poll.Until(t, 10*time.Second, "queued items", func() bool { return cb.queued() == i })
			}
			f.answers <- echo([]int{0})
			if r := <-lead; r.err != nil || r.res != 0 {
				t.Fatalf("first call's answer: %+v", r)
			}
			for _, want := range tc.batches {
				got := <-f.entered
				if !slices.Equal(got, want) {
					t.Fatalf("batch %v, want %v", got, want)
				}
				f.answers <- tc.answer(got)
			}
			for i := 1; i <= tc.queued; i++ {
				got, want := <-results[i], tc.want(i)
				if got.res != want.res || fmt.Sprint(got.err) != fmt.Sprint(want.err) {
					t.Errorf("item %d: %+v, want %+v", i, got, want)
				}
			}
			st := cb.stats()
			if want := (CallStats{Calls: int64(1 + len(tc.batches)), Items: int64(1 + tc.queued), Waited: int64(tc.queued)}); st != want {
				t.Errorf("stats %+v, want %+v", st, want)
			}
			cb.mu.Lock()
			defer cb.mu.Unlock()
			if len(cb.groups) != 0 {
				t.Errorf("groups left: %v", cb.groups)
			}
		})
	}
}

// TestCombinerAbandon: a waiter whose context ends returns at once; its
// item is dropped if it was not sent, its answer undone if it was; the
// others get theirs.
func TestCombinerAbandon(t *testing.T) {
	cb, f := newFakeCombiner(100)
	k := flightKey{ns: "ns"}
	go cb.do(context.Background(), k, 0)
	<-f.entered
	ctxs := map[int]context.CancelFunc{}
	results := map[int]chan result{}
	for i := 1; i <= 4; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		ctxs[i] = cancel
		results[i] = make(chan result, 1)
		go func() {
			r, err := cb.do(ctx, k, i)
			results[i] <- result{r, err}
		}()
		poll.Until(t, 10*time.Second, "queued items", func() bool { return cb.queued() == i })
	}
	// 2 leaves while queued: never sent.
	ctxs[2]()
	if r := <-results[2]; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled while queued: %+v", r)
	}
	f.answers <- echo([]int{0})
	got := <-f.entered
	if !slices.Equal(got, []int{1, 3, 4}) {
		t.Fatalf("batch %v, want [1 3 4]", got)
	}
	// 3 leaves while its item is in flight: its answer is undone.
	ctxs[3]()
	if r := <-results[3]; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled in flight: %+v", r)
	}
	f.answers <- echo(got)
	for _, i := range []int{1, 4} {
		if r := <-results[i]; r.err != nil || r.res != 10*i {
			t.Errorf("item %d: %+v", i, r)
		}
	}
	poll.Until(t, 10*time.Second, "the combiner to go idle", func() bool {
		cb.mu.Lock()
		defer cb.mu.Unlock()
		return len(cb.groups) == 0
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(f.dropped, []int{2}) || !slices.Equal(f.undone, []int{30}) {
		t.Errorf("dropped %v undone %v, want [2] [30]", f.dropped, f.undone)
	}
	if st := cb.stats(); st.Dropped != 2 || st.Calls != 2 || st.Items != 4 {
		t.Errorf("stats %+v", st)
	}
	for _, cancel := range ctxs {
		cancel()
	}
}

// TestCombinerGroups: calls of different groups do not wait for each
// other; a lone caller never waits.
func TestCombinerGroups(t *testing.T) {
	cb, f := newFakeCombiner(100)
	done := make(chan result, 3)
	for _, k := range []flightKey{{ns: "a"}, {ns: "b"}, {ns: "a", d: time.Second}} {
		go func() {
			r, err := cb.do(context.Background(), k, 1)
			done <- result{r, err}
		}()
	}
	for i := 0; i < 3; i++ {
		if got := <-f.entered; !slices.Equal(got, []int{1}) {
			t.Fatalf("call %v", got)
		}
	}
	if n := cb.queued(); n != 0 {
		t.Fatalf("%d queued across groups", n)
	}
	for i := 0; i < 3; i++ {
		f.answers <- echo([]int{1})
	}
	for i := 0; i < 3; i++ {
		if r := <-done; r.err != nil || r.res != 10 {
			t.Fatalf("answer %+v", r)
		}
	}
}

// TestCombinerWidth: up to width calls of a group go out at once; the next
// item queues.
func TestCombinerWidth(t *testing.T) {
	cb, f := newFakeCombinerWidth(100, 2)
	k := flightKey{ns: "ns"}
	done := make(chan result, 3)
	for i := 1; i <= 2; i++ {
		go func() {
			r, err := cb.do(context.Background(), k, i)
			done <- result{r, err}
		}()
		<-f.entered
	}
	go func() {
		r, err := cb.do(context.Background(), k, 3)
		done <- result{r, err}
	}()
	poll.Until(t, 10*time.Second, "the third item queued", func() bool { return cb.queued() == 1 })
	f.answers <- echo([]int{1})
	if got := <-f.entered; !slices.Equal(got, []int{3}) {
		t.Fatalf("batch %v", got)
	}
	f.answers <- echo([]int{3})
	f.answers <- echo([]int{2})
	sum := 0
	for i := 0; i < 3; i++ {
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		sum += r.res
	}
	if sum != 60 {
		t.Errorf("answers sum to %d, want 60", sum)
	}
}
