package trace

import (
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []Request
		errLine int    // 0: no error expected
		errSub  string // substring of the error message
	}{
		{
			name: "empty",
			in:   "",
		},
		{
			name: "two lines",
			in: `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}
{"timestamp": 27482, "input_length": 10, "output_length": 0, "hash_ids": [0]}
`,
			want: []Request{
				{Timestamp: 0, InputLength: 600, OutputLength: 5, HashIDs: []uint64{0, 1}},
				{Timestamp: 27482, InputLength: 10, OutputLength: 0, HashIDs: []uint64{0}},
			},
		},
		{
			name: "blank lines, CRLF, no final newline, extra field",
			in:   "\n{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [], \"x\": 1}\r\n\n   \n{\"timestamp\": 2, \"input_length\": 2, \"output_length\": 2, \"hash_ids\": [7]}",
			want: []Request{
				{Timestamp: 1, InputLength: 1, OutputLength: 1, HashIDs: []uint64{}},
				{Timestamp: 2, InputLength: 2, OutputLength: 2, HashIDs: []uint64{7}},
			},
		},
		{
			name:    "not json on line 2",
			in:      "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}\nhello\n",
			errLine: 2,
			errSub:  "trace: line 2: invalid character",
		},
		{
			name:    "missing fields",
			in:      `{"timestamp": 0}`,
			errLine: 1,
			errSub:  `missing field(s) ["input_length" "output_length" "hash_ids"]`,
		},
		{
			name:    "null hash ids",
			in:      `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": null}`,
			errLine: 1,
			errSub:  "hash_ids",
		},
		{
			name:    "negative length",
			in:      `{"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": []}`,
			errLine: 1,
			errSub:  "negative input_length -1",
		},
		{
			name:    "negative timestamp",
			in:      `{"timestamp": -5, "input_length": 1, "output_length": 1, "hash_ids": []}`,
			errLine: 1,
			errSub:  "negative timestamp",
		},
		{
			name:    "negative hash id",
			in:      `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [-1]}`,
			errLine: 1,
			errSub:  "hash_ids",
		},
		{
			name:    "fractional number",
			in:      `{"timestamp": 0.5, "input_length": 1, "output_length": 1, "hash_ids": []}`,
			errLine: 1,
			errSub:  "timestamp",
		},
		{
			name:    "wrong type",
			in:      `{"timestamp": 0, "input_length": "7", "output_length": 1, "hash_ids": []}`,
			errLine: 1,
			errSub:  "input_length",
		},
		{
			name:    "trailing data",
			in:      `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": []} {}`,
			errLine: 1,
			errSub:  "trailing data",
		},
		{
			name:    "array instead of object",
			in:      "\n\n[1, 2]\n",
			errLine: 3,
			errSub:  "trace: line 3:",
		},
		{
			name:    "line too long",
			in:      `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [` + strings.Repeat("1,", MaxLineBytes/2) + `1]}`,
			errLine: 1,
			errSub:  "longer than",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Read(strings.NewReader(tt.in))
			if tt.errLine == 0 {
				if err != nil {
					t.Fatalf("Read: %v", err)
				}
				if !reflect.DeepEqual(got, tt.want) {
					t.Fatalf("Read = %+v, want %+v", got, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Read = %+v, want an error", got)
			}
			var le *LineError
			if !errors.As(err, &le) || le.Line != tt.errLine {
				t.Fatalf("error %v: want a *LineError for line %d", err, tt.errLine)
			}
			if !errors.Is(err, ErrSyntax) {
				t.Errorf("error %v does not wrap ErrSyntax", err)
			}
			if !strings.Contains(err.Error(), tt.errSub) {
				t.Errorf("error %q does not contain %q", err, tt.errSub)
			}
		})
	}
}

func TestReaderStreamsAndSticksOnError(t *testing.T) {
	in := "{\"timestamp\": 3, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [9]}\nbad\n{\"timestamp\": 4, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [9]}\n"
	r := NewReader(strings.NewReader(in))
	req, err := r.Next()
	if err != nil || req.Timestamp != 3 || r.Line() != 1 {
		t.Fatalf("first Next = %+v, %v (line %d)", req, err, r.Line())
	}
	_, err1 := r.Next()
	_, err2 := r.Next()
	if err1 == nil || err1 != err2 {
		t.Fatalf("errors after a bad line: %v then %v; want the same error twice", err1, err2)
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

func TestReadIOError(t *testing.T) {
	_, err := Read(failingReader{})
	if !errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrSyntax) {
		t.Fatalf("Read over a failing reader = %v; want io.ErrUnexpectedEOF, not ErrSyntax", err)
	}
}
