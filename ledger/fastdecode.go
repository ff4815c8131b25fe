package ledger

import (
	"bytes"
	"strconv"
	"unicode/utf8"
)

// fastDecode parses a stored entry written by encodeStored — exactly its field order, no
// whitespace, no escapes in strings, integers only — about ten times faster than
// encoding/json. Anything else (ok false) goes to encoding/json, which defines the result:
// FuzzFastDecode checks that both agree whenever the fast path answers.
func fastDecode(data []byte) (s stored, ok bool) {
	p := fastParser{b: data}
	c := &s.canonical
	ok = p.lit(`{"v":`) && p.int(&c.V) &&
		p.lit(`,"id":`) && p.str(&c.ID) &&
		p.lit(`,"kind":`) && p.str(&c.Kind) &&
		p.lit(`,"tenant":`) && p.str(&c.Tenant) &&
		p.lit(`,"key_hash":`) && p.str(&c.KeyHash) &&
		p.lit(`,"job_id":`) && p.str(&c.JobID) &&
		p.lit(`,"epoch":`) && p.int(&c.Epoch) &&
		p.lit(`,"attempt":`) && p.int(&c.Attempt) &&
		p.lit(`,"model":`) && p.str(&c.Model) &&
		p.lit(`,"backend":`) && p.str(&c.Backend) &&
		p.lit(`,"input_tokens":`) && p.int(&c.InputTokens) &&
		p.lit(`,"output_tokens":`) && p.int(&c.OutputTokens) &&
		p.lit(`,"estimated":`) && p.bool(&c.Estimated) &&
		p.lit(`,"completed":`) && p.bool(&c.Completed) &&
		p.lit(`,"cost_micros":`) && p.int64(&c.CostMicros) &&
		p.lit(`,"currency":`) && p.str(&c.Currency) &&
		p.lit(`,"refers":`) && p.str(&c.Refers) &&
		p.lit(`,"reason":`) && p.str(&c.Reason) &&
		p.lit(`,"time":`) && p.str(&c.Time) &&
		p.lit(`,"fence":`) && p.uint64(&c.Fence) &&
		p.lit(`,"prev_hash":`) && p.str(&c.PrevHash) &&
		p.lit(`,"hash":`) && p.str(&s.Hash) &&
		p.lit(`}`) && p.i == len(p.b)
	return s, ok
}

type fastParser struct {
	b []byte
	i int
}

func (p *fastParser) lit(s string) bool {
	if len(p.b)-p.i < len(s) || string(p.b[p.i:p.i+len(s)]) != s {
		return false
	}
	p.i += len(s)
	return true
}

func (p *fastParser) str(dst *string) bool {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return false
	}
	end := bytes.IndexByte(p.b[p.i+1:], '"')
	if end < 0 {
		return false
	}
	raw := p.b[p.i+1 : p.i+1+end]
	for _, c := range raw {
		if c == '\\' || c < 0x20 {
			return false // escapes and control characters: encoding/json decides
		}
	}
	if !utf8.Valid(raw) {
		return false // encoding/json replaces invalid UTF-8
	}
	*dst = string(raw)
	p.i += end + 2
	return true
}

// number returns the bytes of a JSON integer (no fraction, no exponent).
func (p *fastParser) number() ([]byte, bool) {
	j := p.i
	if j < len(p.b) && p.b[j] == '-' {
		j++
	}
	start := j
	for j < len(p.b) && p.b[j] >= '0' && p.b[j] <= '9' {
		j++
	}
	if j == start || (p.b[start] == '0' && j-start > 1) {
		return nil, false // no digits, or a leading zero JSON does not allow
	}
	if j < len(p.b) && (p.b[j] == '.' || p.b[j] == 'e' || p.b[j] == 'E') {
		return nil, false
	}
	n := p.b[p.i:j]
	p.i = j
	return n, true
}

func (p *fastParser) int(dst *int) bool {
	n, ok := p.number()
	if !ok {
		return false
	}
	v, err := strconv.ParseInt(string(n), 10, strconv.IntSize)
	*dst = int(v)
	return err == nil
}

func (p *fastParser) int64(dst *int64) bool {
	n, ok := p.number()
	if !ok {
		return false
	}
	v, err := strconv.ParseInt(string(n), 10, 64)
	*dst = v
	return err == nil
}

func (p *fastParser) uint64(dst *uint64) bool {
	n, ok := p.number()
	if !ok || n[0] == '-' {
		return false
	}
	v, err := strconv.ParseUint(string(n), 10, 64)
	*dst = v
	return err == nil
}

func (p *fastParser) bool(dst *bool) bool {
	switch {
	case p.lit("true"):
		*dst = true
	case p.lit("false"):
		*dst = false
	default:
		return false
	}
	return true
}
