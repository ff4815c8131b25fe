package jsonscan

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Canonical appends to dst the canonical form of the JSON object data — object keys sorted, no
// insignificant space, strings escaped as encoding/json escapes them, numbers in one spelling
// per value (canonNumber) — without the top-level members whose key leave reports. It also
// returns data's top-level members by decoded key (values alias data). It refuses what the
// scanner refuses (duplicate keys, invalid UTF-8, lone surrogates) and numbers beyond float64.
//
// Strings are copied as they are whenever encoding/json would write them unchanged (no
// escape, no '<', '>' or '&', no U+2028 or U+2029), which is nearly always; otherwise they go
// through encoding/json. FuzzCanonical checks the output against jsonref's, which is
// encoding/json's with the numbers rewritten.
func Canonical(dst, data []byte, leave func(key string) bool) ([]byte, map[string]json.RawMessage, error) {
	dst, _, top, err := canonical(dst, data, leave, 0)
	return dst, top, err
}

// CanonicalSum is the SHA-256 of Canonical's output for data (and data's top-level members as
// Canonical returns them), computed without a copy of data's long strings: a request's
// fingerprint used to hold a second copy of its prompt while it was taken (BENCHMARKS.md,
// memory per request, round 4).
func CanonicalSum(data []byte, leave func(key string) bool) ([sha256.Size]byte, map[string]json.RawMessage, error) {
	return canonicalSum(data, leave, spanMin)
}

// spanMin is the shortest string CanonicalSum hashes where it lies in the request instead of
// copying it: longer than any key or parameter, shorter than a prompt worth the bookkeeping.
const spanMin = 512

// canonCap is what CanonicalSum's output starts with: a whole body of most requests, and a
// small part of a body whose prompt stays where it is.
const canonCap = 8 << 10

// spanMark starts a reference to a span in canonical output (then its index, 4 bytes big
// endian): 0xFF is never a byte of canonical JSON, which is valid UTF-8.
const (
	spanMark    = 0xFF
	spanMarkLen = 5
)

// canonicalSum hashes canonical's output with every span written where its mark is.
func canonicalSum(data []byte, leave func(string) bool, minSpan int) (sum [sha256.Size]byte, top map[string]json.RawMessage, err error) {
	out, spans, top, err := canonical(make([]byte, 0, min(len(data), canonCap)), data, leave, minSpan)
	if err != nil {
		return sum, nil, err
	}
	h := sha256.New()
	for {
		i := bytes.IndexByte(out, spanMark)
		if i < 0 {
			h.Write(out)
			break
		}
		h.Write(out[:i])
		h.Write(spans[binary.BigEndian.Uint32(out[i+1:])])
		out = out[i+spanMarkLen:]
	}
	h.Sum(sum[:0])
	return sum, top, nil
}

// canonical is Canonical; minSpan > 0 writes the verbatim strings of at least minSpan bytes
// as marks (spanMark, then an index into spans).
func canonical(dst, data []byte, leave func(string) bool, minSpan int) ([]byte, [][]byte, map[string]json.RawMessage, error) {
	top := map[string]json.RawMessage{}
	var spans [][]byte
	err := scanTop(data, true, func(s *scanner) (err error) {
		s.spanMin = minSpan
		dst, err = s.canonObject(dst, 1, leave, top)
		spans = s.spans
		return err
	})
	if err != nil {
		return dst, nil, nil, err
	}
	return dst, spans, top, nil
}

// canonMember is one member of an object being written: its decoded key, and where its
// `"key":value,` is in dst.
type canonMember struct {
	key        string
	start, end int
}

// sortInPlaceMax is the most members an object is sorted with in dst by rotations (each
// moves at most the object's bytes); a larger one is sorted through one copy of itself, so
// many keys cannot make the sort quadratic.
const sortInPlaceMax = 16

// canonObject writes the object at s.pos in canonical form; top, when not nil, gets its raw
// members by key. The members are written into dst as they come, each followed by a comma,
// then the ones leave names are cut out and the rest put in key order where they are: a
// value is copied once however deep it sits (a prompt inside messages used to be copied once
// per enclosing object), and the last comma becomes the closing brace.
func (s *scanner) canonObject(dst []byte, depth int, leave func(string) bool, top map[string]json.RawMessage) ([]byte, error) {
	dst = append(dst, '{')
	open := len(dst)
	var members []canonMember
	err := s.eachMember(depth, func(keyTok []byte) error {
		key, start, at := decodeString(keyTok), s.pos, len(dst)
		dst = appendString(dst, key)
		dst = append(dst, ':')
		var err error
		if dst, err = s.canon(dst, depth); err != nil {
			return err
		}
		if top != nil {
			top[key] = s.data[start:s.pos]
		}
		dst = append(dst, ',')
		members = append(members, canonMember{key: key, start: at, end: len(dst)})
		return nil
	})
	if err != nil {
		return dst, err
	}
	if leave != nil {
		for i := len(members) - 1; i >= 0; i-- {
			if m := members[i]; leave(m.key) {
				dst = append(dst[:m.start], dst[m.end:]...)
				for j := i + 1; j < len(members); j++ {
					members[j].start -= m.end - m.start
					members[j].end -= m.end - m.start
				}
				members = slices.Delete(members, i, i+1)
			}
		}
	}
	if len(members) == 0 {
		return append(dst[:open], '}'), nil
	}
	sortMembers(dst, open, members)
	dst[len(dst)-1] = '}'
	return dst, nil
}

// sortMembers puts the members, written one after the other from dst[open:] to its end, in
// key order (keys are unique).
func sortMembers(dst []byte, open int, members []canonMember) {
	byKey := func(a, b canonMember) int { return strings.Compare(a.key, b.key) }
	if slices.IsSortedFunc(members, byKey) {
		return
	}
	if len(members) > sortInPlaceMax {
		region := slices.Clone(dst[open:])
		slices.SortFunc(members, byKey)
		at := open
		for _, m := range members {
			at += copy(dst[at:], region[m.start-open:m.end-open])
		}
		return
	}
	// Selection by rotation: the least key left moves to the front of what is left, and the
	// members it passes shift right by its length.
	for i := range members {
		j := i
		for k := i + 1; k < len(members); k++ {
			if members[k].key < members[j].key {
				j = k
			}
		}
		if j == i {
			continue
		}
		m, n := members[j], members[j].end-members[j].start
		rotateLeft(dst[members[i].start:m.end], m.start-members[i].start)
		for k := i; k < j; k++ {
			members[k].start += n
			members[k].end += n
		}
		m.start = members[i].start - n
		m.end = m.start + n
		copy(members[i+1:j+1], members[i:j])
		members[i] = m
	}
}

// rotateLeft turns b into b[k:] followed by b[:k], through a copy of the shorter part only.
func rotateLeft(b []byte, k int) {
	n := len(b)
	if k <= 0 || k >= n {
		return
	}
	if k <= n-k {
		head := slices.Clone(b[:k])
		copy(b, b[k:])
		copy(b[n-k:], head)
		return
	}
	tail := slices.Clone(b[k:])
	copy(b[n-k:], b[:k])
	copy(b, tail)
}

// canon writes the value at s.pos in canonical form.
func (s *scanner) canon(dst []byte, depth int) ([]byte, error) {
	if s.pos >= len(s.data) {
		return dst, s.fail("unexpected end of input")
	}
	start := s.pos
	switch s.data[s.pos] {
	case '{':
		return s.canonObject(dst, depth+1, nil, nil)
	case '[':
		dst = append(dst, '[')
		first := true
		err := s.eachElement(depth+1, func() (err error) {
			if !first {
				dst = append(dst, ',')
			}
			first = false
			dst, err = s.canon(dst, depth+1)
			return err
		})
		if err != nil {
			return dst, err
		}
		return append(dst, ']'), nil
	case '"':
		if err := s.str(); err != nil {
			return dst, err
		}
		tok := s.data[start:s.pos]
		if !s.escaped && s.spanMin > 0 && len(tok) >= s.spanMin && uint64(len(s.spans)) < math.MaxUint32 {
			dst = append(dst, spanMark)
			dst = binary.BigEndian.AppendUint32(dst, uint32(len(s.spans)))
			s.spans = append(s.spans, tok)
			return dst, nil
		}
		if !s.escaped {
			return append(dst, tok...), nil
		}
		return appendString(dst, decodeString(tok)), nil
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		if err := s.number(); err != nil {
			return dst, err
		}
		return s.canonNumber(dst, start)
	}
	if err := s.value(depth); err != nil { // a literal: written as it is
		return dst, err
	}
	return append(dst, s.data[start:s.pos]...), nil
}

// canonNumber writes the number token data[start:s.pos] in one spelling per value, so that
// 0.5, 0.50 and 5e-1 (or 1, 1.0 and 1e0) are one intent. An integer written without fraction
// or exponent stays as written ("-0" is "0"), exact at any size: a parser that keeps integers
// (Python's) reads a seed past 2^53 exactly, and rounding it would merge two requests. Any
// other number is the float64 it denotes (what every provider's parser reads): integer digits
// when it is a whole number below 2^53 in magnitude, else as encoding/json writes a float64
// (the shortest digits that read back to it). A number beyond float64's range is refused.
func (s *scanner) canonNumber(dst []byte, start int) ([]byte, error) {
	tok := s.data[start:s.pos]
	f, _ := strconv.ParseFloat(string(tok), 64) // the token was scanned: only a range error is left
	if math.IsInf(f, 0) {
		s.pos = start
		return dst, s.failAs(ErrNumberRange, "number out of range")
	}
	if bytes.IndexAny(tok, ".eE") < 0 {
		if string(tok) == "-0" {
			return append(dst, '0'), nil
		}
		return append(dst, tok...), nil
	}
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return strconv.AppendInt(dst, int64(f), 10), nil
	}
	return appendFloat(dst, f), nil
}

// appendFloat writes f as encoding/json writes a float64 (ES6 number formatting).
func appendFloat(dst []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	dst = strconv.AppendFloat(dst, f, format, -1, 64)
	if n := len(dst); format == 'e' && n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
		dst[n-2] = dst[n-1] // e-07 is written e-7
		dst = dst[:n-1]
	}
	return dst
}

// plain reports whether encoding/json writes the string whose (undecoded) content is b as b:
// no escape, no character it escapes for HTML, valid UTF-8 without U+2028 and U+2029.
func plain(b []byte) bool {
	high := false
	for _, c := range b {
		switch strClass[c] {
		case plainByte:
		case highByte:
			high = true
		default:
			return false
		}
	}
	return !high || plainUTF8(b)
}

// plainUTF8 reports whether encoding/json writes the non-ASCII bytes of b unchanged.
func plainUTF8(b []byte) bool {
	return utf8.Valid(b) && !bytes.Contains(b, []byte("\u2028")) && !bytes.Contains(b, []byte("\u2029"))
}

// decodeString decodes a valid string token.
func decodeString(tok []byte) string {
	if body := tok[1 : len(tok)-1]; bytes.IndexByte(body, '\\') < 0 && utf8.Valid(body) {
		return string(body)
	}
	var s string
	_ = json.Unmarshal(tok, &s) // cannot fail: the token was scanned
	return s
}

// appendString writes s as encoding/json does.
func appendString(dst []byte, s string) []byte {
	if plain([]byte(s)) {
		dst = append(dst, '"')
		dst = append(dst, s...)
		return append(dst, '"')
	}
	b, _ := json.Marshal(s) // a string always encodes
	return append(dst, b...)
}
