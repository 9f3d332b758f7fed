// Package trace reads request traces in the Mooncake FAST'25 format: one JSON
// object per line,
//
//	{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47]}
//
// where timestamp is the arrival time in milliseconds relative to the first
// request, input_length and output_length are token counts, and hash_ids holds
// one remapped prefix-block hash per BlockTokens tokens of the input. Equal ids
// at the same position mean a reusable prefix block.
package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// BlockTokens is the number of input tokens per hash id in the Mooncake
// traces.
const BlockTokens = 512

// MaxLineBytes bounds one line of a trace file (1 MiB is about 100k block
// ids); a longer line is reported as an error instead of being buffered.
const MaxLineBytes = 1 << 20

// ErrSyntax is wrapped by every error about a malformed line.
var ErrSyntax = errors.New("trace: malformed line")

// Request is one request of a trace.
type Request struct {
	// Timestamp is the arrival time in milliseconds after the first request.
	Timestamp int64
	// InputLength is the prompt length in tokens.
	InputLength int
	// OutputLength is the generated length in tokens.
	OutputLength int
	// HashIDs holds one prefix-block id per BlockTokens tokens of the input,
	// in prefix order.
	HashIDs []uint64
}

// LineError reports a malformed line; it wraps ErrSyntax and the cause.
type LineError struct {
	// Line is the 1-based line number in the input.
	Line int
	// Err is the cause.
	Err error
}

func (e *LineError) Error() string { return fmt.Sprintf("trace: line %d: %v", e.Line, e.Err) }

// Unwrap returns ErrSyntax and the cause, so errors.Is works for both.
func (e *LineError) Unwrap() []error { return []error{ErrSyntax, e.Err} }

// wireRequest mirrors the JSON; pointers tell a missing field from a zero.
type wireRequest struct {
	Timestamp    *int64    `json:"timestamp"`
	InputLength  *int      `json:"input_length"`
	OutputLength *int      `json:"output_length"`
	HashIDs      *[]uint64 `json:"hash_ids"`
}

// DecodeLine decodes one line (without its newline). Every field must be
// present; numbers must be non-negative integers. Unknown fields are ignored
// so that traces with extra columns still load.
func DecodeLine(line []byte) (Request, error) {
	var w wireRequest
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&w); err != nil {
		return Request{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return Request{}, errors.New("trailing data after the JSON object")
	}
	var missing []string
	if w.Timestamp == nil {
		missing = append(missing, "timestamp")
	}
	if w.InputLength == nil {
		missing = append(missing, "input_length")
	}
	if w.OutputLength == nil {
		missing = append(missing, "output_length")
	}
	if w.HashIDs == nil {
		missing = append(missing, "hash_ids")
	}
	if len(missing) > 0 {
		return Request{}, fmt.Errorf("missing field(s) %q", missing)
	}
	switch {
	case *w.Timestamp < 0:
		return Request{}, fmt.Errorf("negative timestamp %d", *w.Timestamp)
	case *w.InputLength < 0:
		return Request{}, fmt.Errorf("negative input_length %d", *w.InputLength)
	case *w.OutputLength < 0:
		return Request{}, fmt.Errorf("negative output_length %d", *w.OutputLength)
	}
	return Request{
		Timestamp:    *w.Timestamp,
		InputLength:  *w.InputLength,
		OutputLength: *w.OutputLength,
		HashIDs:      *w.HashIDs,
	}, nil
}

// Reader streams requests from a trace, one line at a time. Blank lines are
// skipped.
type Reader struct {
	sc   *bufio.Scanner
	line int
	err  error
}

// NewReader returns a Reader over r.
func NewReader(r io.Reader) *Reader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLineBytes)
	return &Reader{sc: sc}
}

// Next returns the next request. At the end of the input it returns io.EOF;
// a malformed line returns a *LineError naming the line. After an error
// every later call returns the same error.
func (r *Reader) Next() (Request, error) {
	if r.err != nil {
		return Request{}, r.err
	}
	for r.sc.Scan() {
		r.line++
		b := bytes.TrimSpace(r.sc.Bytes())
		if len(b) == 0 {
			continue
		}
		req, err := DecodeLine(b)
		if err != nil {
			r.err = &LineError{Line: r.line, Err: err}
			return Request{}, r.err
		}
		return req, nil
	}
	if err := r.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			r.err = &LineError{Line: r.line + 1, Err: fmt.Errorf("line longer than %d bytes", MaxLineBytes)}
		} else {
			r.err = fmt.Errorf("trace: read after line %d: %w", r.line, err)
		}
		return Request{}, r.err
	}
	r.err = io.EOF
	return Request{}, r.err
}

// Line returns the number of the last line read (1-based).
func (r *Reader) Line() int { return r.line }

// Read reads a whole trace.
func Read(r io.Reader) ([]Request, error) {
	tr := NewReader(r)
	var out []Request
	for {
		req, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, req)
	}
}
