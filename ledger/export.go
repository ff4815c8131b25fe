package ledger

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"
)

// Export formats.
const (
	FormatCSV   = "csv"
	FormatJSONL = "jsonl"
)

// csvHeader is the first line of a CSV export, one column per Entry field.
var csvHeader = []string{"seq", "id", "kind", "tenant", "key_hash", "job_id", "epoch", "attempt", "model", "backend",
	"input_tokens", "output_tokens", "estimated", "completed", "cost_micros", "currency", "refers", "reason", "time",
	"fence", "prev_hash", "hash"}

// maxExportLine bounds one JSONL line of an export.
const maxExportLine = 1 << 20

// ExportWriter writes entries one at a time in an export format.
type ExportWriter struct {
	format string
	w      *bufio.Writer
	cw     *csv.Writer
	row    []string
}

// NewExportWriter starts an export (a CSV export begins with its header).
func NewExportWriter(w io.Writer, format string) (*ExportWriter, error) {
	ew := &ExportWriter{format: format, w: bufio.NewWriterSize(w, 64<<10)}
	switch format {
	case FormatCSV:
		ew.cw = csv.NewWriter(ew.w)
		ew.row = make([]string, len(csvHeader))
		if err := ew.cw.Write(csvHeader); err != nil {
			return nil, fmt.Errorf("ledger: export: %w", err)
		}
	case FormatJSONL:
	default:
		return nil, fmt.Errorf("ledger: export: %w: format %q (csv or jsonl)", ErrInvalid, format)
	}
	return ew, nil
}

// Write adds one entry.
func (ew *ExportWriter) Write(e Entry) error {
	e.Time = e.Time.UTC()
	if ew.format == FormatJSONL {
		b, err := json.Marshal(&e)
		if err != nil {
			return fmt.Errorf("ledger: export %s: %w", e.ID, err)
		}
		b = append(b, '\n')
		if _, err := ew.w.Write(b); err != nil {
			return fmt.Errorf("ledger: export: %w", err)
		}
		return nil
	}
	r := ew.row
	r[0] = strconv.FormatUint(e.Seq, 10)
	r[1], r[2], r[3], r[4], r[5] = e.ID, e.Kind, e.Tenant, e.KeyHash, e.JobID
	r[6], r[7] = strconv.Itoa(e.Epoch), strconv.Itoa(e.Attempt)
	r[8], r[9] = e.Model, e.Backend
	r[10], r[11] = strconv.Itoa(e.InputTokens), strconv.Itoa(e.OutputTokens)
	r[12], r[13] = strconv.FormatBool(e.Estimated), strconv.FormatBool(e.Completed)
	r[14], r[15], r[16], r[17] = strconv.FormatInt(e.CostMicros, 10), e.Currency, e.Refers, e.Reason
	r[18] = e.Time.Format(time.RFC3339Nano)
	r[19], r[20], r[21] = strconv.FormatUint(e.Fence, 10), e.PrevHash, e.Hash
	if err := ew.cw.Write(r); err != nil {
		return fmt.Errorf("ledger: export: %w", err)
	}
	return nil
}

// Flush writes out what is buffered; call it once at the end.
func (ew *ExportWriter) Flush() error {
	if ew.cw != nil {
		ew.cw.Flush()
		if err := ew.cw.Error(); err != nil {
			return fmt.Errorf("ledger: export: %w", err)
		}
	}
	if err := ew.w.Flush(); err != nil {
		return fmt.Errorf("ledger: export: %w", err)
	}
	return nil
}

// WriteExport writes es in format (FormatCSV or FormatJSONL), with hashes and sequences.
func WriteExport(w io.Writer, format string, es []Entry) error {
	ew, err := NewExportWriter(w, format)
	if err != nil {
		return err
	}
	for _, e := range es {
		if err := ew.Write(e); err != nil {
			return err
		}
	}
	return ew.Flush()
}

// ReadExport parses an export written by WriteExport (or `oncegate ledger export`). Anything
// that is not exactly an export — an unknown column or field, a bad number or time — is an
// ErrCorrupt naming the line.
func ReadExport(r io.Reader, format string) ([]Entry, error) {
	switch format {
	case FormatCSV:
		return readCSV(r)
	case FormatJSONL:
		return readJSONL(r)
	}
	return nil, fmt.Errorf("ledger: read export: %w: format %q (csv or jsonl)", ErrInvalid, format)
}

func readJSONL(r io.Reader) ([]Entry, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var out []Entry
	for line := 1; ; line++ {
		b, err := readLine(br)
		if errors.Is(err, io.EOF) && len(b) == 0 {
			return out, nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("ledger: read export line %d: %w", line, err)
		}
		b = bytes.TrimSpace(b)
		if len(b) == 0 {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		var e Entry
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("ledger: read export line %d: %w: %v", line, ErrCorrupt, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("ledger: read export line %d: %w: trailing data", line, ErrCorrupt)
		}
		e.Time = e.Time.UTC()
		out = append(out, e)
	}
}

// readLine reads one line (without its newline), refusing lines over maxExportLine.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, isPrefix, err := br.ReadLine()
		line = append(line, chunk...)
		if len(line) > maxExportLine {
			return nil, fmt.Errorf("%w: line longer than %d bytes", ErrCorrupt, maxExportLine)
		}
		if err != nil || !isPrefix {
			return line, err
		}
	}
}

func readCSV(r io.Reader) ([]Entry, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = len(csvHeader)
	cr.ReuseRecord = true
	head, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ledger: read export: %w: %v", ErrCorrupt, err)
	}
	if !slices.Equal(head, csvHeader) {
		return nil, fmt.Errorf("ledger: read export: %w: the header is not %v", ErrCorrupt, csvHeader)
	}
	var out []Entry
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil { // a *csv.ParseError names its line
			return nil, fmt.Errorf("ledger: read export: %w: %v", ErrCorrupt, err)
		}
		line, _ := cr.FieldPos(0)
		e, err := entryFromCSV(rec)
		if err != nil {
			return nil, fmt.Errorf("ledger: read export line %d: %w: %v", line, ErrCorrupt, err)
		}
		out = append(out, e)
	}
}

func entryFromCSV(r []string) (Entry, error) {
	var err error
	num := func(s, name string) int {
		n, perr := strconv.Atoi(s)
		if perr != nil && err == nil {
			err = fmt.Errorf("%s: %v", name, perr)
		}
		return n
	}
	unum := func(s, name string) uint64 {
		n, perr := strconv.ParseUint(s, 10, 64)
		if perr != nil && err == nil {
			err = fmt.Errorf("%s: %v", name, perr)
		}
		return n
	}
	boolean := func(s, name string) bool {
		b, perr := strconv.ParseBool(s)
		if perr != nil && err == nil {
			err = fmt.Errorf("%s: %v", name, perr)
		}
		return b
	}
	e := Entry{Seq: unum(r[0], "seq"), ID: r[1], Kind: r[2], Tenant: r[3], KeyHash: r[4], JobID: r[5],
		Epoch: num(r[6], "epoch"), Attempt: num(r[7], "attempt"), Model: r[8], Backend: r[9],
		InputTokens: num(r[10], "input_tokens"), OutputTokens: num(r[11], "output_tokens"),
		Estimated: boolean(r[12], "estimated"), Completed: boolean(r[13], "completed"),
		Currency: r[15], Refers: r[16], Reason: r[17], Fence: unum(r[19], "fence"), PrevHash: r[20], Hash: r[21]}
	cost, perr := strconv.ParseInt(r[14], 10, 64)
	if perr != nil && err == nil {
		err = fmt.Errorf("cost_micros: %v", perr)
	}
	e.CostMicros = cost
	t, perr := time.Parse(time.RFC3339Nano, r[18])
	if perr != nil && err == nil {
		err = fmt.Errorf("time: %v", perr)
	}
	e.Time = t.UTC()
	return e, err
}
